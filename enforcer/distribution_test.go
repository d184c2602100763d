package enforcer_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

var (
	propRounds = flag.Int("propagation.rounds", 20, "pushes measured by TestPropagation over pub/sub")
	pollRounds = flag.Int("propagation.pollrounds", 4, "pushes measured by TestPropagation with the poll only")
)

// perUser is a rule file: limit requests per minute per user, domain d.
func perUser(limit int) []byte {
	return fmt.Appendf(nil, "domain: d\nrules:\n  - id: per-user\n    match: [{key: user}]\n    limit: %d\n    period: 1m\n", limit)
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// watch runs a watcher on rdb that applies with apply until the test ends,
// and returns it with its reports unless o has an OnReload of its own (the
// test must read them: the watcher waits for room).
func watch(t *testing.T, rdb redis.UniversalClient, o store.WatchOptions, apply func(*rules.Set)) (*store.Watcher, chan store.Reload) {
	t.Helper()
	ch := make(chan store.Reload, 64)
	o.Redis, o.Apply = rdb, apply
	if o.OnReload == nil {
		o.OnReload = func(r store.Reload) { ch <- r }
	}
	if o.Logger == nil {
		o.Logger = quiet
	}
	w, err := store.NewWatcher(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return w, ch
}

func next(t *testing.T, ch chan store.Reload) store.Reload {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no reload within 10 s")
		return store.Reload{}
	}
}

// subscribed waits until n clients subscribe to the notification channel.
func subscribed(t *testing.T, rdb redis.UniversalClient, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		m, err := rdb.PubSubNumSub(context.Background(), store.RuleSetChannel).Result()
		if err == nil && m[store.RuleSetChannel] >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d watchers subscribed within 10 s (%v)", m[store.RuleSetChannel], n, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// rawWrite stores a rule set without Push's checks, as a buggy or old
// pusher would, and notifies the watchers.
func rawWrite(t *testing.T, rdb redis.UniversalClient, version int64, yaml []byte) {
	t.Helper()
	ctx := context.Background()
	if err := rdb.HSet(ctx, store.RuleSetKey, "version", version, "yaml", yaml, "sha", store.SHA(yaml), "by", "raw").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Publish(ctx, store.RuleSetChannel, version).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestBadPushesKeepTheSet: a malformed set written straight into Redis, an
// older version, the same version with other content and the same version
// twice each leave the enforcer's set as it was: same version, and a user
// over the old limit still denied. Each is counted once.
func TestBadPushesKeepTheSet(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.NewSetStore(rdb)
	lim, err := enforcer.New(rdb, rules.NewSet("", 0, nil), enforcer.Options{Budget: time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	_, ch := watch(t, rdb, store.WatchOptions{Registerer: reg, Poll: time.Hour}, lim.SetRules)
	subscribed(t, rdb, 1)

	for _, limit := range []int{100, 1} { // v1, then v2: 1 a minute per user
		if _, err := st.Push(ctx, "rules.yaml", perUser(limit), 0); err != nil {
			t.Fatal(err)
		}
		if r := next(t, ch); r.Result != store.Applied {
			t.Fatalf("push of limit %d: %+v", limit, r)
		}
	}
	req := &enforcer.Request{Domain: "d"}
	req.Descriptors[rules.KeyUser] = "u"
	if d, err := lim.Check(ctx, req); err != nil || d.Outcome != decision.Allowed {
		t.Fatalf("first request under version 2: %+v %v", d, err)
	}
	stillInForce := func(what string) {
		t.Helper()
		if v := lim.Rules().Version; v != 2 {
			t.Errorf("%s: version %d in force, want 2", what, v)
		}
		if d, err := lim.Check(ctx, req); err != nil || d.Outcome != decision.Denied {
			t.Errorf("%s: a request over version 2's limit: %v, %v; want denied", what, d.Outcome, err)
		}
	}
	stillInForce("before")

	// The same version twice: Push refuses it; written raw with other
	// content, it is a conflict; with the same content, a duplicate.
	if _, err := st.Push(ctx, "rules.yaml", perUser(100), 2); !errors.Is(err, store.ErrStaleVersion) {
		t.Errorf("push of version 2 again: %v, want ErrStaleVersion", err)
	}
	rawWrite(t, rdb, 2, perUser(100))
	if r := next(t, ch); r.Result != store.Conflict {
		t.Errorf("version 2 again with other content, written raw: %+v", r)
	}
	stillInForce("same version, other content")
	rawWrite(t, rdb, 2, perUser(1))
	if r := next(t, ch); r.Result != store.Duplicate {
		t.Errorf("version 2 again with its own content, written raw: %+v", r)
	}
	stillInForce("same version twice")

	// An older version: Push refuses it; written raw, it is stale.
	if _, err := st.Push(ctx, "rules.yaml", perUser(100), 1); !errors.Is(err, store.ErrStaleVersion) {
		t.Errorf("push of version 1: %v, want ErrStaleVersion", err)
	}
	rawWrite(t, rdb, 1, perUser(100))
	if r := next(t, ch); r.Result != store.Stale {
		t.Errorf("version 1 written raw: %+v", r)
	}
	stillInForce("older version")

	// A malformed set that bypassed Push's validation.
	rawWrite(t, rdb, 3, []byte("domain: d\nrules:\n  - id: per-user\n    limit: [\n"))
	if r := next(t, ch); r.Result != store.Invalid || r.Err == nil {
		t.Errorf("malformed version 3: %+v", r)
	}
	stillInForce("malformed")

	for result, want := range map[string]float64{"applied": 2, "invalid": 1, "stale": 1, "duplicate": 1, "conflict": 1, "error": 0} {
		if got := counter(t, reg, "sluice_rules_reloads_total", "redis", result); got != want {
			t.Errorf("sluice_rules_reloads_total{result=%q} = %v, want %v", result, got, want)
		}
	}

	// The store goes on: the next push (version 4) is applied.
	if e, err := st.Push(ctx, "rules.yaml", perUser(100), 0); err != nil || e.Version != 4 {
		t.Fatalf("push after the bad ones: %+v %v", e, err)
	}
	if r := next(t, ch); r.Result != store.Applied || lim.Rules().Version != 4 {
		t.Fatalf("version 4: %+v", r)
	}
	req.Descriptors[rules.KeyUser] = "v" // u's bucket is empty, and refills at version 4's rate
	if d, err := lim.Check(ctx, req); err != nil || d.Outcome != decision.Allowed || d.Limit != 100 {
		t.Errorf("under version 4's limit: %+v %v", d, err)
	}
}

func counter(t *testing.T, reg *prometheus.Registry, name, source, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["source"] == source && l["result"] == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no %s{source=%q,result=%q}", name, source, result)
	return 0
}

// TestPropagation measures, for 5 enforcers each with its own Redis
// connection and watcher, the time from a push to the last of them
// applying it: through pub/sub (at most 2 s is the requirement), and
// through the poll alone (the backstop for a lost message). Run with -v to
// see the figures (docs/benchmarks.md).
func TestPropagation(t *testing.T) {
	const enforcers = 5
	addr := redistest.Addr(t)
	client := func() *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		return c
	}
	pusher := client()
	st := store.NewSetStore(pusher)
	run := func(t *testing.T, o store.WatchOptions, rounds int) []time.Duration {
		type applied struct {
			i       int
			version int64
			at      time.Time
		}
		ch := make(chan applied, enforcers*rounds)
		lims := make([]*enforcer.Limiter, enforcers)
		for i := range lims {
			rdb := client()
			lim, err := enforcer.New(rdb, rules.NewSet("", 0, nil), enforcer.Options{Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			lims[i] = lim
			watch(t, rdb, o, func(s *rules.Set) {
				lim.SetRules(s)
				ch <- applied{i, s.Version, time.Now()}
			})
		}
		if !o.NoSubscribe {
			subscribed(t, pusher, enforcers)
		}
		var lags []time.Duration
		for i := range rounds {
			if o.NoSubscribe {
				// Push at a random phase of the enforcers' polls, as a
				// push in production does (not right after a poll, where
				// the previous round ends).
				time.Sleep(rand.N(time.Second))
			}
			start := time.Now()
			e, err := st.Push(context.Background(), "rules.yaml", perUser(10+i), 0) // new content: the same is not pushed again
			if err != nil {
				t.Fatal(err)
			}
			var last time.Time
			for got := 0; got < enforcers; {
				select {
				case a := <-ch:
					if a.version < e.Version && i == 0 {
						// The set stored before this run (the previous
						// subtest's), which a new watcher's first poll
						// applies: on a loaded machine that poll can come
						// just before the first push.
						continue
					}
					if a.version != e.Version {
						t.Fatalf("enforcer %d applied version %d, want %d", a.i, a.version, e.Version)
					}
					got++
					last = a.at
				case <-time.After(10 * time.Second):
					t.Fatalf("version %d not applied by every enforcer within 10 s", e.Version)
				}
			}
			for i, l := range lims {
				if v := l.Rules().Version; v != e.Version {
					t.Fatalf("enforcer %d: version %d in force, want %d", i, v, e.Version)
				}
			}
			lags = append(lags, last.Sub(start))
		}
		slices.Sort(lags)
		t.Logf("push to the last of %d enforcers, %d pushes: median %v, max %v", enforcers, rounds,
			lags[len(lags)/2].Round(10*time.Microsecond), lags[len(lags)-1].Round(10*time.Microsecond))
		return lags
	}
	t.Run("pubsub", func(t *testing.T) {
		// The poll is long: every push must come through pub/sub.
		lags := run(t, store.WatchOptions{Poll: time.Hour, OnReload: func(store.Reload) {}}, *propRounds)
		if worst := lags[len(lags)-1]; worst > 2*time.Second {
			t.Errorf("push to every enforcer took up to %v, want at most 2 s", worst)
		}
	})
	t.Run("poll-only", func(t *testing.T) {
		if testing.Short() {
			t.Skip("waits for 1 s polls")
		}
		run(t, store.WatchOptions{NoSubscribe: true, OnReload: func(store.Reload) {}}, *pollRounds)
	})
}
