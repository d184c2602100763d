package replay_test

import (
	"io"
	"net"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/sluice-rl/sluice/replay"
)

// slowProxy forwards loopback TCP to addr, holding every nth answer from
// the server back for delay: a Redis on a machine so busy that a few of
// its answers come a second late.
func slowProxy(t *testing.T, addr string, n int64, delay time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var reads atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			go func() { _, _ = io.Copy(s, c); s.Close() }()
			go func() {
				buf := make([]byte, 64<<10)
				for {
					k, err := s.Read(buf)
					if k > 0 {
						if reads.Add(1)%n == 0 {
							time.Sleep(delay)
						}
						if _, werr := c.Write(buf[:k]); werr != nil {
							break
						}
					}
					if err != nil {
						break
					}
				}
				c.Close()
			}()
		}
	}()
	return ln.Addr().String()
}

// A replay's decisions and rules depend on event time alone: with a Redis
// some of whose answers come 1.2 s late (past the 1 s budget the replay's
// enforcers had, which degraded those decisions: TestReplayGeneratedScenario
// failed so on a busy machine), the generated scenario gives the same
// outcomes and rules as with a prompt one.
func TestReplaySlowRedisSameResults(t *testing.T) {
	run := func(addr string) *replay.Report {
		ctx, cancel := hangGuard(t)
		defer cancel()
		rep, err := replay.Run(ctx, replay.Options{RedisAddr: addr}, replay.Generate(replay.Scenario{Duration: time.Minute, Clients: 50}))
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	m := miniredis.RunT(t)
	a := run(m.Addr())
	b := run(slowProxy(t, m.Addr(), 400, 1200*time.Millisecond))
	if !reflect.DeepEqual(a.Outcomes, b.Outcomes) || !reflect.DeepEqual(a.DynamicRules, b.DynamicRules) {
		t.Errorf("with a slow Redis: outcomes %v, %d rules; with a prompt one: %v, %d rules; problems %v", b.Outcomes, len(b.DynamicRules), a.Outcomes, len(a.DynamicRules), b.Problems)
	}
}
