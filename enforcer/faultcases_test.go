package enforcer_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/faultload"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// TestFaultLoad puts the sidecar (the limiter's HTTP middleware) under an
// open-loop load of -fault.rate requests per second (2 000) for
// -fault.duration (30 s) per case while Redis fails: connections refused,
// Redis silent, Redis slow, a Sentinel and a Cluster failover. Every case
// checks that each request is answered within faultload.Ceiling with no
// 5xx, that the rules' failure modes decide while Redis is unavailable, and
// logs the latency per phase (docs/benchmarks.md, "Fault tests", has the
// figures). -short skips it. The harness is internal/faultload; the Kafka
// case (Kafka unreachable), which needs pipeline's producer, which enforcer
// may not import, is faultload's own TestFaultLoadKafka.
//
// The cases run one after the other, about three minutes at the defaults.
// Each load takes a good part of the machine's two cores (the sidecar, the
// client, Redis and the proxy all run on them), and cases run together here
// piled requests up behind each other: what they measured was the machine,
// not the faults. Run alone, each case also has the process's goroutines
// and heap to itself.
func TestFaultLoad(t *testing.T) {
	faultload.SkipShort(t)
	// The overload cases first, in a process that the others have not yet
	// filled with garbage and goroutines (one of them gives the process one core).
	t.Run("sidecar-saturated", saturatedCase)
	t.Run("accuracy-256", accuracyCase)
	t.Run("redis-stalled", stalledCase)
	// The open-loop cases offer their load to the sidecar under the fault
	// and, at the same instants, to a control sidecar on a Redis that stays
	// healthy (faultload.Controlled): at -fault.rate, or at the highest half,
	// quarter, ... of it that this machine carries now, found once here.
	// A case whose control fell behind leaves the rate lowered for the next.
	rate := calibrate(t)
	t.Run("redis-refused", func(t *testing.T) { proxyCase(t, &rate, redistest.Refuse, 0) })
	t.Run("redis-blackhole", func(t *testing.T) { proxyCase(t, &rate, redistest.Blackhole, 0) })
	t.Run("redis-slow", func(t *testing.T) { proxyCase(t, &rate, redistest.Delay, 100*time.Millisecond) })
	t.Run("failover-sentinel", func(t *testing.T) { sentinelFailoverCase(t, &rate) })
	t.Run("failover-cluster", func(t *testing.T) { clusterFailoverCase(t, &rate) })
}

// calibrate returns the rate, at most -fault.rate, that the machine
// carries now for a case and its control (faultload.Sustained), found
// with two throwaway sidecars like theirs.
func calibrate(t *testing.T) int {
	t.Helper()
	var targets []faultload.Target
	for range 2 {
		targets = append(targets, newControl(t, 0).target)
	}
	return faultload.Sustained(t, faultload.Rate(), faultload.MinRate, targets...)
}

// control is a sidecar like a case's, on a Redis of its own that stays
// healthy: a case offers it the same load at the same instants, and is
// judged against what it answered (faultload.Controlled).
type control struct {
	rec    *faultload.Recorder
	target faultload.Target
	shots  []faultload.Shot
}

// newControl returns a control sidecar, warmed, whose recorder holds n
// requests.
func newControl(t *testing.T, n int) *control {
	t.Helper()
	rdb := faultload.RedisClient(redistest.Addr(t))
	t.Cleanup(func() { rdb.Close() })
	c := &control{rec: faultload.NewRecorder(time.Time{}, n, nil)}
	l, _ := faultload.NewLimiter(t, rdb, c.rec, faultload.Budget)
	c.target = faultload.HTTPSidecar(t, l)
	faultload.Warm(t, c.target)
	return c
}

// requests is the number of requests offered at rate per second for d.
func requests(rate int, d time.Duration) int { return int(int64(rate) * int64(d) / int64(time.Second)) }

// proxyCase: Redis healthy for the first fifth of the run, then behind the
// fault for three fifths, then healthy again (for at least 5 s). While it
// fails, every request is decided by the failure modes; the breaker opens,
// after which Redis is called only by the breaker's probes (one per
// cool-down); goroutines and heap stay flat; once healed, Redis decides
// again within 3 s: go-redis's own dial probe, once every connection of its
// pool failed to dial, runs each second, and the breaker's every cool-down.
// Answers are judged against a control's (faultload.Controlled).
func proxyCase(t *testing.T, rate *int, fault redistest.Fault, delay time.Duration) {
	faultload.Controlled(t, rate, func(t *testing.T, rate int) ([]faultload.Shot, func()) { return proxyRun(t, rate, fault, delay) })
}

// proxyRun is one run of proxyCase at rate requests per second: it returns
// the control's shots and the run's judge.
func proxyRun(t *testing.T, rate int, fault redistest.Fault, delay time.Duration) ([]faultload.Shot, func()) {
	faultAt, healAt := faultload.Duration()/5, 4*faultload.Duration()/5
	d := max(faultload.Duration(), healAt+5*time.Second)
	p := redistest.NewProxy(t, redistest.Addr(t))
	rdb := faultload.RedisClient(p.Addr())
	t.Cleanup(func() { rdb.Close() })
	rec := faultload.NewRecorder(time.Time{}, requests(rate, d), nil)
	l, m := faultload.NewLimiter(t, rdb, rec, faultload.Budget)
	target := faultload.HTTPSidecar(t, l)
	faultload.Warm(t, target)
	ctl := newControl(t, requests(rate, d))

	var wg sync.WaitGroup
	start := faultload.Start()
	rec.Start, ctl.rec.Start = start, start
	var degradedBefore, degradedEnd, stateEnd float64
	var tripsOpen, tripsEnd uint64
	var openAt, settled time.Duration
	var fp1, fp2 faultload.Footprint
	faultload.RunAt(&wg, start, faultAt, func() { degradedBefore = m.Degraded(); p.Inject(fault, delay) })
	faultload.RunAt(&wg, start, faultAt, func() { // the breaker's first opening
		for time.Since(start) < healAt {
			if m.Breaker() == 2 {
				openAt = time.Since(start)
				// Calls in flight when it opened end within the budget and
				// a wait for a connection.
				time.Sleep(10 * faultload.Budget)
				settled, tripsOpen = time.Since(start), l.RoundTrips()
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	faultload.RunAt(&wg, start, (faultAt+healAt)/2, func() { fp1 = faultload.Measure() })
	faultload.RunAt(&wg, start, healAt-100*time.Millisecond, func() { fp2 = faultload.Measure() })
	faultload.RunAt(&wg, start, healAt, func() {
		tripsEnd, degradedEnd, stateEnd = l.RoundTrips(), m.Degraded(), m.Breaker()
		p.Inject(redistest.Pass, 0)
	})
	out := faultload.OfferUnchecked(start, rate, d, faultload.MakeRequest, target, ctl.target)
	wg.Wait()
	shots := out[0]
	ctl.shots = out[1]

	return ctl.shots, func() {
		t.Logf("offered %d requests/s to the sidecar and to its control", rate)
		// A refused connection fails at once; a silent or slow Redis holds
		// each request until the breaker opens.
		held := faultload.Phase{Name: "until the breaker opened", From: faultAt, To: openAt}
		if fault == redistest.Refuse || openAt == 0 {
			held = faultload.Phase{}
		}
		faultload.CheckAgainstControl(t, "under the fault", shots, ctl.shots, held)
		faultload.CheckDegradedAnswers(t, shots, rec)
		// Redis unavailable from the fault (requests already in flight aside)
		// until the heal: every decision by the failure modes.
		faultload.CheckFailureModes(t, shots, rec, faultAt+50*time.Millisecond, healAt-50*time.Millisecond)
		if sent := faultload.Sent(shots, faultAt, healAt); degradedEnd-degradedBefore < 0.9*float64(sent) {
			t.Errorf("degraded decisions rose by %v during the fault, in which %d requests were sent: want about one per request", degradedEnd-degradedBefore, sent)
		}
		if openAt == 0 {
			t.Fatalf("the breaker never opened during the fault")
		}
		if stateEnd == 0 {
			t.Errorf("breaker closed at the end of the fault")
		}
		// While open, Redis is called only by the probes: Breaker.Probes (3 by
		// default) decisions per cool-down (1 s), one round trip each (two if
		// the script had to be loaded).
		const breakerProbes = 3
		probes := breakerProbes * ((healAt - settled).Seconds() + 1)
		if trips := tripsEnd - tripsOpen; float64(trips) > 2*probes {
			t.Errorf("%d Redis round trips in the %v the breaker was open, want at most two per probe (%.0f probes)", trips, healAt-settled, probes)
		}
		t.Logf("breaker opened %v after the fault; %d round trips while open; degraded +%.0f",
			(openAt - faultAt).Round(time.Millisecond), tripsEnd-tripsOpen, degradedEnd-degradedBefore)
		faultload.CheckFlat(t, "while the fault lasts", fp1, fp2)
		// Healed: Redis decides again (most requests, or half of what the
		// control's Redis decided where a loaded machine made its answers
		// miss the 10 ms budget).
		faultload.CheckRedisDecidesBeside(t, shots, rec, ctl.shots, ctl.rec, healAt+3*time.Second, d, 0.5)
		ph := []faultload.Phase{
			{Name: "healthy", From: 0, To: faultAt},
			{Name: "fault, breaker closed", From: faultAt, To: openAt},
			{Name: "fault, breaker open", From: openAt, To: healAt},
			{Name: "healed", From: healAt, To: d},
		}
		faultload.Latencies(t, "latency", shots, ph)
		faultload.Latencies(t, "control", ctl.shots, ph)
	}
}

// sentinelFailoverCase: a fifth into the run, Sentinel promotes the replica
// and the old master is demoted to a replica of it. Writes must succeed
// again, on the new master, within 5 s of the failover's start, with no
// restart.
func sentinelFailoverCase(t *testing.T, rate *int) {
	faultload.Controlled(t, rate, func(t *testing.T, rate int) ([]faultload.Shot, func()) {
		g := redistest.NewSentinelGroup(t)
		return failoverRun(t, rate, g.Client, func(ctx context.Context) error { return g.Failover(ctx) }, nil)
	})
}

// clusterFailoverCase: a fifth into the run, one master's replica takes
// over (CLUSTER FAILOVER: the master is demoted to its replica). Requests
// whose keys are in that master's slots must be decided by Redis again
// within 5 s.
func clusterFailoverCase(t *testing.T, rate *int) {
	faultload.Controlled(t, rate, func(t *testing.T, rate int) ([]faultload.Shot, func()) { return clusterFailoverRun(t, rate) })
}

// clusterFailoverRun is one run of clusterFailoverCase at rate requests per
// second: it returns the control's shots and the run's judge.
func clusterFailoverRun(t *testing.T, rate int) ([]faultload.Shot, func()) {
	ctx := context.Background()
	masters, replicaOf := redistest.ClusterWithReplicas(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: masters, ContextTimeoutEnabled: true,
		PoolTimeout: 2 * faultload.Budget, DialTimeout: 50 * time.Millisecond, DialerRetries: 1})
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
	set := faultload.RuleSet(t)
	onVictim := func(i int) bool { // a key of request i is in the victim's slots
		r := faultload.MakeRequest(i)
		var desc rules.Descriptors
		desc[rules.KeyClientIP], desc[rules.KeyUser], desc[rules.KeyTenant], desc[rules.KeyRoute] = r.IP, r.User, r.Tenant, r.Route
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
	return failoverRun(t, rate, rdb, failover, onVictim)
}

// failoverRun runs the load over rdb at rate requests per second, and
// at the same instants to a control (faultload.Controlled), and calls
// failover a fifth into it. It returns the control's shots and the run's
// judge: of the requests that affected selects (nil: all), the first sent
// after failover returned (the old master then takes no writes) and
// decided by Redis must be answered within 5 s of the failover's start,
// and Redis must decide most of them from then on.
func failoverRun(t *testing.T, rate int, rdb redis.UniversalClient, failover func(context.Context) error, affected func(i int) bool) ([]faultload.Shot, func()) {
	failAt := faultload.Duration() / 5
	d := max(faultload.Duration(), failAt+8*time.Second) // room to check the 3 s after the 5 s
	rec := faultload.NewRecorder(time.Time{}, requests(rate, d), nil)
	l, m := faultload.NewLimiter(t, rdb, rec, faultload.Budget)
	target := faultload.HTTPSidecar(t, l)
	faultload.Warm(t, target)
	ctl := newControl(t, requests(rate, d))

	var wg sync.WaitGroup
	start := faultload.Start()
	rec.Start, ctl.rec.Start = start, start
	var t0, demoted time.Duration
	var fErr error
	faultload.RunAt(&wg, start, failAt, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		t0 = time.Since(start)
		fErr = failover(ctx)
		demoted = time.Since(start)
	})
	out := faultload.OfferUnchecked(start, rate, d, faultload.MakeRequest, target, ctl.target)
	wg.Wait()
	shots := out[0]
	ctl.shots = out[1]
	if affected == nil {
		affected = func(int) bool { return true }
	}
	return ctl.shots, func() {
		if fErr != nil {
			t.Fatalf("failover: %v", fErr)
		}
		t.Logf("offered %d requests/s to the sidecar and to its control", rate)
		faultload.CheckAgainstControl(t, "failover", shots, ctl.shots, faultload.Phase{})
		faultload.CheckDegradedAnswers(t, shots, rec)
		// recovered: the first answer by Redis to a request sent after the
		// demotion, so by the new master; burst: the last answer by the failure
		// modes within 5 s of the start (READONLY from connections to the old
		// master until the client has moved them all).
		recovered, burst := time.Duration(-1), time.Duration(-1)
		var degraded int
		for i := range shots {
			s := &shots[i]
			if !s.Done || !affected(i) || s.At < t0 || s.At >= t0+5*time.Second {
				continue
			}
			if r := rec.Recs[i]; !r.Decided() {
				degraded++
				burst = s.Sent + s.Took - t0
			} else if recovered < 0 && s.Sent >= demoted {
				recovered = s.Sent + s.Took - t0
			}
		}
		t.Logf("failover: promoted and demoted in %v; writes on the new master %v after the failover began; %d requests affected decided by the failure modes in the 5 s from its start, the last answered at %v; breaker state at the end %v",
			(demoted - t0).Round(time.Millisecond), recovered.Round(time.Millisecond), degraded, burst.Round(time.Millisecond), m.Breaker())
		if recovered < 0 || recovered > 5*time.Second {
			t.Errorf("writes succeeded again %v after the failover began, want within 5 s", recovered)
		}
		faultload.CheckRedisDecidesBeside(t, shots, rec, ctl.shots, ctl.rec, t0+5*time.Second, d, 0.5)
		ph := []faultload.Phase{
			{Name: "healthy", From: 0, To: t0},
			{Name: "failover", From: t0, To: t0 + 5*time.Second},
			{Name: "after", From: t0 + 5*time.Second, To: d},
		}
		faultload.Latencies(t, "latency", shots, ph)
		faultload.Latencies(t, "control", ctl.shots, ph)
	}
}
