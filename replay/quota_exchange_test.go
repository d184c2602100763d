package replay_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/eventually"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/pipeline/gcounter"
	"github.com/sluice-rl/sluice/rules"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// quotaKafka starts an in-process broker with the quota topic.
func quotaKafka(t *testing.T) []string {
	t.Helper()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := gcounter.EnsureQuotaTopic(ctx, kc.ListenAddrs(), "", 3); err != nil {
		t.Fatal(err)
	}
	return kc.ListenAddrs()
}

// TestQuotaExchangeThroughKafka runs a daily G-Counter quota of 100 in
// three regions, each with its redis-server, limiter, publisher and
// applier, over one kfake cluster: after each region's publication, every
// region's Redis holds the three regions' counts; the region then admits
// only what is left of the global quota. A stale count published late (a
// redelivery, or an instance that read its region's count before others
// added to it) lowers nothing, and a record that does not decode is
// counted and skipped. A region whose Redis restarts empty gets every
// count back, its own included.
func TestQuotaExchangeThroughKafka(t *testing.T) {
	brokers := quotaKafka(t)
	now := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	set, err := rules.Parse("q.yaml", []byte(`
domain: q
rules:
  - {id: daily, match: [{key: api_key}], algorithm: fixed_window, calendar: day, limit: 100, global: true, g_counter: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	type region struct {
		rdb *redis.Client
		l   *enforcer.Limiter
		pub *gcounter.QuotaPublisher
		app *gcounter.QuotaApplier
	}
	names := []string{"a", "b", "c"}
	rs := map[string]*region{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, n := range names {
		rdb := redistest.Server(t)
		l, err := enforcer.New(rdb, set, enforcer.Options{Region: n, Regions: 3, Clock: clock, Budget: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		pub, err := gcounter.NewQuotaPublisher(gcounter.QuotaPublisherOptions{Brokers: brokers, Source: l})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pub.Close)
		app, err := gcounter.NewQuotaApplier(gcounter.QuotaApplierOptions{Brokers: brokers, Region: n, Redis: rdb, Merge: enforcer.MergeQuotaCounts, Now: clock})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(app.Close)
		go app.Run(ctx)
		rs[n] = &region{rdb, l, pub, app}
	}
	check := func(n string) enforcer.Decision {
		var req enforcer.Request
		req.Descriptors[rules.KeyAPIKey] = "k-1"
		d, err := rs[n].l.Check(context.Background(), &req)
		if err != nil || d.Err != nil {
			t.Fatal(err, d.Err)
		}
		return d
	}
	sent := map[string]int64{"a": 40, "b": 30, "c": 20}
	for _, n := range names {
		for range sent[n] {
			if d := check(n); d.Outcome != decision.Allowed {
				t.Fatalf("region %s: %v", n, d.Outcome)
			}
		}
		if err := rs[n].pub.Publish(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var desc rules.Descriptors
	desc[rules.KeyAPIKey] = "k-1"
	win := decision.QuotaCount{Rule: "daily", Tag: rules.EntityTag(set.Rule("daily"), &desc),
		Window: time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC), End: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}
	field := func(n, of string) int64 {
		v, err := rs[n].rdb.HGet(context.Background(), enforcer.QuotaKey(&win), of).Result()
		if err != nil {
			return -1
		}
		c, _ := strconv.ParseInt(v, 10, 64)
		return c
	}
	for _, n := range names {
		eventually.True(t, "region "+n+" holds every region's count", func() bool {
			return field(n, "a") == 40 && field(n, "b") == 30 && field(n, "c") == 20
		})
	}
	// A stale count of b's, and a record that does not decode.
	stale := win
	stale.Region, stale.Count = "b", 5
	k, v, err := gcounter.EncodeQuotaRecord(&stale)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(gcounter.DefaultQuotaTopic))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if err := raw.ProduceSync(ctx, &kgo.Record{Key: k, Value: v}, &kgo.Record{Key: []byte("gc/x"), Value: []byte("{")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "c"} {
		eventually.True(t, "region "+n+" reads the stale and the bad record", func() bool { return rs[n].app.Stats().Bad == 1 && rs[n].app.Stats().Read >= 5 })
		if got := field(n, "b"); got != 30 {
			t.Errorf("region %s: b's count %d after a stale count of 5, want 30", n, got)
		}
	}
	// 10 left of the global 100: region a admits them, then denies.
	for i := range 10 {
		if d := check("a"); d.Outcome != decision.Allowed {
			t.Fatalf("region a, request %d of the last 10: %v", i, d.Outcome)
		}
	}
	if d := check("a"); d.Outcome != decision.Denied {
		t.Errorf("region a at the global quota: %v, want denied", d.Outcome)
	}

	// Region b's Redis restarts empty: its applier reads the topic again
	// and restores every region's count, b's own included.
	if err := rs["b"].rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, "region b's counts restored after its Redis lost them", func() bool {
		return field("b", "a") == 40 && field("b", "b") == 30 && field("b", "c") == 20
	})
}
