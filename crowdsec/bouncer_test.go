package crowdsec

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/syncbuf"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/crowdsectest"
	"github.com/sluice-rl/sluice/internal/eventually"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

// fixture is a Local API, a bouncer key, and a region store per name, each
// on its own redis-server.
type fixture struct {
	lapi   *crowdsectest.LAPI
	key    string
	stores map[string]*store.Store
	rdbs   map[string]*redis.Client
	reg    *prometheus.Registry
	log    *syncbuf.Buffer
	// wrap, if set, stands between the bouncer and the Local API.
	wrap func(DecisionSource) DecisionSource
}

func newFixture(t *testing.T, regions ...string) *fixture {
	f := &fixture{lapi: crowdsectest.New(t), stores: map[string]*store.Store{}, rdbs: map[string]*redis.Client{},
		reg: prometheus.NewRegistry(), log: &syncbuf.Buffer{}}
	f.key = f.lapi.AddBouncer("sluice-test")
	for _, r := range regions {
		f.rdbs[r] = redistest.Server(t)
		f.stores[r] = store.NewStore(f.rdbs[r], store.DynamicCap(100))
	}
	return f
}

// start runs a bouncer over the fixture's regions until the test ends.
func (f *fixture) start(t *testing.T, o Options) *Bouncer {
	t.Helper()
	cl, err := NewClient(ClientOptions{URL: f.lapi.URL(), APIKey: f.key, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	o.Source, o.Registerer = cl, f.reg
	if f.wrap != nil {
		o.Source = f.wrap(cl)
	}
	o.Logger = slog.New(slog.NewTextHandler(f.log, nil))
	if o.Interval == 0 {
		o.Interval = 100 * time.Millisecond
	}
	if o.FullPull == 0 {
		// Debian's Local API (v1.4.6) can leave a decision committed
		// during a pull out of every later delta; under load that made
		// TestBouncerControls miss one 1 time in 24.
		o.FullPull = time.Second
	}
	if o.Resync == 0 {
		o.Resync = 200 * time.Millisecond
	}
	if o.RetryMax == 0 {
		o.RetryMax = 500 * time.Millisecond
	}
	for _, name := range []string{"us-east", "eu-west"} {
		if st, ok := f.stores[name]; ok {
			o.Regions = append(o.Regions, Region{Name: name, Store: st})
		}
	}
	b, err := NewBouncer(o)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = b.Run(context.Background()) }()
	t.Cleanup(func() { b.Close(); b.Close(); <-done })
	return b
}

func (f *fixture) cscli(t *testing.T, args ...string) {
	t.Helper()
	if _, err := f.lapi.Cscli(args...); err != nil {
		t.Fatal(err)
	}
}

// rulesIn returns the bouncer's rules in a region, by the source they
// match ("client_ip 192.0.2.7/32", "asn 64500").
func (f *fixture) rulesIn(t *testing.T, region string) map[string]*rules.DynamicRule {
	t.Helper()
	ds, err := f.stores[region].Dynamic(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*rules.DynamicRule{}
	for _, d := range ds {
		if !strings.HasPrefix(d.Origin, Origin) || d.Expired(time.Now()) {
			continue
		}
		m := d.Match[0]
		k := m.KeyName() + " " + m.Value
		if len(m.CIDR) > 0 {
			k = m.KeyName() + " " + m.CIDR[0].String()
		}
		out[k] = d
	}
	return out
}

func keys(m map[string]*rules.DynamicRule) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return fmt.Sprint(len(ks), " ", ks)
}

// TestBouncer: against a real Local API, cscli's decisions become rules in
// both regions' Redis (ban: limit 0; captcha: the configured limit; AS on
// asn), a Country decision is counted and logged and makes none, two
// decisions on one source share a rule, deleted decisions delete their
// rules, and a Redis that lost them gets them again.
func TestBouncer(t *testing.T) {
	f := newFixture(t, "us-east", "eu-west")
	f.cscli(t, "decisions", "add", "--ip", "192.0.2.7", "--duration", "2m")
	f.cscli(t, "decisions", "add", "--range", "198.51.100.0/24", "--duration", "2m")
	f.cscli(t, "decisions", "add", "--ip", "2001:db8::5", "--type", "captcha", "--duration", "1h")
	f.cscli(t, "decisions", "add", "--scope", "AS", "--value", "64500", "--duration", "30m")
	f.cscli(t, "decisions", "add", "--scope", "Country", "--value", "FR", "--duration", "2m")
	f.start(t, Options{Mapping: Mapping{Limits: map[string]Limit{"captcha": {5, time.Minute}}}})

	want := "client_ip 192.0.2.7/32,client_ip 198.51.100.0/24,client_ip 2001:db8::/64,asn 64500"
	for _, region := range []string{"us-east", "eu-west"} {
		eventually.True(t, region+" holds the 4 rules", func() bool { return len(f.rulesIn(t, region)) == 4 })
		rs := f.rulesIn(t, region)
		for _, k := range strings.Split(want, ",") {
			if rs[k] == nil {
				t.Fatalf("%s: no rule for %s in %s", region, k, keys(rs))
			}
		}
		ban, captcha := rs["client_ip 192.0.2.7/32"], rs["client_ip 2001:db8::/64"]
		if ban.Limit != 0 || ban.Mode != rules.Enforce || ban.Origin != "crowdsec/cscli" || time.Until(ban.ExpiresAt) > 2*time.Minute || time.Until(ban.ExpiresAt) < time.Minute {
			t.Errorf("%s: the ban: %+v", region, ban.Rule)
		}
		if captcha.Limit != 5 || captcha.Period != time.Minute {
			t.Errorf("%s: the captcha: %s", region, captcha.Describe())
		}
	}
	if n := f.value(t, "sluice_crowdsec_decisions_refused_total", "reason", "scope"); n != 1 {
		t.Errorf("refused for scope: %v, want 1 (the Country decision)", n)
	}
	if !strings.Contains(f.log.String(), `scope=Country value=FR`) {
		t.Errorf("the Country decision is not logged:\n%s", f.log.String())
	}

	// A second ban on 192.0.2.7, longer: the same rule, expiring later.
	f.cscli(t, "decisions", "add", "--ip", "192.0.2.7", "--duration", "10m", "--reason", "second")
	eventually.True(t, "the second ban lengthens the rule", func() bool {
		r := f.rulesIn(t, "eu-west")["client_ip 192.0.2.7/32"]
		return r != nil && time.Until(r.ExpiresAt) > 5*time.Minute
	})
	if rs := f.rulesIn(t, "eu-west"); len(rs) != 4 {
		t.Errorf("after a second decision on one source: %s, want 4 rules", keys(rs))
	}

	// Deleting decisions deletes their rules (both bans on 192.0.2.7).
	f.cscli(t, "decisions", "delete", "--ip", "192.0.2.7")
	f.cscli(t, "decisions", "delete", "--range", "198.51.100.0/24")
	for _, region := range []string{"us-east", "eu-west"} {
		eventually.True(t, region+" drops the deleted decisions' rules", func() bool {
			if len(f.rulesIn(t, region)) == 2 {
				return true
			}
			t.Log(keys(f.rulesIn(t, region)))
			return false
		})
	}
	if n := f.value(t, "sluice_crowdsec_rules_deleted_total", "region", "us-east"); n != 2 {
		t.Errorf("rules deleted in us-east: %v, want 2", n)
	}

	// A Redis that lost its data (restarted empty) gets the rules again at
	// the next resync, with no new decision.
	if err := f.rdbs["us-east"].FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, "us-east gets its rules again", func() bool { return len(f.rulesIn(t, "us-east")) == 2 })
}

// value sums the series of metric name on the fixture's registry whose
// labels include the pairs given (none: every series).
func (f *fixture) value(t *testing.T, name string, pairs ...string) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.Metric {
			for i := 0; i+1 < len(pairs); i += 2 {
				found := false
				for _, lp := range m.Label {
					found = found || (lp.GetName() == pairs[i] && lp.GetValue() == pairs[i+1])
				}
				if !found {
					continue series
				}
			}
			v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return v
}

// TestBouncerControls: a region's kill switch holds back only that
// region's new rules, which follow once it is off; the bouncer's cap holds
// back decisions past it, bans first; shadow rules stay promoted when the
// bouncer rewrites them; a region whose Redis is down holds back only
// itself and catches up.
func TestBouncerControls(t *testing.T) {
	f := newFixture(t, "us-east", "eu-west")
	proxy := redistest.NewProxy(t, f.rdbs["us-east"].Options().Addr)
	east := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
	t.Cleanup(func() { east.Close() })
	f.stores["us-east"] = store.NewStore(east, store.DynamicCap(100))
	f.cscli(t, "decisions", "add", "--ip", "192.0.2.1", "--duration", "1h")
	f.cscli(t, "decisions", "add", "--ip", "192.0.2.2", "--duration", "1h", "--type", "captcha")
	f.cscli(t, "decisions", "add", "--ip", "192.0.2.3", "--duration", "1h")
	f.start(t, Options{Mapping: Mapping{Shadow: true}, MaxRules: 2})
	ctx := context.Background()

	// The cap: the two bans, not the captcha.
	for _, region := range []string{"us-east", "eu-west"} {
		eventually.True(t, region+" holds 2 rules", func() bool { return len(f.rulesIn(t, region)) == 2 })
		rs := f.rulesIn(t, region)
		if rs["client_ip 192.0.2.2/32"] != nil {
			t.Errorf("%s: the cap kept the captcha over a ban: %s", region, keys(rs))
		}
		if n := f.value(t, "sluice_crowdsec_rules_refused_total", "region", region); n != 1 {
			t.Errorf("%s: rules refused %v, want 1 (the captcha, once)", region, n)
		}
	}

	// Shadow, promoted by an operator: the promotion survives rewrites.
	id := f.rulesIn(t, "eu-west")["client_ip 192.0.2.1/32"].ID
	if f.rulesIn(t, "eu-west")["client_ip 192.0.2.1/32"].Mode != rules.Shadow {
		t.Fatal("Mapping.Shadow wrote an enforcing rule")
	}
	if _, err := f.stores["eu-west"].Promote(ctx, id); err != nil {
		t.Fatal(err)
	}
	f.cscli(t, "decisions", "add", "--ip", "192.0.2.1", "--duration", "3h") // a rewrite, with a later expiry
	eventually.True(t, "the rewrite of a promoted rule", func() bool {
		r := f.rulesIn(t, "eu-west")["client_ip 192.0.2.1/32"]
		return r != nil && time.Until(r.ExpiresAt) > 2*time.Hour
	})
	if r := f.rulesIn(t, "eu-west")["client_ip 192.0.2.1/32"]; r.Mode != rules.Enforce || !r.Promoted() {
		t.Errorf("after a rewrite the promotion is lost: %s promoted %v", r.Mode, r.Promoted())
	}
	if _, err := f.stores["eu-west"].RollbackRule(ctx, id); err != nil {
		t.Fatal(err)
	}

	// The kill switch in eu-west: a new decision reaches us-east only. (The
	// captcha takes the place 192.0.2.3 leaves: applied rules keep theirs.)
	f.cscli(t, "decisions", "delete", "--ip", "192.0.2.3")
	eventually.True(t, "the captcha takes the free place", func() bool {
		return f.rulesIn(t, "eu-west")["client_ip 192.0.2.2/32"] != nil && f.rulesIn(t, "us-east")["client_ip 192.0.2.2/32"] != nil
	})
	f.cscli(t, "decisions", "delete", "--ip", "192.0.2.2")
	if err := f.stores["eu-west"].SetKill(ctx, true, "test"); err != nil {
		t.Fatal(err)
	}
	f.cscli(t, "decisions", "add", "--range", "203.0.113.0/24", "--duration", "1h")
	eventually.True(t, "us-east gets the range", func() bool { return f.rulesIn(t, "us-east")["client_ip 203.0.113.0/24"] != nil })
	eventually.True(t, "eu-west counts it as killed", func() bool {
		return f.value(t, "sluice_crowdsec_rules_refused_total", "region", "eu-west") >= 2
	})
	if f.rulesIn(t, "eu-west")["client_ip 203.0.113.0/24"] != nil {
		t.Fatal("a rule was written while the region's kill switch was on")
	}
	if err := f.stores["eu-west"].SetKill(ctx, false, ""); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, "eu-west gets the range once the switch is off", func() bool {
		return f.rulesIn(t, "eu-west")["client_ip 203.0.113.0/24"] != nil
	})

	// us-east's Redis unreachable: eu-west goes on; us-east catches up.
	proxy.Inject(redistest.Refuse, 0)
	f.cscli(t, "decisions", "delete", "--range", "203.0.113.0/24")
	eventually.True(t, "eu-west drops the range while us-east is down", func() bool {
		return f.rulesIn(t, "eu-west")["client_ip 203.0.113.0/24"] == nil
	})
	eventually.True(t, "us-east's failures are counted", func() bool {
		return f.value(t, "sluice_crowdsec_region_errors_total", "region", "us-east") > 0
	})
	proxy.Inject(redistest.Pass, 0)
	eventually.True(t, "us-east catches up", func() bool { return f.rulesIn(t, "us-east")["client_ip 203.0.113.0/24"] == nil })
}

// TestBouncerLocalAPIDown: while the Local API is stopped, the rules stay,
// failures are counted and the stream's age grows; when it is back, the
// bouncer resumes with one startup pull and rewrites nothing: no rule is
// duplicated, and changes made meanwhile arrive. (The 60 s outage through
// sluice serve is cmd/sluice's TestCrowdSecBouncer.)
func TestBouncerLocalAPIDown(t *testing.T) {
	f := newFixture(t, "eu-west")
	f.cscli(t, "decisions", "add", "--ip", "192.0.2.7", "--duration", "1h")
	f.start(t, Options{})
	eventually.True(t, "the rule", func() bool { return len(f.rulesIn(t, "eu-west")) == 1 })
	before := f.rulesIn(t, "eu-west")["client_ip 192.0.2.7/32"]

	f.lapi.Stop()
	eventually.True(t, "failures counted", func() bool {
		return f.value(t, "sluice_crowdsec_stream_errors_total") >= 3
	})
	if rs := f.rulesIn(t, "eu-west"); len(rs) != 1 {
		t.Fatalf("while the Local API is down: %s", keys(rs))
	}
	if err := f.lapi.Start(); err != nil {
		t.Fatal(err)
	}
	f.cscli(t, "decisions", "add", "--ip", "192.0.2.8", "--duration", "1h")
	eventually.True(t, "the stream resumes", func() bool { return len(f.rulesIn(t, "eu-west")) == 2 })
	after := f.rulesIn(t, "eu-west")["client_ip 192.0.2.7/32"]
	if after.ID != before.ID || !after.ExpiresAt.Equal(before.ExpiresAt) {
		t.Errorf("the rule held through the outage was rewritten: %s %v, was %s %v", after.ID, after.ExpiresAt, before.ID, before.ExpiresAt)
	}
	if n := f.value(t, "sluice_crowdsec_rules_updated_total", "region", "eu-west"); n != 0 {
		t.Errorf("rules rewritten: %v, want 0", n)
	}
	if !strings.Contains(f.log.String(), "answers again") {
		t.Errorf("the resume is not logged:\n%s", f.log.String())
	}
}

// lossyStream loses the new decisions of the first answer of changes that
// has any once lose is set, as CrowdSec's Local API before v1.5 does with
// a decision committed while a pull's query runs (it records the bouncer's
// last pull after the query).
type lossyStream struct {
	DecisionSource
	lose atomic.Bool
	lost atomic.Int64 // decisions lost
}

func (l *lossyStream) Stream(ctx context.Context, q StreamQuery) (*Stream, error) {
	s, err := l.DecisionSource.Stream(ctx, q)
	if err == nil && !q.Startup && len(s.New) > 0 && l.lose.CompareAndSwap(true, false) {
		l.lost.Add(int64(len(s.New)))
		s.New = nil
	}
	return s, err
}

// TestFullPullRepairsAMissedDecision: a decision an answer of changes
// lost arrives with the next full pull, within FullPull, and the full
// pulls rewrite none of the rules already written.
func TestFullPullRepairsAMissedDecision(t *testing.T) {
	f := newFixture(t, "eu-west")
	lossy := &lossyStream{}
	f.wrap = func(s DecisionSource) DecisionSource { lossy.DecisionSource = s; return lossy }
	f.cscli(t, "decisions", "add", "--ip", "192.0.2.7", "--duration", "1h")
	const fullPull = 3 * time.Second
	f.start(t, Options{FullPull: fullPull})
	eventually.True(t, "the rule", func() bool { return len(f.rulesIn(t, "eu-west")) == 1 })
	before := f.rulesIn(t, "eu-west")["client_ip 192.0.2.7/32"]

	lossy.lose.Store(true)
	f.cscli(t, "decisions", "add", "--ip", "192.0.2.8", "--duration", "1h")
	eventually.True(t, "an answer of changes loses the decision", func() bool { return lossy.lost.Load() == 1 })
	lostAt := time.Now()
	eventually.True(t, "the full pull brings it", func() bool { return f.rulesIn(t, "eu-west")["client_ip 192.0.2.8/32"] != nil })
	if d := time.Since(lostAt); d > fullPull+2*time.Second {
		t.Errorf("the lost decision's rule came %v after the loss, want within FullPull %v (and a pull)", d, fullPull)
	}
	time.Sleep(fullPull) // one more full pull with nothing new
	after := f.rulesIn(t, "eu-west")["client_ip 192.0.2.7/32"]
	if after.ID != before.ID || !after.ExpiresAt.Equal(before.ExpiresAt) {
		t.Errorf("a full pull rewrote a rule: %s %v, was %s %v", after.ID, after.ExpiresAt, before.ID, before.ExpiresAt)
	}
	if n := f.value(t, "sluice_crowdsec_rules_updated_total", "region", "eu-west"); n != 0 {
		t.Errorf("rules rewritten: %v, want 0", n)
	}
}

// TestClientErrors: a wrong key is ErrUnauthorized; a URL with a password
// is refused without printing it; neither key nor password appears in an
// error.
func TestClientErrors(t *testing.T) {
	lapi := crowdsectest.New(t)
	cl, err := NewClient(ClientOptions{URL: lapi.URL(), APIKey: "wrong-key-0123456789"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = cl.Stream(context.Background(), StreamQuery{Startup: true})
	if !errors.Is(err, ErrUnauthorized) || strings.Contains(err.Error(), "wrong-key") {
		t.Errorf("a wrong key: %v", err)
	}
	cl, _ = NewClient(ClientOptions{URL: lapi.URL(), MachineID: "nobody", Password: "hunter2-secret"})
	_, err = cl.PushAlerts(context.Background(), []Alert{{Scenario: "sluice/x"}})
	if !errors.Is(err, ErrUnauthorized) || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("a wrong machine: %v", err)
	}
	if _, err := NewClient(ClientOptions{URL: "http://u:hunter2@127.0.0.1:1"}); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("a URL with a password: %v", err)
	}
	for _, u := range []string{"", "127.0.0.1:8080", "ftp://x", "http://"} {
		if _, err := NewClient(ClientOptions{URL: u}); err == nil {
			t.Errorf("URL %q: no error", u)
		}
	}
}

// TestBouncerWrongKey: a key the Local API refuses at the first pull ends
// Run with ErrUnauthorized, writing nothing.
func TestBouncerWrongKey(t *testing.T) {
	f := newFixture(t, "eu-west")
	cl, err := NewClient(ClientOptions{URL: f.lapi.URL(), APIKey: "not-the-key"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewBouncer(Options{Source: cl, Regions: []Region{{"eu-west", f.stores["eu-west"]}}, Logger: slog.New(slog.NewTextHandler(f.log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.Run(ctx); !errors.Is(err, ErrUnauthorized) || strings.Contains(err.Error(), "not-the-key") {
		t.Errorf("Run with a wrong key: %v", err)
	}
}
