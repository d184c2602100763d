package enforcer_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

// TestZeroShareAdmitsNothing: a global rule whose fresh share for a key is
// 0 in this region (the aggregator's --share-default-split may write 0)
// admits nothing for that key, where scale's floor of 1 used to admit one
// per period; it says why (ReasonNoShare, Sluice-Reason: no_share, the
// record's blocked path and denying rule) and asks the client to wait until
// the next share can arrive (ShareRefresh). Other keys keep their share; a
// shadow rule would deny; a stale share of 0 gives the static split back.
func TestZeroShareAdmitsNothing(t *testing.T) {
	backends(t, func(t *testing.T, rdb redis.UniversalClient) {
		for _, mode := range []string{"enforce", "shadow"} {
			t.Run(mode, func(t *testing.T) {
				rdb.FlushAll(context.Background())
				set := mustSet(t, `
domain: t
rules: [{id: g, match: [{key: user}], limit: 10, period: 1s, global: true, mode: `+mode+`}]`)
				var recs []decision.Record
				l, err := enforcer.New(rdb, set, enforcer.Options{Budget: time.Second, Regions: 2, ShareTTL: 30 * time.Second,
					ShareRefresh: 3 * time.Second,
					Sink:         sinkFunc(func(r decision.Record) { recs = append(recs, r) })})
				if err != nil {
					t.Fatal(err)
				}
				tag := rules.EntityTag(set.Rule("g"), &rules.Descriptors{rules.KeyUser: "zero"})
				err = store.NewStore(rdb).PutShares(context.Background(), []rules.Share{
					{RuleID: "g", Key: tag, Region: "local", Fraction: 0, Version: 1, ComputedAt: at(0)},
				})
				if err != nil {
					t.Fatal(err)
				}
				if err := l.Refresh(context.Background(), at(0)); err != nil {
					t.Fatal(err)
				}
				check := func(ms int64, user string) enforcer.Decision {
					t.Helper()
					req := &enforcer.Request{Now: at(ms)}
					req.Descriptors[rules.KeyUser] = user
					d, err := l.Check(context.Background(), req)
					if err != nil || d.Err != nil {
						t.Fatal(err, d.Err)
					}
					return d
				}
				for i := range 5 {
					d := check(int64(i)*1000, "zero") // one per period, each in a new second
					if mode == "shadow" {
						if d.Outcome != decision.ShadowDenied || d.Shadow == nil || d.Shadow.ID != "g" {
							t.Errorf("shadow, call %d: %v (shadow %v), want shadow_denied by g", i, d.Outcome, d.Shadow)
						}
						continue
					}
					if d.Outcome != decision.Denied || d.Reason != decision.ReasonNoShare || d.Rule == nil || d.Rule.ID != "g" {
						t.Fatalf("call %d under a share of 0: %v %v %v, want denied, no_share, by g", i, d.Outcome, d.Reason, d.Rule)
					}
					if d.RetryAfter != 3*time.Second || d.Wait != 3*time.Second {
						t.Errorf("call %d: retry after %v wait %v, want 3 s (ShareRefresh)", i, d.RetryAfter, d.Wait)
					}
					h := http.Header{}
					d.WriteHeaders(h, enforcer.AllHeaders)
					if h.Get("Retry-After") != "3" || h.Get("Sluice-Reason") != "no_share" || h.Get("X-RateLimit-Remaining") != "0" || h.Get("X-RateLimit-Limit") != "0" {
						t.Errorf("call %d: headers %v", i, h)
					}
				}
				if len(recs) != 5 {
					t.Fatalf("%d records, want 5", len(recs))
				}
				for _, r := range recs {
					want := decision.Denied
					if mode == "shadow" {
						want = decision.ShadowDenied
					}
					if r.Outcome != want || r.Path != decision.PathNoShare || (mode == "enforce" && r.DenyingRule != "g") || (mode == "shadow" && r.ShadowRule != "g") {
						t.Errorf("record %+v: want %v on the blocked path by g", r, want)
					}
				}
				// Another key keeps the static split: 5 of 10 in each of 2 regions.
				if d := check(5000, "other"); d.Outcome != decision.Allowed || d.Limit != 5 {
					t.Errorf("another key: %v limit %d, want allowed under 5", d.Outcome, d.Limit)
				}
				// A stale share of 0 is ignored: the static split again.
				if d := check(31000, "zero"); d.Outcome != decision.Allowed || d.Limit != 5 {
					t.Errorf("stale share of 0: %v limit %d, want allowed under the static 5", d.Outcome, d.Limit)
				}
			})
		}
	})
}

// A shadow rule that blocks (limit 0) reports the denial it would have
// made even when it is the only rule matched.
func TestShadowBlockAlone(t *testing.T) {
	l := newLimiter(t, redistest.Server(t), "domain: d\nrules: [{id: b, match: [{key: user}], limit: 0, period: 1s, mode: shadow}]")
	req := &enforcer.Request{}
	req.Descriptors[rules.KeyUser] = "u"
	d, err := l.Check(context.Background(), req)
	if err != nil || d.Outcome != decision.ShadowDenied || d.Shadow == nil || d.Path != decision.PathBlocked {
		t.Errorf("%v %v shadow %v path %v, want shadow_denied on the blocked path", err, d.Outcome, d.Shadow, d.Path)
	}
}
