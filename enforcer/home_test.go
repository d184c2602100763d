package enforcer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// twoRegions returns limiters in regions "a" and "b", each over its own
// redis-server, each given the other's as a home region, with the rules in
// yaml; and the two servers' clients.
func twoRegions(t *testing.T, yaml string, o enforcer.Options) (la, lb *enforcer.Limiter, ra, rb *redis.Client) {
	t.Helper()
	ra, rb = redistest.Server(t), redistest.Server(t)
	oa, ob := o, o
	oa.Region, oa.Homes = "a", map[string]redis.UniversalClient{"b": rb}
	ob.Region, ob.Homes = "b", map[string]redis.UniversalClient{"a": ra}
	var err error
	if la, err = enforcer.New(ra, mustSet(t, yaml), oa); err != nil {
		t.Fatal(err)
	}
	if lb, err = enforcer.New(rb, mustSet(t, yaml), ob); err != nil {
		t.Fatal(err)
	}
	return la, lb, ra, rb
}

// keysHomedIn returns n API keys whose entity for rule r has its home in
// region home, of regions.
func keysHomedIn(t testing.TB, r *rules.Rule, home string, regions []string, n int) []string {
	t.Helper()
	var keys []string
	for i := 0; len(keys) < n; i++ {
		var d rules.Descriptors
		d[rules.KeyAPIKey] = fmt.Sprintf("key-%d", i)
		h, err := rules.HomeRegion(rules.EntityTag(r, &d), regions)
		if err != nil {
			t.Fatal(err)
		}
		if h == home {
			keys = append(keys, d[rules.KeyAPIKey])
		}
	}
	return keys
}

// pinnedKey is the Redis key of rule r's token bucket for api key k.
func pinnedKey(r *rules.Rule, k string) string {
	var d rules.Descriptors
	d[rules.KeyAPIKey] = k
	return "sl:{" + rules.EntityTag(r, &d) + "}:" + r.ID + ":0"
}

const pinnedRules = `
domain: p
rules:
  - {id: paid, match: [{key: api_key}], limit: 10, period: 1h, global: true, pinned: true}
  - {id: per-ip, match: [{key: client_ip}], limit: 1000, period: 1h}
`

// TestPinnedKeyIsCountedOnceGlobally sends a key whose home is region b
// through both regions' limiters: its one counter, in b's Redis, takes
// every request wherever it arrives, so the two regions together allow
// exactly the limit; a's Redis holds no state for it, while its per-IP rule
// (not pinned) is counted in the region the request arrived in.
func TestPinnedKeyIsCountedOnceGlobally(t *testing.T) {
	la, lb, ra, rb := twoRegions(t, pinnedRules, enforcer.Options{Budget: time.Second})
	paid := la.Rules().Rule("paid")
	ctx := context.Background()
	allowedIn := map[string]int64{}
	for _, home := range []string{"a", "b"} {
		k := keysHomedIn(t, paid, home, []string{"a", "b"}, 1)[0]
		allowed := 0
		for i := range 14 {
			l, region := la, "a"
			if i%3 == 0 {
				l, region = lb, "b"
			}
			req := &enforcer.Request{Now: at(int64(i))}
			req.Descriptors[rules.KeyAPIKey], req.Descriptors[rules.KeyClientIP] = k, "192.0.2.1"
			d, err := l.Check(ctx, req)
			if err != nil || d.Err != nil {
				t.Fatal(err, d.Err)
			}
			if d.Outcome == decision.Allowed {
				allowed++
				allowedIn[region]++
				if want := int64(10 - allowed); d.Statuses[0].Remaining != want {
					t.Errorf("home %s, request %d: paid remaining %d, want %d (one count for both regions)", home, i, d.Statuses[0].Remaining, want)
				}
			} else if d.Rule == nil || d.Rule.ID != "paid" || d.Reason != decision.ReasonOverLimit {
				t.Errorf("home %s, request %d: %v by %v (%v), want denied by paid", home, i, d.Outcome, d.Rule, d.Reason)
			}
		}
		if allowed != 10 {
			t.Errorf("home %s: %d allowed across the two regions, want exactly the limit, 10", home, allowed)
		}
		there, elsewhere := rb, ra
		if home == "a" {
			there, elsewhere = ra, rb
		}
		if n := elsewhere.Exists(ctx, pinnedKey(paid, k)).Val(); n != 0 {
			t.Errorf("home %s: the other region's Redis holds the pinned counter", home)
		}
		if got := stateField(t, there, pinnedKey(paid, k), 0) / time.Hour.Milliseconds(); got != 0 {
			t.Errorf("home %s: the home Redis's bucket holds %d whole tokens, want 0", home, got)
		}
	}
	// The per-IP rule stays regional: each region's bucket gave exactly the
	// requests that region allowed (the requests the pinned rule denied in
	// the home region had their per-IP token refunded).
	ip := la.Rules().Rule("per-ip")
	var d rules.Descriptors
	d[rules.KeyClientIP] = "192.0.2.1"
	key := "sl:{" + rules.EntityTag(ip, &d) + "}:per-ip:0"
	for name, c := range map[string]struct {
		rdb     *redis.Client
		allowed int64
	}{"a": {ra, allowedIn["a"]}, "b": {rb, allowedIn["b"]}} {
		if got := stateField(t, c.rdb, key, 0) / time.Hour.Milliseconds(); got != 1000-c.allowed {
			t.Errorf("region %s: per-ip bucket holds %d tokens, want %d (1000 less the %d it allowed)", name, got, 1000-c.allowed, c.allowed)
		}
	}
}

// TestPinnedRuleHoldsExactlyItsLimit sends 8 keys' requests from 8
// goroutines in each of two regions at once, with a per-IP rule in each
// region that denies some of them (so that home regions must refund what
// they took), then drains each key from alternating regions until the
// pinned rule denies: every key was allowed exactly its limit, and its
// bucket in its home region is empty, whatever region its requests came
// through.
func TestPinnedRuleHoldsExactlyItsLimit(t *testing.T) {
	const limit = 20
	la, lb, ra, rb := twoRegions(t, `
domain: p
rules:
  - {id: paid, match: [{key: api_key}], limit: 20, period: 1h, global: true, pinned: true}
  - {id: per-ip, match: [{key: client_ip}], limit: 3, period: 1h}
`, enforcer.Options{Budget: time.Second, RefundBudget: time.Second})
	// RefundBudget as long as the budget: at the default 50 ms a refund
	// to the other region's Redis timed out under make test's load
	// (-race, every package at once), which by design gives the token
	// back only when the bucket refills (here in an hour), and landed
	// after the drain, leaving one token in the bucket.
	paid := la.Rules().Rule("paid")
	keys := append(keysHomedIn(t, paid, "a", []string{"a", "b"}, 4), keysHomedIn(t, paid, "b", []string{"a", "b"}, 4)...)
	ctx := context.Background()
	now := at(0)
	var mu sync.Mutex
	allowed := map[string]int{}
	check := func(l *enforcer.Limiter, key, ip string) enforcer.Decision {
		req := &enforcer.Request{Now: now}
		req.Descriptors[rules.KeyAPIKey], req.Descriptors[rules.KeyClientIP] = key, ip
		d, err := l.Check(ctx, req)
		if err != nil || d.Err != nil {
			t.Error(err, d.Err)
		}
		if d.Outcome == decision.Allowed {
			mu.Lock()
			allowed[key]++
			mu.Unlock()
		}
		return d
	}
	var wg sync.WaitGroup
	for g := range 16 {
		l := la
		if g%2 == 1 {
			l = lb
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				// 10 IPs per goroutine, each 4 requests: the per-IP rule
				// denies the 4th in this region.
				check(l, keys[(g+i)%len(keys)], fmt.Sprintf("198.51.%d.%d", g, i%10))
			}
		}()
	}
	wg.Wait()
	for ki, k := range keys {
		for i := 0; ; i++ {
			l := la
			if i%2 == 1 {
				l = lb
			}
			d := check(l, k, fmt.Sprintf("203.0.%d.%d", ki, i)) // a fresh IP: only the pinned rule can deny
			if d.Outcome != decision.Allowed {
				if d.Rule == nil || d.Rule.ID != "paid" {
					t.Fatalf("key %s: denied by %v, want paid", k, d.Rule)
				}
				break
			}
			if i > limit {
				t.Fatalf("key %s: still allowed after %d drain requests", k, i)
			}
		}
	}
	for i, k := range keys {
		if allowed[k] != limit {
			t.Errorf("key %s: %d allowed across both regions, want exactly %d", k, allowed[k], limit)
		}
		home := ra
		if i >= 4 {
			home = rb
		}
		if got := stateField(t, home, pinnedKey(paid, k), 0); got != 0 {
			t.Errorf("key %s: its home bucket holds %d units, want 0 (no token lost or minted by refunds)", k, got)
		}
	}
}

// TestPinnedHomeUnreachable checks what a pinned rule does when its home
// region's Redis does not answer: the rule's failure mode decides. Fail
// closed denies (and gives back what this region's Redis took for the
// other rules); fail open uses a local bucket of the rule's static split,
// limit ÷ regions × Headroom ÷ Instances.
func TestPinnedHomeUnreachable(t *testing.T) {
	ra := redistest.Server(t)
	down := redistest.NewProxy(t, redistest.Addr(t))
	down.Inject(redistest.Refuse, 0)
	rb := redis.NewClient(&redis.Options{Addr: down.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true, DialerRetries: 1})
	t.Cleanup(func() { rb.Close() })
	for _, mode := range []string{"closed", "open"} {
		t.Run(mode, func(t *testing.T) {
			ra.FlushAll(context.Background())
			l, err := enforcer.New(ra, mustSet(t, `
domain: p
rules:
  - {id: paid, match: [{key: api_key}], limit: 10, period: 1h, global: true, pinned: true, failure_mode: `+mode+`}
  - {id: per-ip, match: [{key: client_ip}], limit: 100, period: 1h}
`), enforcer.Options{Region: "a", Homes: map[string]redis.UniversalClient{"b": rb}, Budget: time.Second, HomeBudget: 200 * time.Millisecond, Breaker: enforcer.BreakerOptions{Failures: 1000}})
			if err != nil {
				t.Fatal(err)
			}
			k := keysHomedIn(t, l.Rules().Rule("paid"), "b", []string{"a", "b"}, 1)[0]
			var outcomes []decision.Outcome
			for i := range 8 {
				req := &enforcer.Request{Now: at(int64(i))}
				req.Descriptors[rules.KeyAPIKey], req.Descriptors[rules.KeyClientIP] = k, "192.0.2.9"
				d, err := l.Check(context.Background(), req)
				if err != nil {
					t.Fatal(err)
				}
				if d.Err == nil {
					t.Fatalf("request %d: no storage error with the home region down", i)
				}
				outcomes = append(outcomes, d.Outcome)
			}
			O, C := decision.DegradedOpen, decision.DegradedClosed
			want := []decision.Outcome{C, C, C, C, C, C, C, C}
			taken := int64(0)
			if mode == "open" {
				// 10 ÷ 2 regions × 1.2 = 6 from the local bucket.
				want, taken = []decision.Outcome{O, O, O, O, O, O, C, C}, 6
			}
			if fmt.Sprint(outcomes) != fmt.Sprint(want) {
				t.Errorf("outcomes %v, want %v", outcomes, want)
			}
			ip := l.Rules().Rule("per-ip")
			var d rules.Descriptors
			d[rules.KeyClientIP] = "192.0.2.9"
			key := "sl:{" + rules.EntityTag(ip, &d) + "}:per-ip:0"
			if got := stateField(t, ra, key, 0) / time.Hour.Milliseconds(); got != 100-taken {
				t.Errorf("the local per-ip bucket holds %d tokens, want %d: the denied requests' tokens refunded", got, 100-taken)
			}
		})
	}
}

// TestPinnedRulesNeverLease checks that a pinned rule's key, however hot,
// takes no lease: every allowed request is counted in its home's Redis when
// it is decided (a lease would serve tokens taken ahead of the home's
// count, and drop those it did not serve), whether its home is here or
// elsewhere.
func TestPinnedRulesNeverLease(t *testing.T) {
	la, _, _, _ := twoRegions(t, `
domain: p
rules:
  - {id: paid, match: [{key: api_key}], limit: 1000, period: 1h, global: true, pinned: true}
`, enforcer.Options{Budget: time.Second, HotKeys: enforcer.HotKeyOptions{Rate: 1, LeaseBlock: 50}})
	paid := la.Rules().Rule("paid")
	for _, home := range []string{"a", "b"} {
		k := keysHomedIn(t, paid, home, []string{"a", "b"}, 1)[0]
		for i := range 300 {
			req := &enforcer.Request{Now: at(int64(i))}
			req.Descriptors[rules.KeyAPIKey] = k
			d, err := la.Check(context.Background(), req)
			if err != nil || d.Err != nil {
				t.Fatal(err, d.Err)
			}
			if d.Outcome != decision.Allowed || d.Path != decision.PathRedis {
				t.Fatalf("home %s, request %d: %v on path %v, want allowed by Redis", home, i, d.Outcome, d.Path)
			}
			if want := int64(999 - i); d.Remaining != want {
				t.Fatalf("home %s, request %d: remaining %d, want %d (counted at once)", home, i, d.Remaining, want)
			}
		}
	}
}

// TestPinnedFromACluster runs region a on a 3-master Cluster, with a
// per-IP and a per-user rule (two slots) beside a pinned rule homed in b:
// the three calls (two slots, one home) commit together or not at all.
// b's pinned rule denies its 4th request: a's slots are refunded, so each
// of a's rules holds exactly what a allowed.
func TestPinnedFromACluster(t *testing.T) {
	cc := redistest.Cluster(t)
	rb := redistest.Server(t)
	l, err := enforcer.New(cc, mustSet(t, `
domain: p
rules:
  - {id: paid, match: [{key: api_key}], limit: 3, period: 1h, global: true, pinned: true}
  - {id: per-ip, match: [{key: client_ip}], limit: 100, period: 1h}
  - {id: per-user, match: [{key: user}], limit: 100, period: 1h}
`), enforcer.Options{Region: "a", Homes: map[string]redis.UniversalClient{"b": rb}, Budget: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	k := keysHomedIn(t, l.Rules().Rule("paid"), "b", []string{"a", "b"}, 1)[0]
	var outcomes []string
	for i := range 6 {
		req := &enforcer.Request{Now: at(int64(i))}
		req.Descriptors[rules.KeyAPIKey], req.Descriptors[rules.KeyClientIP], req.Descriptors[rules.KeyUser] = k, "192.0.2.5", "u"
		d, err := l.Check(context.Background(), req)
		if err != nil || d.Err != nil {
			t.Fatal(err, d.Err)
		}
		outcomes = append(outcomes, d.Outcome.String())
	}
	if fmt.Sprint(outcomes) != "[allowed allowed allowed denied denied denied]" {
		t.Errorf("outcomes %v", outcomes)
	}
	for _, r := range []struct{ id, key string }{{"per-ip", "192.0.2.5"}, {"per-user", "u"}} {
		rule := l.Rules().Rule(r.id)
		var d rules.Descriptors
		d[rule.Match[0].Key] = r.key
		if got := stateField(t, cc, "sl:{"+rules.EntityTag(rule, &d)+"}:"+r.id+":0", 0) / time.Hour.Milliseconds(); got != 97 {
			t.Errorf("%s: %d tokens left, want 97 (100 less the 3 allowed; the denied ones refunded)", r.id, got)
		}
	}
}

// TestPinnedToAClusterHome pins two rules (on the API key and on the user:
// two entities, so two slots) to region b, whose Redis is a 3-master
// Cluster, from region a on a single node: each slot's call goes to its
// master, the three calls commit together, and each pinned rule allows
// exactly its limit (the user rule's 5th request is denied, and the API-key
// rule's take refunded).
func TestPinnedToAClusterHome(t *testing.T) {
	ra := redistest.Server(t)
	cb := redistest.Cluster(t)
	set := mustSet(t, `
domain: p
rules:
  - {id: paid, match: [{key: api_key}], limit: 100, period: 1h, global: true, pinned: true}
  - {id: per-user, match: [{key: user}], limit: 4, period: 1h, global: true, pinned: true}
`)
	l, err := enforcer.New(ra, set, enforcer.Options{Region: "a", Homes: map[string]redis.UniversalClient{"b": cb}, Budget: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	k := keysHomedIn(t, set.Rule("paid"), "b", []string{"a", "b"}, 1)[0]
	var user string
	var d rules.Descriptors
	for i := 0; user == ""; i++ {
		d[rules.KeyUser] = fmt.Sprintf("u-%d", i)
		tag := rules.EntityTag(set.Rule("per-user"), &d)
		var kd rules.Descriptors
		kd[rules.KeyAPIKey] = k
		if h, _ := rules.HomeRegion(tag, []string{"a", "b"}); h == "b" &&
			enforcer.Slot(tag) != enforcer.Slot(rules.EntityTag(set.Rule("paid"), &kd)) {
			user = d[rules.KeyUser]
		}
	}
	trips := l.RoundTrips()
	var outcomes []string
	for i := range 6 {
		req := &enforcer.Request{Now: at(int64(i))}
		req.Descriptors[rules.KeyAPIKey], req.Descriptors[rules.KeyUser] = k, user
		dec, err := l.Check(context.Background(), req)
		if err != nil || dec.Err != nil {
			t.Fatal(err, dec.Err)
		}
		outcomes = append(outcomes, dec.Outcome.String())
	}
	if fmt.Sprint(outcomes) != "[allowed allowed allowed allowed denied denied]" {
		t.Errorf("outcomes %v", outcomes)
	}
	var kd rules.Descriptors
	kd[rules.KeyAPIKey] = k
	key := "sl:{" + rules.EntityTag(set.Rule("paid"), &kd) + "}:paid:0"
	if got := stateField(t, cb, key, 0) / time.Hour.Milliseconds(); got != 96 {
		t.Errorf("paid holds %d tokens in b's Cluster, want 96 (100 less the 4 allowed; the 2 denied refunded)", got)
	}
	if ra.DBSize(context.Background()).Val() != 0 {
		t.Error("region a's Redis holds pinned state")
	}
	if n := l.RoundTrips() - trips; n < 6*2 {
		t.Errorf("%d round trips for 6 checks, want at least 2 each (one per slot of b)", n)
	}
}
