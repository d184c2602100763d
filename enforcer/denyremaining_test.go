package enforcer_test

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
)

// TestDenyCacheRemaining: a deny from the cache reports the remaining Redis
// would report for the same state, not 0: a cost larger than what remains
// leaves a remaining above 0 (1 073 741 823 here). A second limiter without
// a deny cache asks Redis at the same instants (a deny consumes nothing):
// a fixed window's figure is Redis's; a token bucket's, which refills, is
// Redis's or one below it (the fraction of a token is not known locally).
func TestDenyCacheRemaining(t *testing.T) {
	backends(t, func(t *testing.T, rdb redis.UniversalClient) {
		for _, c := range []struct{ name, rule string }{
			{"token bucket", "{id: r, match: [{key: user}], limit: 2147483648, period: 1000s}"},
			{"fixed window", "{id: r, algorithm: fixed_window, match: [{key: user}], limit: 2147483648, period: 1000s}"},
		} {
			t.Run(c.name, func(t *testing.T) {
				if err := rdb.FlushDB(t.Context()).Err(); err != nil {
					t.Fatal(err)
				}
				yaml := "domain: d\nrules: [" + c.rule + "]"
				cached := hotLimiter(t, rdb, yaml, enforcer.Options{HotKeys: enforcer.HotKeyOptions{Rate: -1}})
				plain := hotLimiter(t, rdb, yaml, enforcer.Options{HotKeys: enforcer.HotKeyOptions{Table: -1}})
				decide(t, cached, userReq(0, 1<<30+1, "u")) // 1 073 741 823 left
				const cost = 1<<30 - 1 + 1_000_000          // a million beyond: 466 ms of refill
				d := decide(t, cached, userReq(0, cost, "u"))
				if d.Outcome != decision.Denied || d.Path != decision.PathRedis || d.Remaining != 1<<30-1 {
					t.Fatalf("got %v on %v with %d remaining; want denied by Redis with 1073741823", d.Outcome, d.Path, d.Remaining)
				}
				for _, ms := range []int64{0, 1, 7, 100, 333} { // the bucket has the cost at 466 ms
					d := decide(t, cached, userReq(ms, cost, "u"))
					r := decide(t, plain, userReq(ms, cost, "u"))
					if d.Path != decision.PathDenyCache || r.Path != decision.PathRedis || d.Outcome != decision.Denied || r.Outcome != decision.Denied {
						t.Fatalf("at %d ms: %v on %v and %v on %v; want denied from the cache and by Redis", ms, d.Outcome, d.Path, r.Outcome, r.Path)
					}
					low := r.Remaining
					if c.name == "token bucket" {
						low--
					}
					if d.Remaining > r.Remaining || d.Remaining < low || d.Statuses[0].Remaining != d.Remaining {
						t.Errorf("at %d ms the cache says %d remaining (status %d), Redis %d", ms, d.Remaining, d.Statuses[0].Remaining, r.Remaining)
					}
				}
			})
		}
	})
}
