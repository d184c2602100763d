package enforcer_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/pipeline"
	"github.com/sluice-rl/sluice/rules"
)

// TestFaultLoad puts the sidecar (the limiter's HTTP middleware) under an
// open-loop load of -fault.rate requests per second (2 000) for
// -fault.duration (30 s) per case while Redis or Kafka fails: connections
// refused, Redis silent, Redis slow, a Sentinel and a Cluster failover, and
// Kafka unreachable. Every case checks that each request is answered within
// faultCeiling with no 5xx, that the rules' failure modes decide while Redis
// is unavailable, and logs the latency per phase (docs/benchmarks.md, "Fault
// tests", has the figures). -short skips it.
//
// The cases run one after the other, about four minutes at the defaults.
// Each load takes a good part of the machine's two cores (the sidecar, the
// client, Redis and the proxy all run on them; the Kafka case offers its
// load twice, to the sidecar under test and to a control), and cases run
// together here piled requests up behind each other: what they measured
// was the machine, not the faults. Run alone, each case also has the
// process's goroutines and heap to itself.
func TestFaultLoad(t *testing.T) {
	faultSkip(t)
	t.Run("redis-refused", func(t *testing.T) { proxyCase(t, redistest.Refuse, 0) })
	t.Run("redis-blackhole", func(t *testing.T) { proxyCase(t, redistest.Blackhole, 0) })
	t.Run("redis-slow", func(t *testing.T) { proxyCase(t, redistest.Delay, 100*time.Millisecond) })
	t.Run("failover-sentinel", sentinelFailoverCase)
	t.Run("failover-cluster", clusterFailoverCase)
	t.Run("kafka-down", kafkaDownCase)
}

// proxyCase: Redis healthy for the first fifth of the run, then behind the
// fault for three fifths, then healthy again (for at least 5 s). While it
// fails, every request is decided by the failure modes; the breaker opens,
// after which Redis is called only by the breaker's probes (one per
// cool-down); goroutines and heap stay flat; once healed, Redis decides
// again within 3 s: go-redis's own dial probe, once every connection of its
// pool failed to dial, runs each second, and the breaker's every cool-down.
func proxyCase(t *testing.T, fault redistest.Fault, delay time.Duration) {
	faultAt, healAt := *faultDuration/5, 4**faultDuration/5
	d := max(*faultDuration, healAt+5*time.Second)
	p := redistest.NewProxy(t, redistest.Addr(t))
	rdb := faultClient(p.Addr())
	t.Cleanup(func() { rdb.Close() })
	rec := newRecorder(time.Time{}, loadTotal(d), nil)
	l, m := faultLimiter(t, rdb, rec, faultBudget)
	target := httpSidecar(t, l)
	warm(t, target)

	var wg sync.WaitGroup
	start := loadStart()
	rec.start = start
	var degradedBefore, degradedEnd, stateEnd float64
	var tripsOpen, tripsEnd uint64
	var openAt, settled time.Duration
	var fp1, fp2 footprint
	runAt(&wg, start, faultAt, func() { degradedBefore = m.degraded(); p.Inject(fault, delay) })
	runAt(&wg, start, faultAt, func() { // the breaker's first opening
		for time.Since(start) < healAt {
			if m.breaker() == 2 {
				openAt = time.Since(start)
				// Calls in flight when it opened end within the budget and
				// a wait for a connection.
				time.Sleep(10 * faultBudget)
				settled, tripsOpen = time.Since(start), l.RoundTrips()
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	runAt(&wg, start, (faultAt+healAt)/2, func() { fp1 = measure() })
	runAt(&wg, start, healAt-100*time.Millisecond, func() { fp2 = measure() })
	runAt(&wg, start, healAt, func() {
		tripsEnd, degradedEnd, stateEnd = l.RoundTrips(), m.degraded(), m.breaker()
		p.Inject(redistest.Pass, 0)
	})
	shots := offer(t, start, *faultRate, d, makeLoadReq, target)[0]
	wg.Wait()

	checkAnswers(t, shots)
	checkDegradedAnswers(t, shots, rec)
	// Redis unavailable from the fault (requests already in flight aside)
	// until the heal: every decision by the failure modes.
	checkFailureModes(t, shots, rec, faultAt+50*time.Millisecond, healAt-50*time.Millisecond)
	if degradedEnd-degradedBefore < 0.9*float64(*faultRate)*(healAt-faultAt).Seconds() {
		t.Errorf("degraded decisions rose by %v during the fault, want about one per request", degradedEnd-degradedBefore)
	}
	if openAt == 0 {
		t.Fatalf("the breaker never opened during the fault")
	}
	if stateEnd == 0 {
		t.Errorf("breaker closed at the end of the fault")
	}
	// While open, Redis is called only by the probes: one decision (one
	// round trip; two if the script had to be loaded) per cool-down (1 s).
	probes := (healAt - settled).Seconds() + 1
	if trips := tripsEnd - tripsOpen; float64(trips) > 2*probes {
		t.Errorf("%d Redis round trips in the %v the breaker was open, want at most one per probe (%.0f)", trips, healAt-settled, probes)
	}
	t.Logf("breaker opened %v after the fault; %d round trips while open; degraded +%.0f",
		(openAt - faultAt).Round(time.Millisecond), tripsEnd-tripsOpen, degradedEnd-degradedBefore)
	checkFlat(t, "while the fault lasts", fp1, fp2)
	// Healed: Redis decides again (most requests: a loaded machine makes
	// some miss the 5 ms budget).
	checkRedisDecides(t, shots, rec, healAt+3*time.Second, d, 0.5)
	latencies(t, "latency", shots, []phase{
		{"healthy", 0, faultAt}, {"fault, breaker closed", faultAt, openAt}, {"fault, breaker open", openAt, healAt}, {"healed", healAt, d},
	})
}

// sentinelFailoverCase: a fifth into the run, Sentinel promotes the replica
// and the old master is demoted to a replica of it. Writes must succeed
// again, on the new master, within 5 s of the failover's start, with no
// restart.
func sentinelFailoverCase(t *testing.T) {
	g := redistest.NewSentinelGroup(t)
	failoverCase(t, g.Client, func(ctx context.Context) error { return g.Failover(ctx) }, nil)
}

// clusterFailoverCase: a fifth into the run, one master's replica takes
// over (CLUSTER FAILOVER: the master is demoted to its replica). Requests
// whose keys are in that master's slots must be decided by Redis again
// within 5 s.
func clusterFailoverCase(t *testing.T) {
	ctx := context.Background()
	masters, replicaOf := redistest.ClusterWithReplicas(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: masters, ContextTimeoutEnabled: true,
		PoolTimeout: 2 * faultBudget, DialTimeout: 50 * time.Millisecond, DialerRetries: 1})
	t.Cleanup(func() { rdb.Close() })
	victim, replica := masters[0], replicaOf[masters[0]]
	var owned []redis.SlotRange
	shards, err := rdb.ClusterShards(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range shards {
		for _, n := range s.Nodes {
			if n.Role == "master" && fmt.Sprintf("%s:%d", n.IP, n.Port) == victim {
				owned = append(owned, s.Slots...)
			}
		}
	}
	if len(owned) == 0 {
		t.Fatalf("no slots of %s in CLUSTER SHARDS: %+v", victim, shards)
	}
	set := mustSet(t, faultRules)
	onVictim := func(i int) bool { // a key of request i is in the victim's slots
		r := makeLoadReq(i)
		var desc rules.Descriptors
		desc[rules.KeyClientIP], desc[rules.KeyUser], desc[rules.KeyTenant], desc[rules.KeyRoute] = r.ip, r.user, r.tant, r.route
		for _, rule := range set.Rules {
			if !rule.Matches(&desc) {
				continue
			}
			slot := int64(enforcer.Slot("{" + rules.EntityTag(rule, &desc) + "}"))
			for _, o := range owned {
				if slot >= o.Start && slot <= o.End {
					return true
				}
			}
		}
		return false
	}
	failover := func(ctx context.Context) error {
		c := redis.NewClient(&redis.Options{Addr: replica})
		defer c.Close()
		if err := c.ClusterFailover(ctx).Err(); err != nil {
			return err
		}
		for _, w := range []struct{ addr, role string }{{replica, "role:master"}, {victim, "role:slave"}} {
			n := redis.NewClient(&redis.Options{Addr: w.addr})
			for !strings.Contains(n.Info(ctx, "replication").Val(), w.role) {
				if ctx.Err() != nil {
					n.Close()
					return ctx.Err()
				}
				time.Sleep(5 * time.Millisecond)
			}
			n.Close()
		}
		return nil
	}
	failoverCase(t, rdb, failover, onVictim)
}

// failoverCase runs the load over rdb and calls failover a fifth into it.
// Of the requests that affected selects (nil: all), the first sent after
// failover returned (the old master then takes no writes) and decided by
// Redis must be answered within 5 s of the failover's start, and Redis must
// decide most of them from then on.
func failoverCase(t *testing.T, rdb redis.UniversalClient, failover func(context.Context) error, affected func(i int) bool) {
	failAt := *faultDuration / 5
	d := max(*faultDuration, failAt+8*time.Second) // room to check the 3 s after the 5 s
	rec := newRecorder(time.Time{}, loadTotal(d), nil)
	l, m := faultLimiter(t, rdb, rec, faultBudget)
	target := httpSidecar(t, l)
	warm(t, target)

	var wg sync.WaitGroup
	start := loadStart()
	rec.start = start
	var t0, demoted time.Duration
	var fErr error
	runAt(&wg, start, failAt, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		t0 = time.Since(start)
		fErr = failover(ctx)
		demoted = time.Since(start)
	})
	shots := offer(t, start, *faultRate, d, makeLoadReq, target)[0]
	wg.Wait()
	if fErr != nil {
		t.Fatalf("failover: %v", fErr)
	}
	if affected == nil {
		affected = func(int) bool { return true }
	}
	checkAnswers(t, shots)
	checkDegradedAnswers(t, shots, rec)
	// recovered: the first answer by Redis to a request sent after the
	// demotion, so by the new master; burst: the last answer by the failure
	// modes within 5 s of the start (READONLY from connections to the old
	// master until the client has moved them all).
	recovered, burst := time.Duration(-1), time.Duration(-1)
	var degraded int
	for i := range shots {
		s := &shots[i]
		if !s.done || !affected(i) || s.at < t0 || s.at >= t0+5*time.Second {
			continue
		}
		if r := rec.recs[i]; !r.decided() {
			degraded++
			burst = s.sent + s.took - t0
		} else if recovered < 0 && s.sent >= demoted {
			recovered = s.sent + s.took - t0
		}
	}
	t.Logf("failover: promoted and demoted in %v; writes on the new master %v after the failover began; %d requests affected decided by the failure modes in the 5 s from its start, the last answered at %v; breaker state at the end %v",
		(demoted - t0).Round(time.Millisecond), recovered.Round(time.Millisecond), degraded, burst.Round(time.Millisecond), m.breaker())
	if recovered < 0 || recovered > 5*time.Second {
		t.Errorf("writes succeeded again %v after the failover began, want within 5 s", recovered)
	}
	checkRedisDecides(t, shots, rec, t0+5*time.Second, d, 0.5)
	latencies(t, "latency", shots, []phase{{"healthy", 0, t0}, {"failover", t0, t0 + 5*time.Second}, {"after", t0 + 5*time.Second, d}})
}

// kafkaDownCase: the decision records go to Kafka (kfake) through a proxy
// that blackholes it for twice -fault.duration (60 s). The same request
// sequence goes at the same instants to a control sidecar whose Kafka stays
// up: decisions must be the same, request by request; the producer counts
// what it drops; the heap stays bounded; records reach Kafka again after it
// is back.
func kafkaDownCase(t *testing.T) {
	d := *faultDuration
	downAt, upAt := d/5, d/5+2*d
	total := upAt + d/3
	proxy := redistest.NewProxy(t, "")
	kFault, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, pipeline.DefaultTopic),
		kfake.ListenFn(func(network, addr string) (net.Listener, error) {
			ln, err := net.Listen(network, addr)
			if err != nil {
				return nil, err
			}
			proxy.SetUpstream(ln.Addr().String())
			return advertised{Listener: ln, addr: proxyAddr(proxy.Addr())}, nil // clients reach the broker through the proxy
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kFault.Close)
	kCtl, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, pipeline.DefaultTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kCtl.Close)
	prodFault, err := pipeline.NewProducer(pipeline.ProducerOptions{Brokers: []string{proxy.Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prodFault.Close)
	prodCtl, err := pipeline.NewProducer(pipeline.ProducerOptions{Brokers: kCtl.ListenAddrs()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prodCtl.Close)

	n := loadTotal(total)
	recFault, recCtl := newRecorder(time.Time{}, n, prodFault), newRecorder(time.Time{}, n, prodCtl)
	// A budget that a healthy Redis never misses, even on a loaded machine:
	// this case is about Kafka, and a decision degraded by a late Redis
	// answer in one run and not the other would differ for that reason.
	lFault, _ := faultLimiter(t, redistest.Server(t), recFault, time.Second)
	lCtl, _ := faultLimiter(t, redistest.Server(t), recCtl, time.Second)
	targetFault, targetCtl := httpSidecar(t, lFault), httpSidecar(t, lCtl)
	warm(t, targetFault)
	warm(t, targetCtl)
	for _, p := range []*pipeline.Producer{prodFault, prodCtl} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := p.Flush(ctx); err != nil {
			t.Fatalf("kafka before the fault: %v", err)
		}
		cancel()
	}

	var wg sync.WaitGroup
	start := loadStart()
	recFault.start, recCtl.start = start, start
	var fp0, fp1, fp2 footprint
	var statsDown, statsUp pipeline.ProducerStats
	runAt(&wg, start, downAt, func() { fp0 = measure(); proxy.Inject(redistest.Blackhole, 0) })
	runAt(&wg, start, downAt+(upAt-downAt)/2, func() { fp1 = measure() })
	runAt(&wg, start, upAt-100*time.Millisecond, func() { fp2 = measure(); statsDown = prodFault.Stats() })
	runAt(&wg, start, upAt, func() { proxy.Inject(redistest.Pass, 0) })
	// Every request at a fixed instant of the caller's clock, so that both
	// sidecars see the same times.
	base := time.UnixMilli(1_800_000_000_000)
	mk := func(i int) loadReq {
		r := makeLoadReq(i)
		r.now = base.Add(time.Duration(int64(i) * int64(time.Second) / int64(*faultRate)))
		return r
	}
	out := offer(t, start, *faultRate, total, mk, targetFault, targetCtl)
	wg.Wait()
	statsUp = prodFault.Stats()
	fault, ctl := out[0], out[1]

	checkAnswers(t, fault)
	checkAnswers(t, ctl)
	diff := 0
	for i := range fault {
		f, c := &fault[i], &ctl[i]
		if f.resp != c.resp || recFault.recs[i].outcome != recCtl.recs[i].outcome {
			if diff++; diff <= 3 {
				t.Errorf("request %d (%s): %d %v with Kafka down, %d %v in the control run", i, makeLoadReq(i).route,
					f.resp.status, recFault.recs[i].outcome, c.resp.status, recCtl.recs[i].outcome)
			}
		}
	}
	if diff > 0 {
		t.Errorf("%d of %d decisions differ from the control run's", diff, len(fault))
	}
	lost := statsDown.Dropped + statsDown.Failed
	t.Logf("kafka down: producer %+v at the end of the outage, %+v after", statsDown, statsUp)
	// Records wait for Kafka up to the producer's delivery timeout (30 s)
	// in buffers of 65 536: a longer outage, or more records, loses some,
	// counted; a shorter one delivers them all late.
	if upAt-downAt > 30*time.Second || loadTotal(upAt-downAt) > 65536 {
		if lost == 0 {
			t.Errorf("no record counted as dropped or failed while Kafka was down %v: %+v", upAt-downAt, statsDown)
		}
	} else if lost > 0 {
		t.Errorf("%d records lost to an outage of %v, shorter than the delivery timeout: %+v", lost, upAt-downAt, statsDown)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := prodFault.Flush(ctx); err != nil {
		t.Errorf("flushing after the outage: %v", err)
	}
	if s := prodFault.Stats(); s.Logged != s.Produced+s.Dropped+s.Failed {
		t.Errorf("producer after the outage: %+v, want every record produced, dropped or failed", s)
	}
	// The producer's buffers (65 536 records each) bound the heap: it
	// grows while they fill, then stays flat.
	t.Logf("heap and goroutines: at the outage %v, half-way %v, at its end %v", fp0, fp1, fp2)
	if fp2.heap > fp0.heap+256<<20 {
		t.Errorf("heap grew from %v to %v while Kafka was down", fp0, fp2)
	}
	checkFlat(t, "second half of the outage", fp1, fp2)
	// Logging resumes: records of requests made after Kafka came back reach it.
	firstUp := int(int64(upAt+time.Second) * int64(*faultRate) / int64(time.Second))
	if !consumed(t, proxy.Addr(), firstUp) {
		t.Errorf("no record of a request after Kafka came back (request %d on) reached Kafka; producer %+v", firstUp, prodFault.Stats())
	}
	ph := []phase{{"kafka up", 0, downAt}, {"kafka down", downAt, upAt}, {"kafka back", upAt, total}}
	latencies(t, "with kafka down", fault, ph)
	latencies(t, "control", ctl, ph)
}

// consumed reports whether the decisions topic at broker holds a record of
// request from or later, within 30 s.
func consumed(t *testing.T, broker string, from int) bool {
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.ConsumeTopics(pipeline.DefaultTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		found := false
		fs.EachRecord(func(r *kgo.Record) {
			if d, err := decision.Decode(r.Value); err == nil {
				if i, err := strconv.Atoi(d.GetRequestId()); err == nil && i >= from {
					found = true
				}
			}
		})
		if found {
			return true
		}
	}
	return false
}

// advertised is a listener that gives another address as its own: kfake
// tells clients to connect to its listener's address, here the proxy's.
type advertised struct {
	net.Listener
	addr net.Addr
}

func (a advertised) Addr() net.Addr { return a.addr }

type proxyAddr string

func (a proxyAddr) Network() string { return "tcp" }
func (a proxyAddr) String() string  { return string(a) }

// warm sends a request of each route, so that the script is cached and
// connections are open before the load starts.
func warm(t *testing.T, target loadTarget) {
	t.Helper()
	for i := 0; i < 10; i++ {
		r := makeLoadReq(1_000_000 + i)
		r.ip = "203.0.113.1"
		if _, err := target(context.Background(), &r); err != nil {
			t.Fatal(err)
		}
	}
}

// checkDegradedAnswers checks every decision the failure modes made: a
// login is denied 429 with Retry-After: 1 by the login rule
// (limiter_unavailable, the only reason a degraded decision names a
// fail-closed rule), any other request is allowed.
func checkDegradedAnswers(t *testing.T, shots []shot, rec *recorder) {
	t.Helper()
	bad := 0
	for i := range shots {
		s, r := &shots[i], rec.recs[i]
		if !s.done || s.err != nil || r.decided() {
			continue
		}
		var ok bool
		if makeLoadReq(i).route == "/login" {
			ok = s.resp.status == http.StatusTooManyRequests && s.resp.retryAfter == "1" && r.outcome == decision.DegradedClosed && r.rule == "login"
		} else {
			ok = s.resp.status == http.StatusOK && r.outcome == decision.DegradedOpen
		}
		if !ok {
			if bad++; bad <= 3 {
				t.Errorf("request %d (%s), degraded: %d Retry-After %q, decision %v by %q", i, makeLoadReq(i).route, s.resp.status, s.resp.retryAfter, r.outcome, r.rule)
			}
		}
	}
	if bad > 3 {
		t.Errorf("... %d degraded decisions in all not as their failure modes say", bad)
	}
}

// checkRedisDecides fails unless Redis decided at least share of the
// requests scheduled in [from, to).
func checkRedisDecides(t *testing.T, shots []shot, rec *recorder, from, to time.Duration, share float64) {
	t.Helper()
	var n, redis int
	for i := range shots {
		if s := &shots[i]; s.done && s.at >= from && s.at < to {
			n++
			if rec.recs[i].decided() {
				redis++
			}
		}
	}
	t.Logf("Redis decided %d of %d requests from %v to %v", redis, n, from, to)
	if n == 0 || float64(redis) < share*float64(n) {
		t.Errorf("Redis decided %d of %d requests from %v to %v, want at least %.0f%%", redis, n, from, to, 100*share)
	}
}
