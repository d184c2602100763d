package sim_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluice-rl/sluice/aggregator"
	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/pipeline"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

// The simulation's parameters. Time is simulated: requests carry their
// event time (enforcer.Request.Now), the pipeline's watermark follows
// punctuations, and the harness waits for every stage at each step, so the
// run is deterministic and as fast as the machine allows.
const (
	interval = 250 * time.Millisecond // the aggregator's interval (its default)
	limit    = 1000                   // L: the global limit, requests per second for the key
	burst    = 100                    // the rule's burst, split by share as the limit is
	demand   = 2000                   // requests per second over all regions: twice L
	floor    = 0.05                   // the aggregator's default floor
	tol      = 0.05                   // a share is converged within 0.05 of its target
	// shareTTL is the enforcers' ShareTTL: shorter than the default 30 s so
	// that the stale phase is short, longer than the aggregator's 5 s
	// heartbeat so that unchanged shares stay fresh.
	shareTTL = 8 * time.Second
)

// Regions and their one-way delay from the aggregator (Kafka and the merge
// tier run in us-east): 80 to 150 ms round trips between regions.
var (
	regionNames = []string{"us-east", "us-west", "eu-west", "ap-south", "sa-east"}
	wan         = []time.Duration{5 * time.Millisecond, 40 * time.Millisecond, 45 * time.Millisecond, 75 * time.Millisecond, 65 * time.Millisecond}
	t0          = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
)

// phase is a span of simulated time with a fixed demand mix.
type phase struct {
	name     string
	from, to time.Duration
	mix      []float64 // fraction of the demand per region
	lost     int       // a region that makes no request (lost), or -1
	stale    int       // a region whose applier is cut off (its shares go stale), or -1
}

var phases = []phase{
	{"70% in us-east", 0, 10 * time.Second, []float64{0.7, 0.075, 0.075, 0.075, 0.075}, -1, -1},
	{"70% moves to eu-west", 10 * time.Second, 20 * time.Second, []float64{0.075, 0.075, 0.7, 0.075, 0.075}, -1, -1},
	{"eu-west lost (its clients fail over to us-east)", 20 * time.Second, 30 * time.Second, []float64{0.775, 0.075, 0, 0.075, 0.075}, 2, -1},
	{"sa-east's shares go stale (its applier cut off)", 30 * time.Second, 42 * time.Second, []float64{0.775, 0.075, 0, 0.075, 0.075}, 2, 4},
}

// target is the share the aggregator should converge to for a demand mix:
// the floor plus the rest in proportion.
func target(mix []float64) []float64 {
	out := make([]float64, len(mix))
	for i, m := range mix {
		out[i] = floor + (1-float64(len(mix))*floor)*m
	}
	return out
}

// heldStore is the applier's view of its region's Redis with the WAN in
// between: shares the applier writes are held, and the region's enforcer
// takes them (writes them to its Redis and reloads) once the region's
// one-way delay has passed in simulated time. Rules go straight through.
type heldStore struct {
	*store.Store
	mu   sync.Mutex
	held []rules.Share
}

func (h *heldStore) PutShares(_ context.Context, ss []rules.Share) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.held = append(h.held, ss...)
	return nil
}

func (h *heldStore) take() []rules.Share {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := h.held
	h.held = nil
	return out
}

// region is one region: its Redis, enforcer, decision producer and applier,
// and what it allowed, per simulated second.
type region struct {
	i        int
	name     string
	rdb      *redis.Client
	store    *store.Store
	lim      *enforcer.Limiter
	prod     *pipeline.Producer
	app      *pipeline.Applier
	held     *heldStore
	rng      *rand.Rand
	next     time.Duration // the next arrival, from t0
	allowed  []int         // per second
	offered  []int         // per second: requests made
	maxBurst int64         // the largest bucket (burst scaled by the share) it decided with
	// enforced is, per step, the fraction of L the region enforced once
	// that step's shares had reached it: its fresh share, else 1/regions.
	enforced []float64
	tag      string // the key's entity tag under the rule
}

// fraction is the share of the rule the region's enforcer applies at now,
// as enforcer.Limiter.share picks it: the key's fresh share, else the
// rule's fresh default share, else 1/regions. Every decision checks it
// against the enforcer's bucket.
func (r *region) fraction(rule *rules.Rule, now time.Time) float64 {
	sh := r.lim.Control().Shares
	for _, k := range []string{rule.ID + "|" + r.tag, rule.ID + "|"} {
		if s, ok := sh[k]; ok && now.Sub(s.ComputedAt).Abs() <= shareTTL {
			return s.Fraction
		}
	}
	return 1 / float64(len(regionNames))
}

// recorder keeps every share the merge tier publishes, with the simulated
// time of publication.
type recorder struct {
	w   stage.Writer
	now *atomic.Int64 // simulated ms
	mu  sync.Mutex
	log []published
}

type published struct {
	at time.Time
	s  rules.Share
}

func (r *recorder) Write(ctx context.Context, o stage.Output) error {
	if err := r.w.Write(ctx, o); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	at := time.UnixMilli(r.now.Load()).UTC()
	for _, s := range o.Shares {
		r.log = append(r.log, published{at: at, s: s})
	}
	return nil
}

// TestGlobalQuotaSimulation runs the simulation and checks the targets of
// issue 8 that are properties of the run (none is a timing): the global
// allowed count in steady state within 1% of what the shares allow, shares
// converged within 2 intervals of a demand shift, no region with demand held
// below its floor, a lost region's share reclaimed within 5 intervals, the
// measured overshoot within the theoretical bound, a stale region's excess
// within its bound, and every region's Redis holding its own shares only. It
// logs the report recorded in docs/benchmarks.md.
//
// It runs twice: with the pipeline's lateness at sluice pipeline's default
// (1 s) and at one interval (250 ms), which shortens the delay before
// shares are enforced.
func TestGlobalQuotaSimulation(t *testing.T) {
	for _, lateness := range []time.Duration{time.Second, interval} {
		t.Run("lateness="+lateness.String(), func(t *testing.T) {
			rep := simulate(t, lateness)
			t.Log("\n" + rep.String())
			rep.check(t)
		})
	}
}

// simulate runs the simulation with the pipeline's lateness and returns its
// report.
func simulate(t *testing.T, lateness time.Duration) *report {
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	set, err := rules.Parse("sim.yaml", []byte(fmt.Sprintf(`
domain: sim
rules: [{id: per-key, match: [{key: api_key}], limit: %d, period: 1s, burst: %d, global: true}]`, limit, burst)))
	if err != nil {
		t.Fatal(err)
	}
	rule := set.Rule("per-key")
	const key = "key-hot"
	tag := rules.EntityTag(rule, &rules.Descriptors{rules.KeyAPIKey: key})

	// Kafka: the decision topic with 2 partitions, and the pipeline's.
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, pipeline.DefaultTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	brokers := kc.ListenAddrs()

	var simNow atomic.Int64
	tw, err := pipeline.NewTopicWriter(pipeline.TopicWriterOptions{Brokers: brokers, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tw.Close)
	rec := &recorder{w: tw, now: &simNow}
	shares, err := aggregator.New(aggregator.Options{Regions: regionNames, Rules: set.Rules, Interval: interval, Floor: floor})
	if err != nil {
		t.Fatal(err)
	}
	po := pipeline.Options{Brokers: brokers, Group: "sim", Lateness: lateness, Logger: log, Writer: rec,
		Stages:         []stage.Stage{shares},
		CommitInterval: 100 * time.Millisecond, CheckpointInterval: time.Second,
		// Simulated time: no Kafka timestamp bounds it, and every partition
		// is punctuated at each step.
		MaxFuture: -1, IdleTimeout: 24 * time.Hour}
	ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = pipeline.EnsureTopics(ectx, po, 0)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	pl, err := pipeline.New(po)
	if err != nil {
		t.Fatal(err)
	}
	pctx, stop := context.WithCancel(ctx)
	pl.Start(pctx)
	t.Cleanup(func() { stop(); pl.Close() })
	punct, err := pipeline.NewPunctuator(brokers, pipeline.DefaultTopic)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(punct.Close)
	admCl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admCl.Close)
	adm := kadm.NewClient(admCl)

	// The regions: each a redis-server, an enforcer, a producer, an applier.
	total := phases[len(phases)-1].to
	seconds := int(total / time.Second)
	regs := make([]*region, len(regionNames))
	for i, name := range regionNames {
		r := &region{i: i, name: name, rdb: redistest.Server(t), rng: rand.New(rand.NewPCG(uint64(i), 8)),
			allowed: make([]int, seconds), offered: make([]int, seconds), tag: tag}
		r.store = store.NewStore(r.rdb)
		r.held = &heldStore{Store: r.store}
		if r.prod, err = pipeline.NewProducer(pipeline.ProducerOptions{Brokers: brokers, Logger: log}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.prod.Close)
		// Every decision goes to Redis: no lease or deny cache, whose
		// wall-clock TTLs have no meaning on simulated time.
		r.lim, err = enforcer.New(r.rdb, set, enforcer.Options{Region: name, Instance: "sim-0", Regions: len(regionNames),
			Sink: r.prod, Logger: log, Budget: 5 * time.Second, HotKeys: enforcer.HotKeyOptions{Table: -1, Rate: -1, LeaseBlock: -1}, ShareTTL: shareTTL})
		if err != nil {
			t.Fatal(err)
		}
		if r.app, err = pipeline.NewApplier(pipeline.ApplierOptions{Brokers: brokers, Region: name, Store: r.held, Logger: log,
			Now: func() time.Time { return time.UnixMilli(simNow.Load()) }}); err != nil {
			t.Fatal(err)
		}
		go func() { _ = r.app.Run(pctx) }()
		t.Cleanup(r.app.Close)
		regs[i] = r
	}

	// The run: one step per interval.
	var puncts int64
	start := time.Now()
	for k := range int(total / interval) {
		T := t0.Add(time.Duration(k) * interval)
		ph := phaseAt(T.Sub(t0))
		var wg sync.WaitGroup
		errs := make([]error, len(regs))
		for i, r := range regs {
			pending := r.held.take() // published at T, in force at T + the region's delay
			if ph.stale == i {
				pending = nil // its applier is cut off
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = r.step(ctx, T, ph, pending, rule, key)
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		end := T.Add(interval)
		simNow.Store(end.UnixMilli())
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		var produced int64
		for _, r := range regs {
			if err := r.prod.Flush(sctx); err != nil {
				t.Fatal(err)
			}
			st := r.prod.Stats()
			if st.Dropped+st.Failed > 0 {
				t.Fatalf("region %s: decision records dropped or failed: %+v", r.name, st)
			}
			produced += st.Produced
		}
		n, err := punct.Punctuate(sctx, end.Add(-lateness))
		if err != nil {
			t.Fatal(err)
		}
		puncts += int64(n)
		if err := pl.Sync(sctx, produced+puncts); err != nil {
			t.Fatal(err)
		}
		if err := waitAppliers(sctx, adm, regs); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	elapsed := time.Since(start)

	// Each region's Redis holds its own shares only: no applier wrote
	// another region's.
	for _, r := range regs {
		ctl, err := r.store.Load(ctx, t0.Add(total))
		if err != nil {
			t.Fatal(err)
		}
		if len(ctl.Shares) == 0 {
			t.Errorf("region %s: no share in its Redis", r.name)
		}
		for k, sh := range ctl.Shares {
			if sh.Region != r.name {
				t.Errorf("region %s's Redis holds %s's share %s", r.name, sh.Region, k)
			}
		}
	}

	rec.mu.Lock()
	pubs := slices.Clone(rec.log)
	rec.mu.Unlock()
	rep := analyse(t, regs, pubs, tag)
	rep.elapsed, rep.lateness = elapsed, lateness
	return rep
}

func phaseAt(d time.Duration) phase {
	for _, p := range phases {
		if d >= p.from && d < p.to {
			return p
		}
	}
	return phases[len(phases)-1]
}

// step makes the region's requests for the interval from T: Poisson
// arrivals at the region's part of the demand. The shares published at T
// reach the region at T + its delay, when its enforcer writes them to its
// Redis and reloads.
func (r *region) step(ctx context.Context, T time.Time, ph phase, pending []rules.Share, rule *rules.Rule, key string) error {
	arrive := T.Add(wan[r.i])
	applied := false
	apply := func() error {
		applied = true
		if len(pending) > 0 {
			if err := r.store.PutShares(ctx, pending); err != nil {
				return err
			}
		}
		return r.lim.Refresh(ctx, arrive)
	}
	defer func() { r.enforced = append(r.enforced, r.fraction(rule, T.Add(interval/2))) }()
	end := T.Add(interval).Sub(t0)
	rate := float64(demand) * ph.mix[r.i] // per second
	if ph.lost == r.i || rate == 0 {
		r.next = end // no request; the next phase starts afresh
		return apply()
	}
	if r.next < T.Sub(t0) {
		r.next = T.Sub(t0) + time.Duration(r.rng.ExpFloat64()/rate*float64(time.Second))
	}
	req := &enforcer.Request{}
	req.Descriptors[rules.KeyAPIKey] = key
	var d enforcer.Decision
	for ; r.next < end; r.next += time.Duration(r.rng.ExpFloat64() / rate * float64(time.Second)) {
		now := t0.Add(r.next)
		if !applied && !now.Before(arrive) {
			if err := apply(); err != nil {
				return err
			}
		}
		req.Now = now
		if err := r.lim.Decide(ctx, req, &d); err != nil {
			return err
		}
		if d.Err != nil {
			return fmt.Errorf("region %s: %v", r.name, d.Err)
		}
		sec := int(r.next / time.Second)
		r.offered[sec]++
		if d.Outcome == decision.Allowed {
			r.allowed[sec]++
		}
		if len(d.Statuses) != 1 {
			return fmt.Errorf("region %s: %d rules decided, want 1", r.name, len(d.Statuses))
		}
		b := d.Statuses[0].Limit
		if want := max(1, int64(math.Floor(burst*r.fraction(rule, now)+1e-9))); b != want {
			return fmt.Errorf("region %s at %v: the enforcer's bucket holds %d, the share in force %v gives %d", r.name, now.Sub(t0), b, r.fraction(rule, now), want)
		}
		r.maxBurst = max(r.maxBurst, b)
	}
	if !applied {
		return apply()
	}
	return nil
}

// waitAppliers waits until every region's applier has read the whole
// output topic.
func waitAppliers(ctx context.Context, adm *kadm.Client, regs []*region) error {
	ends, err := adm.ListEndOffsets(ctx, pipeline.DefaultOutputTopic)
	if err != nil {
		return err
	}
	var want int64
	ends.Each(func(o kadm.ListedOffset) { want += o.Offset })
	for _, r := range regs {
		for {
			s := r.app.Stats()
			if s.RulesApplied+s.RulesExpired+s.RulesKilled+s.RulesRefused+s.SharesApplied+s.SharesOtherRegion+s.Bad >= want {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("region %s: applier behind the output topic's %d records: %w", r.name, want, ctx.Err())
			case <-time.After(time.Millisecond):
			}
		}
	}
	return nil
}

// report is what the simulation measured.
type report struct {
	global      []int // allowed over all regions, per second
	ceiling     []float64
	steady      []bool
	overshoot   int // largest excess of a second's global allowed over L
	overshootAt int
	bound       int64 // sum over regions of the largest bucket each decided with
	naive       int64 // regions x the rule's burst
	worstSteady float64
	starved     []string
	minFloorPct float64 // least allowed/min(offered, floor*L) over region-seconds with demand
	shifts      []shift
	reclaim     int // intervals until the lost region was at its floor and the others had the rest
	elapsed     time.Duration
	lateness    time.Duration
	requests    int
	// steadyMean is, per phase, the mean global allowed over its steady
	// seconds, as a fraction of what the shares allow off the ceiling.
	steadyMean []float64
	// skew: while a new set of shares reaches the regions one after the
	// other (their WAN delays differ), each region enforces the old or the
	// new share; skewSum is the largest sum this mix can reach, and
	// skewExtra the requests it could let through beyond L in the longest
	// gap between two regions' arrivals.
	skewSum   float64
	skewExtra float64
	// shareSum is the largest sum of the fractions the regions enforced,
	// averaged over a second: above 1 while a region's shares are stale.
	shareSum float64
	// staleAt is the second a stale region first enforced the static
	// split; staleBound the most that costs, (1/regions - its last
	// share) x L.
	staleAt    int
	staleBound float64
}

// staleOnset is the second in phase ph from which the region enforced the
// static split (its shares stale), or a second past the phase.
func staleOnset(r *region, ph phase) int {
	static := 1 / float64(len(regionNames))
	for k := int(ph.from / interval); k < int(ph.to/interval); k++ {
		if r.enforced[k] == static {
			return int(time.Duration(k) * interval / time.Second)
		}
	}
	return int(ph.to / time.Second)
}

type shift struct {
	name     string
	computed int           // intervals until the computed shares were converged for good
	applied  time.Duration // from the shift until every region enforced converged shares
}

// analyse turns the per-second counts and the published shares into the
// report.
func analyse(t *testing.T, regs []*region, log []published, tag string) *report {
	seconds := len(regs[0].allowed)
	rep := &report{global: make([]int, seconds), ceiling: make([]float64, seconds), steady: make([]bool, seconds), overshoot: math.MinInt}
	for s := range seconds {
		ph := phaseAt(time.Duration(s) * time.Second)
		for _, r := range regs {
			rep.global[s] += r.allowed[s]
			rep.requests += r.offered[s]
		}
		// What the shares allow: each region's enforced fraction of L
		// (averaged over the second), or its demand if smaller (a lost
		// region's floor goes unused; so does a stale region's static
		// split beyond its demand).
		steps := int(time.Second / interval)
		sum := 0.0
		for _, r := range regs {
			f := 0.0
			for _, x := range r.enforced[s*steps : (s+1)*steps] {
				f += x / float64(steps)
			}
			sum += f
			rep.ceiling[s] += min(float64(r.offered[s]), limit*f)
		}
		rep.shareSum = max(rep.shareSum, sum)
		// Steady: two seconds after a shift (converged shares, published
		// a lateness after their interval, reach every region), and after
		// a stale region fell back to the static split.
		rep.steady[s] = time.Duration(s)*time.Second-ph.from >= 2*time.Second
		if ph.stale >= 0 {
			onset := staleOnset(regs[ph.stale], ph)
			rep.staleAt = onset
			rep.steady[s] = rep.steady[s] && (s < onset || s >= onset+2)
		}
		if x := rep.global[s] - limit; x > rep.overshoot {
			rep.overshoot, rep.overshootAt = x, s
		}
		if rep.steady[s] {
			rep.worstSteady = max(rep.worstSteady, math.Abs(float64(rep.global[s])-rep.ceiling[s])/limit)
		}
	}
	for _, ph := range phases {
		sum, n := 0.0, 0
		for sec := range seconds {
			if rep.steady[sec] && phaseAt(time.Duration(sec)*time.Second).name == ph.name {
				sum += float64(rep.global[sec]) - rep.ceiling[sec]
				n++
			}
		}
		rep.steadyMean = append(rep.steadyMean, sum/float64(max(n, 1))/limit)
	}
	rep.naive = int64(len(regs)) * burst
	// Stale: the static split against the stale region's last share.
	for _, ph := range phases {
		if ph.stale >= 0 {
			r := regs[ph.stale]
			last := r.enforced[int(ph.from/interval)]
			rep.staleBound = (1/float64(len(regs)) - last) * limit
		}
	}
	for _, r := range regs {
		rep.bound += r.maxBurst
	}
	// Starvation: a region with demand allowed less than its floor of L
	// (or its demand, if smaller) in a second, beyond one floor-sized
	// bucket and rounding.
	rep.minFloorPct = math.Inf(1)
	slack := floor*burst + 2
	for _, r := range regs {
		for s := 1; s < seconds; s++ {
			if r.offered[s] == 0 {
				continue
			}
			want := min(float64(r.offered[s]), floor*limit)
			rep.minFloorPct = min(rep.minFloorPct, float64(r.allowed[s])/want)
			if float64(r.allowed[s]) < want-slack {
				rep.starved = append(rep.starved, fmt.Sprintf("%s in second %d: %d allowed of %d offered", r.name, s, r.allowed[s], r.offered[s]))
			}
		}
	}

	// The computed shares in force at each interval's end: the newest set
	// written for the key at or before it.
	var byEnd []time.Time
	sets := map[time.Time][]float64{}
	for _, p := range log {
		if p.s.Key != tag {
			continue
		}
		at := p.s.ComputedAt.UTC()
		f := sets[at]
		if f == nil {
			f = make([]float64, len(regs))
			sets[at] = f
			byEnd = append(byEnd, at)
		}
		f[slices.Index(regionNames, p.s.Region)] = p.s.Fraction
	}
	slices.SortFunc(byEnd, func(a, b time.Time) int { return a.Compare(b) })
	inForce := func(e time.Time) []float64 {
		var f []float64
		for _, at := range byEnd {
			if at.After(e) {
				break
			}
			f = sets[at]
		}
		return f
	}
	rep.skewSum = 1
	for i := 1; i < len(byEnd); i++ {
		old, cur := sets[byEnd[i-1]], sets[byEnd[i]]
		sum := 0.0
		for j := range cur {
			sum += max(old[j], cur[j])
		}
		rep.skewSum = max(rep.skewSum, sum)
	}
	rep.skewExtra = (rep.skewSum - 1) * limit * (slices.Max(wan) - slices.Min(wan)).Seconds()
	published := map[time.Time]time.Time{} // computed at -> published at
	for _, p := range log {
		published[p.s.ComputedAt.UTC()] = p.at
	}
	maxWAN := slices.Max(wan)
	for pi, ph := range phases[1:] {
		if slices.Equal(ph.mix, phases[pi].mix) {
			continue // no demand shift
		}
		sh := shift{name: ph.name, computed: -1}
		want := target(ph.mix)
		n := int((ph.to - ph.from) / interval)
		for k := 1; k <= n; k++ {
			ok := true
			for j := k; j <= n && ok; j++ { // converged for the rest of the phase
				f := inForce(t0.Add(ph.from + time.Duration(j)*interval))
				for i := range want {
					ok = ok && f != nil && math.Abs(f[i]-want[i]) <= tol
				}
			}
			if ok {
				sh.computed = k
				// The set in force at that end was published at some step,
				// and reached the farthest region its delay later.
				e := t0.Add(ph.from + time.Duration(k)*interval)
				var pub time.Time
				for _, at := range byEnd {
					if !at.After(e) {
						pub = published[at]
					}
				}
				sh.applied = max(pub.Add(maxWAN).Sub(t0.Add(ph.from)), 0)
				break
			}
		}
		rep.shifts = append(rep.shifts, sh)
		if ph.lost >= 0 {
			rep.reclaim = -1
			for k := 1; k <= n; k++ {
				f := inForce(t0.Add(ph.from + time.Duration(k)*interval))
				if f == nil {
					continue
				}
				others := 0.0
				for i, x := range f {
					if i != ph.lost {
						others += x
					}
				}
				if f[ph.lost] <= floor+1e-9 && others >= 1-floor-1e-9 {
					rep.reclaim = k
					break
				}
			}
		}
	}
	if len(byEnd) == 0 {
		t.Fatal("no share of the hot key was published")
	}
	return rep
}

func (rep *report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "global quota simulation: %d regions, L = %d/s, burst %d, demand %d/s, interval %v, lateness %v, WAN one-way %v\n",
		len(regionNames), limit, burst, demand, interval, rep.lateness, wan)
	fmt.Fprintf(&b, "%d requests over %d simulated seconds in %v of wall time\n\n", rep.requests, len(rep.global), rep.elapsed.Round(time.Millisecond))
	fmt.Fprintf(&b, "| second | phase | global allowed | ceiling (what the shares allow) | vs ceiling, in %% of L |\n|---|---|---|---|---|\n")
	for s, g := range rep.global {
		mark := ""
		if rep.steady[s] {
			mark = " (steady)"
		}
		fmt.Fprintf(&b, "| %d | %s%s | %d | %.0f | %+.1f%% |\n", s, phaseAt(time.Duration(s)*time.Second).name, mark, g, rep.ceiling[s], 100*(float64(g)-rep.ceiling[s])/limit)
	}
	fmt.Fprintf(&b, "\n| measure | value | target |\n|---|---|---|\n")
	for i, ph := range phases {
		fmt.Fprintf(&b, "| steady-state global allowed, %q: mean of the steady seconds vs the ceiling | %+.2f%% of L | within 1%% |\n", ph.name, 100*rep.steadyMean[i])
	}
	fmt.Fprintf(&b, "| ... worst single steady second (a second's count also carries the buckets' levels at its edges) | %.2f%% of L | |\n", 100*rep.worstSteady)
	fmt.Fprintf(&b, "| overshoot, largest excess of a second over L | %d (%.1f%% of L, second %d) | within the bound (%.0f) |\n", rep.overshoot, 100*float64(rep.overshoot)/limit, rep.overshootAt, float64(rep.bound)+rep.skewExtra+rep.staleBound)
	fmt.Fprintf(&b, "| theoretical bound: regions x per-region burst (largest bucket each region held) + WAN skew + stale split | %d + %.1f + %.1f (naive %d x %d = %d) | |\n", rep.bound, rep.skewExtra, rep.staleBound, len(regionNames), burst, rep.naive)
	fmt.Fprintf(&b, "| WAN skew: largest sum of old and new shares while a set reaches the regions | %.3f (at most %.1f requests beyond L in the %v spread of delays) | |\n", rep.skewSum, rep.skewExtra, slices.Max(wan)-slices.Min(wan))
	fmt.Fprintf(&b, "| stale shares: the stale region on the static split from second %d; largest sum of enforced fractions (per-second mean) | %.3f (bound (1/regions - its last share) x L = %.1f per second) | |\n", rep.staleAt, rep.shareSum, rep.staleBound)
	for _, sh := range rep.shifts {
		fmt.Fprintf(&b, "| convergence after %q: computed shares | %d intervals | within 2 |\n", sh.name, sh.computed)
		fmt.Fprintf(&b, "| ... enforced in every region (+ lateness, WAN) | %v (%.1f intervals) | |\n", sh.applied, float64(sh.applied)/float64(interval))
	}
	fmt.Fprintf(&b, "| lost region's share reclaimed (at its floor, the others the rest) | %d intervals | within 5 |\n", rep.reclaim)
	fmt.Fprintf(&b, "| starvation: region-seconds with demand below their floor | %d (least allowed / min(demand, floor x L): %.2f) | 0 |\n", len(rep.starved), rep.minFloorPct)
	return b.String()
}

func (rep *report) check(t *testing.T) {
	t.Helper()
	for i, m := range rep.steadyMean {
		if math.Abs(m) > 0.01 {
			t.Errorf("phase %q: steady-state global allowed off the ceiling by %.2f%% of L, want within 1%%", phases[i].name, 100*m)
		}
	}
	if float64(rep.overshoot) > float64(rep.bound)+rep.skewExtra+rep.staleBound {
		t.Errorf("overshoot %d above the bound %d + %.1f + %.1f", rep.overshoot, rep.bound, rep.skewExtra, rep.staleBound)
	}
	if rep.shareSum > 1+rep.staleBound/limit+1e-9 {
		t.Errorf("the regions enforced fractions summing to %.4f, more than 1 + the stale region's excess %.4f", rep.shareSum, rep.staleBound/limit)
	}
	for _, sh := range rep.shifts {
		if sh.computed < 1 || sh.computed > 2 {
			t.Errorf("after %q the shares converged in %d intervals (-1: never), want within 2", sh.name, sh.computed)
		}
	}
	if rep.reclaim < 1 || rep.reclaim > 5 {
		t.Errorf("the lost region's share reclaimed in %d intervals (-1: never), want within 5", rep.reclaim)
	}
	if len(rep.starved) > 0 {
		t.Errorf("regions with demand held below their floor: %v", rep.starved)
	}
}
