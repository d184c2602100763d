package enforcer_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// serverCalls returns a function that reads the commands the redis-server
// at addr has run (INFO commandstats), INFO itself left out: what every
// client of it sent. It keeps one connection, so that its own HELLO is
// counted once, before the first reading.
func serverCalls(t *testing.T, addr string) func() int64 {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1})
	t.Cleanup(func() { c.Close() })
	return func() int64 { return commandsRun(t, c) }
}

func commandsRun(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	stats, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(stats, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		v, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatalf("commandstats line %q: %v", line, err)
		}
		n += v
	}
	return n
}

// countHook counts every command and pipeline a client sends, and every
// connection it dials.
type countHook struct {
	mu           sync.Mutex
	cmds, dials  int
	lastCommands []string
}

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (c net.Conn, err error) {
		h.mu.Lock()
		h.dials++
		h.mu.Unlock()
		return next(ctx, network, addr)
	}
}

func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		h.cmds++
		h.lastCommands = append(h.lastCommands, cmd.Name())
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.mu.Lock()
		h.cmds += len(cmds)
		for _, c := range cmds {
			h.lastCommands = append(h.lastCommands, c.Name())
		}
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

func (h *countHook) count() (cmds, dials int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cmds, h.dials
}

const localRules = `
domain: edge
rules:
  - {id: per-ip-edge, match: [{key: client_ip}], limit: 2, period: 1m, scope: local}
  - {id: per-asn-edge, mode: shadow, match: [{key: asn}], limit: 1, period: 1m, scope: local}
  - {id: per-key, match: [{key: api_key}], limit: 1, period: 1m}
`

func edgeReq(ms int64, ip, asn, key string) *enforcer.Request {
	r := &enforcer.Request{Now: at(ms)}
	r.Descriptors[rules.KeyClientIP], r.Descriptors[rules.KeyASN], r.Descriptors[rules.KeyAPIKey] = ip, asn, key
	return r
}

// TestLocalRulesMakeNoRedisCall: a request whose matching rules are all
// local-scope is decided in memory: the redis-server runs no command for
// it (INFO commandstats) and the client sends none (a hook), allowed or
// denied; the denial has its reason, path, Retry-After and record. A
// request that also matches a regional rule does reach Redis, so the
// counts do see calls.
func TestLocalRulesMakeNoRedisCall(t *testing.T) {
	addr := redistest.Addr(t)
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	hook := &countHook{}
	rdb.AddHook(hook)
	calls := serverCalls(t, addr)
	var recs []decision.Record
	l, err := enforcer.New(rdb, mustSet(t, localRules), enforcer.Options{Budget: time.Second,
		Sink: sinkFunc(func(r decision.Record) { recs = append(recs, r) })})
	if err != nil {
		t.Fatal(err)
	}
	before := calls()
	for i, want := range []decision.Outcome{decision.Allowed, decision.Allowed, decision.Denied} {
		d := decide(t, l, edgeReq(int64(i), "192.0.2.7", "", ""))
		if d.Outcome != want || d.Path != decision.PathLocal {
			t.Fatalf("request %d: %v on path %v, want %v on path local", i+1, d.Outcome, d.Path, want)
		}
		if want == decision.Denied {
			if d.Reason != decision.ReasonOverLimit || d.Rule.ID != "per-ip-edge" || d.Remaining != 0 || d.Limit != 2 {
				t.Errorf("deny: %v by %v, limit %d remaining %d; want over_limit by per-ip-edge, 2, 0", d.Reason, d.Rule, d.Limit, d.Remaining)
			}
			// 2 per minute: the next token in 30 s, less the 2 ms elapsed.
			if d.Wait != 29_998*time.Millisecond || header(&d, "Retry-After") != "30" {
				t.Errorf("deny: wait %v, Retry-After %q; want 29.998s and 30", d.Wait, header(&d, "Retry-After"))
			}
			if got := header(&d, "RateLimit"); got != `"per-ip-edge";r=0;t=60` {
				t.Errorf("RateLimit %q", got)
			}
		}
	}
	if cmds, dials := hook.count(); cmds != 0 || dials != 0 {
		t.Errorf("local-only requests: the client sent %d commands (%v) and dialled %d times, want none", cmds, hook.lastCommands, dials)
	}
	if after := calls(); after != before {
		t.Errorf("local-only requests: redis-server ran %d commands, want 0", after-before)
	}
	if len(recs) != 3 || recs[2].Outcome != decision.Denied || recs[2].Path != decision.PathLocal || recs[2].DenyingRule != "per-ip-edge" ||
		len(recs[2].Matched) != 1 || recs[2].Matched[0] != "per-ip-edge" {
		t.Fatalf("records: %+v", recs)
	}
	// A regional rule does call Redis: the counts can see it.
	decide(t, l, edgeReq(3, "", "", "k1"))
	if cmds, _ := hook.count(); cmds == 0 {
		t.Fatal("the hook saw no command for a regional rule")
	}
	if after := calls(); after == before {
		t.Fatal("INFO commandstats saw no command for a regional rule")
	}
}

// TestLocalAndRegionalRulesCommitTogether: a request matching local and
// regional rules is charged only if all allow. A local deny makes no Redis
// call and charges the regional rule nothing; a regional deny gives the
// local tokens back.
func TestLocalAndRegionalRulesCommitTogether(t *testing.T) {
	addr := redistest.Addr(t)
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	l, err := enforcer.New(rdb, mustSet(t, localRules), enforcer.Options{Budget: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	calls := serverCalls(t, addr)
	// Both allow: both charged; the regional rule binds (0 left of 1).
	d := decide(t, l, edgeReq(0, "192.0.2.1", "", "k1"))
	if d.Outcome != decision.Allowed || d.Path != decision.PathRedis || status(t, &d, "per-ip-edge").Remaining != 1 || d.Remaining != 0 {
		t.Fatalf("both allow: %v path %v, per-ip-edge remaining %d, binding remaining %d", d.Outcome, d.Path, status(t, &d, "per-ip-edge").Remaining, d.Remaining)
	}
	// The regional rule denies: the local token is given back.
	d = decide(t, l, edgeReq(1, "192.0.2.1", "", "k1"))
	if d.Outcome != decision.Denied || d.Rule.ID != "per-key" || status(t, &d, "per-ip-edge").Remaining != 1 {
		t.Fatalf("regional deny: %v by %v, per-ip-edge remaining %d; want denied by per-key, 1 left", d.Outcome, d.Rule, status(t, &d, "per-ip-edge").Remaining)
	}
	if d := decide(t, l, edgeReq(2, "192.0.2.1", "", "")); d.Outcome != decision.Allowed || d.Remaining != 0 {
		t.Fatalf("after the regional deny the local rule had %d left before this request, want 1 (given back): %v", d.Remaining+1, d.Outcome)
	}
	// Now the local rule denies: no Redis call, and k2 is not charged.
	before := calls()
	d = decide(t, l, edgeReq(3, "192.0.2.1", "", "k2"))
	if d.Outcome != decision.Denied || d.Rule.ID != "per-ip-edge" || d.Path != decision.PathLocal {
		t.Fatalf("local deny: %v by %v on %v", d.Outcome, d.Rule, d.Path)
	}
	if after := calls(); after != before {
		t.Errorf("a local deny ran %d commands in Redis, want 0", after-before)
	}
	if d := decide(t, l, edgeReq(4, "192.0.2.2", "", "k2")); d.Outcome != decision.Allowed || status(t, &d, "per-key").Remaining != 0 {
		t.Fatalf("k2 after the local deny: %v, per-key remaining %d; want allowed with 0 left (it had its 1)", d.Outcome, status(t, &d, "per-key").Remaining)
	}
}

// TestLocalShadowRule: a shadow local rule counts what it allows, never
// denies, and marks what it would have denied (outcome, record's shadow
// rule, would-deny metric by path).
func TestLocalShadowRule(t *testing.T) {
	rdb := redistest.Server(t)
	reg := prometheus.NewRegistry()
	var recs []decision.Record
	l, err := enforcer.New(rdb, mustSet(t, localRules), enforcer.Options{Budget: time.Second, Registerer: reg,
		Sink: sinkFunc(func(r decision.Record) { recs = append(recs, r) })})
	if err != nil {
		t.Fatal(err)
	}
	if d := decide(t, l, edgeReq(0, "", "AS64500", "")); d.Outcome != decision.Allowed || d.Path != decision.PathLocal {
		t.Fatalf("first: %v %v", d.Outcome, d.Path)
	}
	d := decide(t, l, edgeReq(1, "", "AS64500", ""))
	if d.Outcome != decision.ShadowDenied || d.Shadow == nil || d.Shadow.ID != "per-asn-edge" || header(&d, "Retry-After") != "" {
		t.Fatalf("second: %v shadow %v Retry-After %q; want shadow_denied by per-asn-edge, no Retry-After", d.Outcome, d.Shadow, header(&d, "Retry-After"))
	}
	if r := recs[1]; r.ShadowRule != "per-asn-edge" || r.Outcome != decision.ShadowDenied || r.Path != decision.PathLocal {
		t.Errorf("record %+v", r)
	}
	if v := wouldDeny(t, reg, "local"); v != 1 {
		t.Errorf("would_deny_total{path=local} = %v, want 1", v)
	}
	// A shadow rule beside a regional deny: still the regional deny.
	decide(t, l, edgeReq(2, "", "AS64501", "k9"))
	if d := decide(t, l, edgeReq(3, "", "AS64501", "k9")); d.Outcome != decision.Denied || d.Rule.ID != "per-key" || d.Shadow == nil {
		t.Errorf("regional deny with a shadow local rule: %v by %v, shadow %v", d.Outcome, d.Rule, d.Shadow)
	}
}

// wouldDeny returns the value of sluice_enforcer_would_deny_total{path}.
func wouldDeny(t *testing.T, reg *prometheus.Registry, path string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "sluice_enforcer_would_deny_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "path" && lp.GetValue() == path {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no would_deny series for path %s", path)
	return 0
}

// TestLocalEntitiesAreBounded: at most LocalEntities entities keep state;
// the least recently used is forgotten and starts again full; the gauge and
// the evictions counter say so.
func TestLocalEntitiesAreBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	l, err := enforcer.New(redistest.Server(t), mustSet(t, localRules), enforcer.Options{Budget: time.Second, LocalEntities: 2, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		decide(t, l, edgeReq(int64(i), "192.0.2.1", "", ""))
	}
	if d := decide(t, l, edgeReq(2, "192.0.2.1", "", "")); d.Outcome != decision.Denied {
		t.Fatalf("third request of 192.0.2.1: %v", d.Outcome)
	}
	decide(t, l, edgeReq(3, "192.0.2.2", "", ""))
	decide(t, l, edgeReq(4, "192.0.2.3", "", "")) // 192.0.2.1 is the least recently used: forgotten
	if d := decide(t, l, edgeReq(5, "192.0.2.1", "", "")); d.Outcome != decision.Allowed || d.Remaining != 1 {
		t.Fatalf("192.0.2.1 after eviction: %v remaining %d, want a full bucket (allowed, 1 left)", d.Outcome, d.Remaining)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP sluice_enforcer_local_entities Entities (rule and key) whose local-scope rule state this enforcer holds in memory, at most Options.LocalEntities.
# TYPE sluice_enforcer_local_entities gauge
sluice_enforcer_local_entities 2
# HELP sluice_enforcer_local_evictions_total Local-scope rule states forgotten to stay within Options.LocalEntities (least recently used first); a forgotten entity starts again with a full bucket.
# TYPE sluice_enforcer_local_evictions_total counter
sluice_enforcer_local_evictions_total 2
`), "sluice_enforcer_local_entities", "sluice_enforcer_local_evictions_total"); err != nil {
		t.Error(err)
	}
}

// TestLocalBucketRefills: a local token bucket refills at limit per period
// on the request's clock, up to its burst; a cost above the burst is
// cost_exceeds_capacity with no Retry-After.
func TestLocalBucketRefills(t *testing.T) {
	l := newLimiter(t, redistest.Server(t), `
domain: edge
rules: [{id: ip, match: [{key: client_ip}], limit: 10, period: 1s, burst: 5, scope: local}]`)
	req := func(ms int64, cost uint32) enforcer.Decision {
		r := edgeReq(ms, "198.51.100.9", "", "")
		r.Cost = cost
		return decide(t, l, r)
	}
	if d := req(0, 5); d.Outcome != decision.Allowed || d.Remaining != 0 || d.Reset != 500*time.Millisecond {
		t.Fatalf("take 5: %v remaining %d reset %v", d.Outcome, d.Remaining, d.Reset)
	}
	if d := req(50, 1); d.Outcome != decision.Denied || d.Wait != 50*time.Millisecond || d.RetryAfter != time.Second {
		t.Fatalf("at 50 ms: %v wait %v retry-after %v; want denied, 50ms, 1s", d.Outcome, d.Wait, d.RetryAfter)
	}
	if d := req(100, 1); d.Outcome != decision.Allowed || d.Remaining != 0 {
		t.Fatalf("at 100 ms: %v remaining %d", d.Outcome, d.Remaining)
	}
	if d := req(10_000, 1); d.Outcome != decision.Allowed || d.Remaining != 4 {
		t.Fatalf("after 10 s (full at 5): %v remaining %d", d.Outcome, d.Remaining)
	}
	if d := req(10_001, 6); d.Outcome != decision.Denied || d.Reason != decision.ReasonCostExceedsCapacity || d.RetryAfter != 0 {
		t.Fatalf("cost 6 > burst 5: %v %v retry-after %v", d.Outcome, d.Reason, d.RetryAfter)
	}
}
