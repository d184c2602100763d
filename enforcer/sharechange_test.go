package enforcer_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

// A share change scales a global rule's bucket without resetting it: the
// bucket's state (its key does not name the share) carries across, so tokens
// consumed before the change stay consumed, a larger share only refills
// faster from there, a smaller one clamps the bucket to its new capacity, and
// going back up mints nothing (for a sliding window, the window's count
// carries across and is held to the new limit). Against a real redis-server, for the token
// bucket and the sliding window.
func TestShareChangeMintsNoTokens(t *testing.T) {
	for _, alg := range []string{"token_bucket", "sliding_window"} {
		t.Run(alg, func(t *testing.T) {
			rdb := redistest.Server(t)
			set := mustSet(t, `
domain: t
rules: [{id: g, match: [{key: user}], limit: 100, period: 1m, algorithm: `+alg+`, global: true}]`)
			l, err := enforcer.New(rdb, set, enforcer.Options{Budget: time.Second, Regions: 4, Region: "eu"})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			setShare := func(f float64, ms int64) {
				t.Helper()
				err := store.NewStore(rdb).PutShares(ctx, []rules.Share{{RuleID: "g", Region: "eu", Fraction: f, Version: ms, ComputedAt: at(ms)}})
				if err != nil {
					t.Fatal(err)
				}
				if err := l.Refresh(ctx, at(ms)); err != nil {
					t.Fatal(err)
				}
			}
			// take spends requests at ms until one is denied and returns how
			// many were allowed, and the limit they were decided against.
			take := func(ms int64, most int) (allowed int, limit int64) {
				t.Helper()
				for range most {
					req := &enforcer.Request{Now: at(ms)}
					req.Descriptors[rules.KeyUser] = "u"
					d, err := l.Check(ctx, req)
					if err != nil || d.Err != nil {
						t.Fatal(err, d.Err)
					}
					limit = d.Limit
					if d.Outcome != decision.Allowed {
						return allowed, limit
					}
					allowed++
				}
				return allowed, limit
			}

			setShare(0.5, 0) // 50 a minute
			if n, lim := take(0, 30); n != 30 || lim != 50 {
				t.Fatalf("share 0.5: %d allowed of 30 against limit %d; want 30 against 50", n, lim)
			}
			setShare(0.8, 0) // 80 a minute, at the same instant
			// The token bucket keeps its 20 tokens (a larger capacity, not
			// more tokens); the sliding window keeps its count of 30, so 50
			// more reach the new limit of 80. Neither starts afresh (50 or
			// 80 more).
			want := map[string]int{"token_bucket": 20, "sliding_window": 50}[alg]
			if n, lim := take(0, 100); n != want || lim != 80 {
				t.Fatalf("share raised to 0.8: %d more allowed against limit %d; want %d", n, lim, want)
			}
			// The bucket is empty; lowering the share and raising it again,
			// still at the same instant, gives nothing back.
			setShare(0.1, 0)
			if n, _ := take(0, 100); n != 0 {
				t.Fatalf("share lowered to 0.1: %d allowed from an empty bucket", n)
			}
			setShare(0.8, 0)
			if n, _ := take(0, 100); n != 0 {
				t.Fatalf("share back to 0.8: %d allowed from an empty bucket", n)
			}
			// A stale share falls back to the static split (1/4): still
			// nothing at the same instant.
			if n, lim := take(31_000, 1); alg == "sliding_window" && (n != 0 || lim != 25) {
				t.Fatalf("stale share: %d allowed against %d; want 0 against the static 25", n, lim)
			} else if alg == "token_bucket" && lim != 25 {
				t.Fatalf("stale share: limit %d; want the static 25", lim)
			}
			if alg != "token_bucket" {
				return
			}
			// Token bucket: a full minute at share 0.8 refills 80, no more.
			setShare(0.8, 120_000)
			if n, _ := take(120_000, 200); n != 80 {
				t.Fatalf("a minute later at 0.8: %d allowed, want 80 (the new capacity)", n)
			}
			// Capacity lowered on a full bucket: clamped to the new one.
			setShare(0.5, 240_000)
			setShare(0.2, 240_000)
			if n, _ := take(240_000, 200); n != 20 {
				t.Fatalf("full bucket at 0.5 clamped to 0.2: %d allowed, want 20", n)
			}
		})
	}
}
