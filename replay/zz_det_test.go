package replay_test

import (
	"fmt"
	"reflect"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

func TestZZDeterminism(t *testing.T) {
	base := runGenerated(t, nil)
	a := summary{base.Outcomes, base.DynamicRules, base.ShareLog, base.DeniedKeys("per-api-key")}
	for i, procs := range []int{2, 2} {
		old := runtime.GOMAXPROCS(procs)
		var stop atomic.Bool
		for range 4 {
			go func() {
				x := 0
				for !stop.Load() {
					x++
					if x%1000 == 0 {
						runtime.Gosched()
					}
				}
			}()
		}
		start := time.Now()
		again := runGenerated(t, nil)
		stop.Store(true)
		t.Logf("run %d GOMAXPROCS %d hogs %d took %v", i, procs, i%3*2, time.Since(start))
		runtime.GOMAXPROCS(old)
		b := summary{again.Outcomes, again.DynamicRules, again.ShareLog, again.DeniedKeys("per-api-key")}
		if !reflect.DeepEqual(a, b) {
			t.Errorf("run %d (GOMAXPROCS %d) differs", i, procs)
			if !reflect.DeepEqual(a.Outcomes, b.Outcomes) {
				t.Logf("outcomes %v vs %v", a.Outcomes, b.Outcomes)
			}
			if !reflect.DeepEqual(a.Rules, b.Rules) {
				t.Logf("rules %d vs %d", len(a.Rules), len(b.Rules))
				for j := range min(len(a.Rules), len(b.Rules)) {
					if !reflect.DeepEqual(a.Rules[j], b.Rules[j]) {
						t.Logf("first diff at %d:\n%s\n%s", j, fmt.Sprintf("%+v", a.Rules[j]), fmt.Sprintf("%+v", b.Rules[j]))
						break
					}
				}
			}
			if !reflect.DeepEqual(a.Shares, b.Shares) {
				t.Logf("shares differ")
			}
		}
	}
}
