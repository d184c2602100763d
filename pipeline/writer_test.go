package pipeline

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

// A region whose dynamic-rule cap is reached refuses the rules past it:
// RegionWriter counts that and returns no error, since retrying cannot help
// (and would hold the merge tier), and the rules under the cap are written.
func TestRegionWriterCapIsNotRetried(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(t)})
	defer rdb.Close()
	ctx := context.Background()
	if err := rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	st := store.NewStore(rdb, store.DynamicCap(2), store.StoreClock(func() time.Time { return now }))
	w := NewRegionWriter(map[string]*store.Store{"eu": st})
	var rs []rules.Rule
	for i := range 3 {
		rs = append(rs, rules.Rule{ID: fmt.Sprintf("dyn-%d", i), Match: []rules.Match{{Key: rules.KeyClientIP, Value: fmt.Sprintf("192.0.2.%d", i)}},
			Limit: 1, Period: time.Second, Burst: 1, Mode: rules.Shadow, Origin: "test", Reason: "test", ExpiresAt: now.Add(time.Hour)})
	}
	if err := w.Write(ctx, stage.Output{Rules: rs}); err != nil {
		t.Fatalf("Write: %v, want the cap counted, not an error", err)
	}
	if w.Refused() != 1 {
		t.Fatalf("refused %d writes, want 1", w.Refused())
	}
	got, err := st.Dynamic(ctx)
	if err != nil || len(got) != 2 {
		t.Fatalf("%d dynamic rules (%v), want the 2 under the cap", len(got), err)
	}
}
