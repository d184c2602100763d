package pipeline

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluice-rl/sluice/internal/eventually"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

// The applier tests check rules' expiries against this clock, so that
// every region stores the same Created time.
var applyNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// outputKafka starts an in-process broker with the output topic.
func outputKafka(t *testing.T) []string {
	t.Helper()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := EnsureOutputTopic(ctx, kc.ListenAddrs(), ""); err != nil {
		t.Fatal(err)
	}
	return kc.ListenAddrs()
}

func dynRule(id, ip string) rules.Rule {
	return rules.Rule{ID: id, Match: []rules.Match{{Key: rules.KeyClientIP, Value: ip}}, Limit: 10, Period: time.Minute,
		Mode: rules.Shadow, Origin: "detector/test", Reason: "test", ExpiresAt: applyNow.Add(time.Hour), Version: applyNow.UnixMilli()}
}

func share(rule, key, region string, f float64) rules.Share {
	return rules.Share{RuleID: rule, Key: key, Region: region, Fraction: f, Version: applyNow.UnixMilli(), ComputedAt: applyNow}
}

// twoRegions is one window's output: two rules, and a global rule's shares
// for eu and us.
func twoRegions() stage.Output {
	tag := strings.Repeat("a", rules.EntityTagLen)
	return stage.Output{
		Rules: []rules.Rule{dynRule("hh-1", "198.51.100.7"), dynRule("hh-2", "198.51.100.8")},
		Shares: []rules.Share{share("global", "", "eu", 0.6), share("global", "", "us", 0.4),
			share("global", tag, "eu", 0.25), share("global", tag, "us", 0.75)},
	}
}

func publish(t *testing.T, brokers []string, o stage.Output) {
	t.Helper()
	w, err := NewTopicWriter(TopicWriterOptions{Brokers: brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.Write(ctx, o); err != nil {
		t.Fatal(err)
	}
}

// runApplier runs an applier until the test ends (or stop is called).
func runApplier(t *testing.T, o ApplierOptions) (a *Applier, stop func()) {
	t.Helper()
	if o.Now == nil {
		o.Now = func() time.Time { return applyNow }
	}
	o.RetryMax = 50 * time.Millisecond
	a, err := NewApplier(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	var once atomic.Bool
	stop = func() {
		if once.CompareAndSwap(false, true) {
			cancel()
			a.Close()
			<-done
		}
	}
	t.Cleanup(stop)
	return a, stop
}

// hashes returns the region's dynamic-rule and share hashes.
func hashes(t *testing.T, rdb *redis.Client) (dyn, shares map[string]string) {
	t.Helper()
	ctx := context.Background()
	dyn, err := rdb.HGetAll(ctx, store.DynamicRulesKey).Result()
	if err != nil {
		t.Fatal(err)
	}
	shares, err = rdb.HGetAll(ctx, store.SharesKey).Result()
	if err != nil {
		t.Fatal(err)
	}
	return dyn, shares
}

// Output written through a TopicWriter reaches two regions through their
// appliers, each with every rule and only its own shares, and the Redis
// state is the RegionWriter's, byte for byte.
func TestTopicWriterReachesEveryRegion(t *testing.T) {
	brokers := outputKafka(t)
	eu, us := redistest.Server(t), redistest.Server(t)
	ae, _ := runApplier(t, ApplierOptions{Brokers: brokers, Region: "eu", Store: store.NewStore(eu)})
	au, _ := runApplier(t, ApplierOptions{Brokers: brokers, Region: "us", Store: store.NewStore(us)})
	out := twoRegions()
	publish(t, brokers, out)
	for _, a := range []*Applier{ae, au} {
		eventually.True(t, "two rules and two shares applied", func() bool {
			s := a.Stats()
			return s.RulesApplied == 2 && s.SharesApplied == 2 && s.SharesOtherRegion == 2
		})
	}

	// The same output written straight to two more regions.
	refEU, refUS := redistest.Server(t), redistest.Server(t)
	clock := store.StoreClock(func() time.Time { return applyNow })
	rw := NewRegionWriter(map[string]*store.Store{"eu": store.NewStore(refEU, clock), "us": store.NewStore(refUS, clock)})
	if err := rw.Write(context.Background(), out); err != nil {
		t.Fatal(err)
	}
	for region, pair := range map[string][2]*redis.Client{"eu": {eu, refEU}, "us": {us, refUS}} {
		dyn, sh := hashes(t, pair[0])
		wantDyn, wantSh := hashes(t, pair[1])
		if !maps.Equal(dyn, wantDyn) || !maps.Equal(sh, wantSh) {
			t.Errorf("%s: applied\n%v\n%v\nwant, as RegionWriter writes,\n%v\n%v", region, dyn, sh, wantDyn, wantSh)
		}
		for f, v := range sh {
			if !strings.Contains(v, `"region":"`+region+`"`) {
				t.Errorf("%s holds another region's share %s: %s", region, f, v)
			}
		}
		if len(dyn) != 2 || len(sh) != 2 {
			t.Errorf("%s: %d rules and %d shares, want 2 and 2", region, len(dyn), len(sh))
		}
	}
}

// A dead region's Redis holds back its own applier only; when it comes
// back, its applier catches up.
func TestDeadRegionHoldsBackOnlyItself(t *testing.T) {
	brokers := outputKafka(t)
	proxy := redistest.NewProxy(t, redistest.Addr(t))
	proxy.Inject(redistest.Refuse, 0)
	dead := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond})
	defer dead.Close()
	live := redistest.Server(t)
	ae, _ := runApplier(t, ApplierOptions{Brokers: brokers, Region: "eu", Store: store.NewStore(dead)})
	au, _ := runApplier(t, ApplierOptions{Brokers: brokers, Region: "us", Store: store.NewStore(live)})
	publish(t, brokers, twoRegions())
	eventually.True(t, "us applies while eu's Redis is down", func() bool {
		s := au.Stats()
		return s.RulesApplied == 2 && s.SharesApplied == 2
	})
	eventually.True(t, "eu retries", func() bool { return ae.Stats().ShareFailures+ae.Stats().RuleFailures >= 2 })
	if s := ae.Stats(); s.RulesApplied != 0 || s.SharesApplied != 0 {
		t.Fatalf("eu applied with its Redis down: %+v", s)
	}
	proxy.Inject(redistest.Pass, 0)
	eventually.True(t, "eu catches up once its Redis is back", func() bool {
		s := ae.Stats()
		return s.RulesApplied == 2 && s.SharesApplied == 2
	})
	if dyn, sh := hashes(t, dead); len(dyn) != 2 || len(sh) != 2 {
		t.Fatalf("eu holds %d rules and %d shares, want 2 and 2", len(dyn), len(sh))
	}
}

// While a region's kill switch is on, its applier skips rules and counts
// them, and still writes shares; the other region is not affected. A
// region's cap refuses rules beyond it, counted; expired rules are counted
// and skipped.
func TestApplierKillSwitchCapAndExpiry(t *testing.T) {
	brokers := outputKafka(t)
	eu, us, ap := redistest.Server(t), redistest.Server(t), redistest.Server(t)
	euStore := store.NewStore(eu)
	if err := euStore.SetKill(context.Background(), true, "operator/alice: false positives"); err != nil {
		t.Fatal(err)
	}
	ae, _ := runApplier(t, ApplierOptions{Brokers: brokers, Region: "eu", Store: euStore})
	au, _ := runApplier(t, ApplierOptions{Brokers: brokers, Region: "us", Store: store.NewStore(us)})
	aa, _ := runApplier(t, ApplierOptions{Brokers: brokers, Region: "ap", Store: store.NewStore(ap, store.DynamicCap(1))})
	out := twoRegions()
	old := dynRule("hh-old", "198.51.100.9")
	old.ExpiresAt = applyNow
	out.Rules = append(out.Rules, old)
	publish(t, brokers, out)
	eventually.True(t, "eu skips the rules as killed", func() bool {
		s := ae.Stats()
		return s.RulesKilled == 2 && s.RulesExpired == 1 && s.SharesApplied == 2
	})
	eventually.True(t, "us applies the rules", func() bool { s := au.Stats(); return s.RulesApplied == 2 && s.RulesExpired == 1 })
	eventually.True(t, "ap's cap refuses one", func() bool { s := aa.Stats(); return s.RulesApplied == 1 && s.RulesRefused == 1 })
	if s := ae.Stats(); s.RulesApplied != 0 {
		t.Fatalf("eu applied rules with the kill switch on: %+v", s)
	}
	if dyn, sh := hashes(t, eu); len(dyn) != 0 || len(sh) != 2 {
		t.Fatalf("eu holds %d rules and %d shares, want 0 and 2", len(dyn), len(sh))
	}
}

// Records that do not decode are counted and skipped; the records around
// them are applied.
func TestApplierSkipsBadRecords(t *testing.T) {
	brokers := outputKafka(t)
	eu := redistest.Server(t)
	ae, _ := runApplier(t, ApplierOptions{Brokers: brokers, Region: "eu", Store: store.NewStore(eu)})
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(DefaultOutputTopic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	good := dynRule("hh-1", "198.51.100.7")
	k, v, err := encodeRule(&good)
	if err != nil {
		t.Fatal(err)
	}
	bad := []*kgo.Record{
		{Key: []byte("rule/x"), Value: []byte("not json")},
		{Key: []byte("rule/x"), Value: []byte(`{"format":3,"kind":"rule","rule":{"ID":"x"}}`)},
		{Key: []byte("rule/other"), Value: v}, // the key does not match
		{Key: []byte("rule/x")},               // a tombstone
	}
	if err := cl.ProduceSync(context.Background(), append(bad, &kgo.Record{Key: k, Value: v})...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, "the bad records counted, the good one applied", func() bool {
		s := ae.Stats()
		return s.Bad == int64(len(bad)) && s.RulesApplied == 1
	})
}

// crashStore lets the real store write, then fails the write and calls
// crash: the applier stops after Redis took the records and before it
// commits them, as a process killed there would.
type crashStore struct {
	*store.Store
	crash func()
}

func (c *crashStore) PutDynamic(ctx context.Context, now time.Time, rs []rules.Rule) (int, error) {
	if _, err := c.Store.PutDynamic(ctx, now, rs); err != nil {
		return 0, err
	}
	c.crash()
	return 0, errors.New("crashed")
}

// An applier restarted after a crash between applying and committing reads
// the records again and applies them again, to the same state.
func TestApplierRestartReappliesIdempotently(t *testing.T) {
	brokers := outputKafka(t)
	eu, ref := redistest.Server(t), redistest.Server(t)
	publish(t, brokers, twoRegions())
	var crashed = make(chan struct{})
	var once atomic.Bool
	cs := &crashStore{Store: store.NewStore(eu), crash: func() {
		if once.CompareAndSwap(false, true) {
			close(crashed)
		}
	}}
	a1, stop1 := runApplier(t, ApplierOptions{Brokers: brokers, Region: "eu", Store: cs})
	<-crashed
	stop1()
	if s := a1.Stats(); s.RulesApplied != 0 {
		t.Fatalf("the crashed applier counted rules applied: %+v", s)
	}
	first, _ := hashes(t, eu)
	if len(first) != 2 {
		t.Fatalf("Redis holds %d rules after the crash, want 2", len(first))
	}

	// More output while it is down, then a restart in the same group.
	more := stage.Output{Rules: []rules.Rule{dynRule("hh-3", "198.51.100.10")}, Shares: []rules.Share{share("global", "", "eu", 0.5)}}
	publish(t, brokers, more)
	a2, _ := runApplier(t, ApplierOptions{Brokers: brokers, Region: "eu", Store: store.NewStore(eu)})
	eventually.True(t, "the restarted applier applies everything again", func() bool {
		s := a2.Stats()
		return s.RulesApplied == 3 && s.SharesApplied == 3
	})
	// A region that applied it once, without a crash.
	aref, _ := runApplier(t, ApplierOptions{Brokers: brokers, Region: "eu", Group: "reference", Store: store.NewStore(ref)})
	eventually.True(t, "the reference applies everything", func() bool { return aref.Stats().RulesApplied == 3 })
	dyn, sh := hashes(t, eu)
	wantDyn, wantSh := hashes(t, ref)
	if !maps.Equal(dyn, wantDyn) || !maps.Equal(sh, wantSh) {
		t.Fatalf("after the crash and restart:\n%v\n%v\nwant, as applied once:\n%v\n%v", dyn, sh, wantDyn, wantSh)
	}
	if !strings.Contains(sh["global|"], `"f":0.5`) {
		t.Fatalf("the newest share did not win: %s", sh["global|"])
	}
}

func TestApplierOptions(t *testing.T) {
	st := store.NewStore(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}))
	for name, tc := range map[string]struct {
		o    ApplierOptions
		want string
	}{
		"no brokers": {ApplierOptions{Region: "eu", Store: st}, "no Kafka brokers"},
		"no region":  {ApplierOptions{Brokers: []string{"x:1"}, Store: st}, `region ""`},
		"bad region": {ApplierOptions{Brokers: []string{"x:1"}, Region: "eu/west", Store: st}, `region "eu/west"`},
		"no store":   {ApplierOptions{Brokers: []string{"x:1"}, Region: "eu"}, "needs its rule store"},
	} {
		if _, err := NewApplier(tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}

func TestOutputRecordRoundTrip(t *testing.T) {
	out := twoRegions()
	for i := range out.Rules {
		k, v, err := encodeRule(&out.Rules[i])
		if err != nil {
			t.Fatal(err)
		}
		r, err := DecodeOutputRecord(k, v)
		if err != nil {
			t.Fatal(err)
		}
		if r.Kind != KindRule || r.Rule.ID != out.Rules[i].ID || !r.Rule.ExpiresAt.Equal(out.Rules[i].ExpiresAt) || r.Version != out.Rules[i].Version {
			t.Errorf("rule %d: %+v", i, r.Rule)
		}
	}
	for i := range out.Shares {
		k, v, err := encodeShare(&out.Shares[i])
		if err != nil {
			t.Fatal(err)
		}
		wantKey := fmt.Sprintf("share/global/%s/%s", out.Shares[i].Key, out.Shares[i].Region)
		if string(k) != wantKey {
			t.Errorf("key %s, want %s", k, wantKey)
		}
		r, err := DecodeOutputRecord(k, v)
		if err != nil {
			t.Fatal(err)
		}
		got, want := *r.Share, out.Shares[i]
		if !got.ComputedAt.Equal(want.ComputedAt) {
			t.Errorf("share %d computed at %v, want %v", i, got.ComputedAt, want.ComputedAt)
		}
		got.ComputedAt, want.ComputedAt = time.Time{}, time.Time{}
		if got != want {
			t.Errorf("share %d: %+v, want %+v", i, r.Share, out.Shares[i])
		}
	}
}

func TestDecodeOutputRecordRejects(t *testing.T) {
	for name, tc := range map[string]struct{ key, value string }{
		"tombstone":      {"rule/x", ""},
		"not json":       {"rule/x", "{"},
		"format":         {"rule/x", `{"format":3,"kind":"rule","rule":{"ID":"x"}}`},
		"kind":           {"rule/x", `{"format":1,"kind":"hot","rule":{"ID":"x"}}`},
		"both":           {"rule/x", `{"format":1,"kind":"rule","rule":{"ID":"x"},"share":{"rule":"x","region":"eu"}}`},
		"key":            {"rule/y", `{"format":1,"kind":"rule","rule":{"ID":"x"}}`},
		"version":        {"rule/x", `{"format":1,"kind":"rule","version":5,"rule":{"ID":"x","Version":4}}`},
		"fraction":       {"share/g//eu", `{"format":1,"kind":"share","share":{"rule":"g","region":"eu","f":1.5}}`},
		"region":         {"share/g//e u", `{"format":1,"kind":"share","share":{"rule":"g","region":"e u","f":0.5}}`},
		"slash in key":   {"share/g/a/b/eu", `{"format":1,"kind":"share","share":{"rule":"g","key":"a/b","region":"eu","f":0.5}}`},
		"share key":      {"share/g//us", `{"format":1,"kind":"share","share":{"rule":"g","region":"eu","f":0.5}}`},
		"rule, no share": {"share/g//eu", `{"format":1,"kind":"share","rule":{"ID":"g"}}`},
	} {
		if _, err := DecodeOutputRecord([]byte(tc.key), []byte(tc.value)); !errors.Is(err, ErrBadOutputRecord) {
			t.Errorf("%s: %v, want ErrBadOutputRecord", name, err)
		}
	}
}

func FuzzDecodeOutputRecord(f *testing.F) {
	o := twoRegions()
	k, v, _ := encodeRule(&o.Rules[0])
	f.Add(k, v)
	k, v, _ = encodeShare(&o.Shares[2])
	f.Add(k, v)
	f.Add([]byte("rule/x"), []byte(`{"format":1}`))
	f.Fuzz(func(t *testing.T, key, value []byte) {
		r, err := DecodeOutputRecord(key, value)
		if err != nil {
			if !errors.Is(err, ErrBadOutputRecord) {
				t.Fatalf("error %v does not wrap ErrBadOutputRecord", err)
			}
			return
		}
		if r.Key() != string(key) {
			t.Fatalf("decoded %q under key %q", r.Key(), key)
		}
	})
}

// A region's Redis that restarts empty gets back every live rule and its
// shares: the applier finds its mark gone and reads the topic again.
func TestApplierRefillsARedisThatRestartedEmpty(t *testing.T) {
	brokers := outputKafka(t)
	eu := redistest.Server(t)
	runApplier(t, ApplierOptions{Brokers: brokers, Region: "eu", Store: store.NewStore(eu), MarkEvery: 50 * time.Millisecond})
	publish(t, brokers, twoRegions())
	var want map[string]string
	eventually.True(t, "two rules and two shares applied", func() bool {
		dyn, shares := hashes(t, eu)
		want = dyn
		return len(dyn) == 2 && len(shares) == 2
	})
	if err := eu.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, "the rules and shares applied again", func() bool {
		dyn, shares := hashes(t, eu)
		return len(dyn) == 2 && len(shares) == 2
	})
	if dyn, _ := hashes(t, eu); !maps.Equal(dyn, want) {
		t.Errorf("rules applied again differ:\n%v\n%v", dyn, want)
	}
}
