package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

// RegionStore is what an Applier needs of its region's rule store;
// *store.Store has it.
type RegionStore interface {
	PutDynamic(ctx context.Context, now time.Time, rs []rules.Rule) (int, error)
	PutShares(ctx context.Context, ss []rules.Share) error
	Killed(ctx context.Context) (bool, string, error)
	// Applied and MarkApplied keep a mark in the region's Redis: gone, the
	// Redis restarted empty and the applier reads its topic again.
	Applied(ctx context.Context) (bool, error)
	MarkApplied(ctx context.Context) error
}

// ApplierOptions configure an Applier.
type ApplierOptions struct {
	Brokers []string // required
	// Topic is the output topic; default DefaultOutputTopic.
	Topic string
	// Region is the region whose shares are applied (required, a valid
	// rules id such as "eu-west"). Shares of other regions are skipped.
	Region string
	// Group is the consumer group; default "sluice-apply-" + Region. Each
	// region needs its own: every region reads every record.
	Group string
	// Store is the region's rule store (required).
	Store RegionStore
	// Now is the clock dynamic rules' expiries are checked against: an
	// expired rule is skipped (and counted) rather than written. Default
	// time.Now.
	Now func() time.Time
	// RetryMax caps the backoff between attempts to write to a failing
	// Redis (from 100 ms, doubling). Default 5 s.
	RetryMax time.Duration
	// MarkEvery is how often the applier checks that its region's Redis
	// still holds its mark (store.AppliedKey). A Redis that restarted empty
	// lost every dynamic rule and share applied to it, which the committed
	// offsets would never bring back: the applier then reads the output
	// topic again from its start (compacted, it holds the newest record of
	// each rule and share) and sets the mark. Default 5 s.
	MarkEvery time.Duration

	Logger     *slog.Logger          // default slog.Default()
	Registerer prometheus.Registerer // nil registers no metrics
}

func (o *ApplierOptions) defaults() error {
	if len(o.Brokers) == 0 {
		return errors.New("pipeline: no Kafka brokers")
	}
	if !rules.ValidID(o.Region) {
		return fmt.Errorf("pipeline: region %q: want 1-64 characters of A-Z a-z 0-9 _ . -", o.Region)
	}
	if o.MarkEvery <= 0 {
		o.MarkEvery = 5 * time.Second
	}
	if o.Store == nil {
		return fmt.Errorf("pipeline: the applier of region %s needs its rule store", o.Region)
	}
	if o.Topic == "" {
		o.Topic = DefaultOutputTopic
	}
	if o.Group == "" {
		o.Group = "sluice-apply-" + o.Region
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.RetryMax <= 0 {
		o.RetryMax = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return nil
}

// Results of output records in an Applier, the result label of
// sluice_apply_records_total.
const (
	applyApplied     = "applied"      // written to the region's Redis
	applyExpired     = "expired"      // a rule that had expired when read
	applyKilled      = "killed"       // a rule read while the kill switch was on
	applyRefused     = "refused"      // a rule the store refused: the cap, or invalid
	applyOtherRegion = "other_region" // another region's share
)

// Applier applies the output topic to one region's Redis: every dynamic
// rule (Store.PutDynamic), and the shares of its region (Store.PutShares).
// It is a consumer group of its own per region ("sluice-apply-<region>"),
// which reads the topic from its start the first time (a compacted topic
// holds the newest record of every rule and share), so a new region gets
// the rules in force.
//
// Offsets are committed only after Redis took every record before them; while
// Redis fails, the Applier retries with backoff (100 ms up to RetryMax) and
// reads no further. Records are applied in offset order, and applying one
// again gives the same state (a rule or share is an overwrite by key), so a
// restart after a crash, which reads again from the last commit, converges
// to the same result. It writes to its own region's store only.
//
// While the kill switch is on (Store.Killed), rules are skipped, logged and
// counted (result "killed"), not written; shares are still written. Rules
// the store refuses (its cap on active dynamic rules, or invalid) and rules
// already expired are counted and skipped. Records that do not decode are
// logged, counted and skipped.
//
// Build one with NewApplier, call Run, then Close. Stats is safe to call
// from any goroutine.
type Applier struct {
	o  ApplierOptions
	cl *kgo.Client
	m  *applyMetrics

	mu  sync.Mutex
	hwm map[int32]int64 // per partition: the high watermark last fetched
	pos map[int32]int64 // per partition: the next offset to apply

	yield  atomic.Bool // a rebalance waits: stop retrying
	stop   context.Context
	cancel context.CancelFunc
	closed sync.Once
}

// NewApplier creates the client; Run joins the group.
func NewApplier(o ApplierOptions) (*Applier, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	m, err := newApplyMetrics(o.Registerer, o.Region)
	if err != nil {
		return nil, err
	}
	a := &Applier{o: o, m: m, hwm: map[int32]int64{}, pos: map[int32]int64{}}
	a.stop, a.cancel = context.WithCancel(context.Background())
	if o.Registerer != nil {
		err := o.Registerer.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_apply_lag_records", Help: "Records of the output topic not yet applied to this region's Redis.",
			ConstLabels: prometheus.Labels{"region": o.Region},
		}, a.lag))
		if err != nil {
			return nil, fmt.Errorf("pipeline: registering metrics: %w", err)
		}
	}
	cl, err := kgo.NewClient(ApplyGroupOpts(o.Brokers, o.Group, []string{o.Topic}, &a.yield)...)
	if err != nil {
		return nil, fmt.Errorf("pipeline: kafka applier: %w", err)
	}
	a.cl = cl
	return a, nil
}

// ApplierStats count what an Applier has done since it started.
type ApplierStats struct {
	RulesApplied, RulesExpired, RulesKilled, RulesRefused int64
	SharesApplied, SharesOtherRegion                      int64
	// Bad counts records that did not decode.
	Bad int64
	// RuleFailures and ShareFailures count failed writes to Redis (each
	// retried).
	RuleFailures, ShareFailures int64
}

// Stats returns the applier's counters.
func (a *Applier) Stats() ApplierStats {
	r, s := a.m.records[KindRule], a.m.records[KindShare]
	return ApplierStats{
		RulesApplied: r[applyApplied].Value(), RulesExpired: r[applyExpired].Value(),
		RulesKilled: r[applyKilled].Value(), RulesRefused: r[applyRefused].Value(),
		SharesApplied: s[applyApplied].Value(), SharesOtherRegion: s[applyOtherRegion].Value(),
		Bad:          a.m.bad.Value(),
		RuleFailures: a.m.failures[KindRule].Value(), ShareFailures: a.m.failures[KindShare].Value(),
	}
}

func (a *Applier) lag() float64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var n int64
	for p, h := range a.hwm {
		n += max(0, h-a.pos[p])
	}
	return float64(n)
}

// Run applies records until ctx ends or the applier is closed, and returns
// nil then; it returns the error if Kafka refuses it for good
// (FatalFetchError).
func (a *Applier) Run(ctx context.Context) error {
	var checked time.Time
	for {
		fs, ok, err := Poll(ctx, a.cl, 10_000, a.o.Logger)
		if !ok {
			a.cl.AllowRebalance()
			return err
		}
		var recs []*kgo.Record
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			a.mu.Lock()
			a.hwm[p.Partition] = p.HighWatermark
			a.mu.Unlock()
			recs = append(recs, p.Records...)
		})
		if time.Since(checked) >= a.o.MarkEvery {
			checked = time.Now()
			if a.rewound(ctx) {
				recs = nil // read again from the start
			}
		}
		if len(recs) > 0 && a.apply(ctx, recs) {
			a.commit(ctx, recs)
		}
		a.cl.AllowRebalance()
		a.yield.Store(false)
	}
}

// rewound reads the output topic again from its start when the region's
// Redis lost its mark (store.AppliedKey; see rewindIfLost), and reports
// whether it did.
func (a *Applier) rewound(ctx context.Context) bool {
	np, ok := RewindIfLost(ctx, a.cl, a.o.Topic, a.o.Store.Applied, a.o.Store.MarkApplied)
	if !ok {
		return false
	}
	a.mu.Lock()
	for p := range np {
		if _, ok := a.pos[p]; ok {
			a.pos[p] = 0
		}
	}
	a.mu.Unlock()
	a.m.rewinds.Inc()
	a.o.Logger.Warn("the region's Redis lost what was applied to it (it restarted empty?): reading the output topic again from its start",
		"region", a.o.Region, "topic", a.o.Topic)
	return true
}

// commit commits past recs, which Redis has taken. A failed commit is
// logged and counted: the next one covers it, and a restart applies the
// records again.
func (a *Applier) commit(ctx context.Context, recs []*kgo.Record) {
	// Committing what was applied is worth doing on shutdown too.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := a.cl.CommitRecords(cctx, recs...); err != nil {
		a.m.commitErrors.Inc()
		a.o.Logger.Warn("committing applied output failed; a restart applies it again", "region", a.o.Region, "err", err)
		return
	}
	a.mu.Lock()
	for _, r := range recs {
		a.pos[r.Partition] = max(a.pos[r.Partition], r.Offset+1)
	}
	a.mu.Unlock()
}

// apply writes one poll's records to the region's Redis; false if it
// stopped first (ctx ended, Close, or a rebalance waits), in which case
// nothing may be committed.
func (a *Applier) apply(ctx context.Context, recs []*kgo.Record) bool {
	var rs []rules.Rule
	var ss []rules.Share
	var published []time.Time // of the records applied, for the delay
	for _, rec := range recs {
		or, err := DecodeOutputRecord(rec.Key, rec.Value)
		if err != nil {
			a.m.bad.Inc()
			a.o.Logger.Warn("skipping an output record that does not decode", "region", a.o.Region,
				"partition", rec.Partition, "offset", rec.Offset, "err", err)
			continue
		}
		switch or.Kind {
		case KindRule:
			rs = append(rs, *or.Rule)
		case KindShare:
			if or.Share.Region != a.o.Region {
				a.m.records[KindShare][applyOtherRegion].Inc()
				continue
			}
			ss = append(ss, *or.Share)
		}
		published = append(published, rec.Timestamp)
	}
	if len(ss) > 0 {
		if !a.retry(ctx, KindShare, func(ctx context.Context) error { return a.o.Store.PutShares(ctx, ss) }) {
			return false
		}
		a.m.records[KindShare][applyApplied].Add(int64(len(ss)))
	}
	if now := a.o.Now(); len(rs) > 0 {
		live := rs[:0]
		for _, r := range rs {
			if !now.IsZero() && !r.ExpiresAt.IsZero() && !now.Before(r.ExpiresAt) {
				a.m.records[KindRule][applyExpired].Inc()
				continue
			}
			live = append(live, r)
		}
		if !a.applyRules(ctx, now, live) {
			return false
		}
	}
	t := time.Now()
	for _, p := range published {
		a.m.delay.Observe(max(0, t.Sub(p).Seconds()))
	}
	return true
}

// applyRules writes live rules unless the kill switch is on; false if it
// stopped first.
func (a *Applier) applyRules(ctx context.Context, now time.Time, rs []rules.Rule) bool {
	if len(rs) == 0 {
		return true
	}
	var killed bool
	var why string
	if !a.retry(ctx, KindRule, func(ctx context.Context) (err error) {
		killed, why, err = a.o.Store.Killed(ctx)
		return err
	}) {
		return false
	}
	if killed {
		a.m.records[KindRule][applyKilled].Add(int64(len(rs)))
		a.o.Logger.Warn("the dynamic-rule kill switch is on: skipping rules", "region", a.o.Region, "rules", len(rs), "why", why)
		return true
	}
	var applied, refused int
	if !a.retry(ctx, KindRule, func(ctx context.Context) (err error) {
		applied, refused, err = a.putRules(ctx, now, rs)
		return err
	}) {
		return false
	}
	a.m.records[KindRule][applyApplied].Add(int64(applied))
	a.m.records[KindRule][applyRefused].Add(int64(refused))
	return true
}

// refusal reports whether err is the store refusing rules rather than
// failing to reach Redis.
func refusal(err error) bool {
	return errors.Is(err, store.ErrCapReached) || errors.Is(err, rules.ErrInvalidRule) ||
		errors.Is(err, rules.ErrNoExpiry) || errors.Is(err, rules.ErrExpiryTooFar)
}

// putRules writes rs in one step; when the store refuses them as invalid
// (which refuses the whole step), it writes them one at a time to keep the
// valid ones. It returns how many were written and refused; an error is
// Redis failing (retry).
func (a *Applier) putRules(ctx context.Context, now time.Time, rs []rules.Rule) (applied, refused int, err error) {
	n, err := a.o.Store.PutDynamic(ctx, now, rs)
	switch {
	case err == nil:
		return n, 0, nil
	case errors.Is(err, store.ErrCapReached):
		a.o.Logger.Warn("the dynamic-rule cap refused rules", "region", a.o.Region, "err", err)
		return n, len(rs) - n, nil
	case !refusal(err):
		return 0, 0, err
	}
	for i := range rs {
		n, err := a.o.Store.PutDynamic(ctx, now, rs[i:i+1])
		switch {
		case err == nil:
			applied += n
		case refusal(err):
			refused++
			a.o.Logger.Warn("the store refused a rule", "region", a.o.Region, "rule", rs[i].ID, "err", err)
		default:
			return 0, 0, err
		}
	}
	return applied, refused, nil
}

// retry runs fn with backoff until it succeeds; false if the applier
// stopped first (ctx ended, Close, or a rebalance waits).
func (a *Applier) retry(ctx context.Context, kind Kind, fn func(context.Context) error) bool {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(a.stop, cancel)()
	_, err := backoff.Retry(rctx, func() (struct{}, error) {
		if a.yield.Load() {
			return struct{}{}, backoff.Permanent(errors.New("a rebalance waits"))
		}
		err := fn(rctx)
		if err != nil && rctx.Err() == nil {
			a.m.failures[kind].Inc()
			a.o.Logger.Warn("writing to the region's Redis failed; retrying", "region", a.o.Region, "kind", kind, "err", err)
		}
		return struct{}{}, err
	}, backoff.WithBackOff(&backoff.ExponentialBackOff{InitialInterval: 100 * time.Millisecond, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: a.o.RetryMax}),
		backoff.WithMaxElapsedTime(0))
	return err == nil
}

// Close stops a write in progress, leaves the group and closes the client;
// Run returns. What was applied has been committed. Safe to call twice.
func (a *Applier) Close() {
	a.closed.Do(func() {
		a.yield.Store(true)
		a.cancel()
		a.cl.Close()
	})
}

// applyMetrics are an Applier's counters.
type applyMetrics struct {
	records      map[Kind]map[string]*Counter // by kind, by result
	failures     map[Kind]*Counter
	bad          *Counter
	commitErrors *Counter
	rewinds      *Counter
	delay        prometheus.Observer
}

func newApplyMetrics(reg prometheus.Registerer, region string) (*applyMetrics, error) {
	r := &Registry{reg: reg}
	m := &applyMetrics{records: map[Kind]map[string]*Counter{}, failures: map[Kind]*Counter{}}
	results := map[Kind][]string{
		KindRule:  {applyApplied, applyExpired, applyKilled, applyRefused},
		KindShare: {applyApplied, applyOtherRegion},
	}
	for kind, rs := range results {
		m.records[kind] = map[string]*Counter{}
		for _, res := range rs {
			m.records[kind][res] = r.Counter("sluice_apply_records_total",
				"Output records read by the region's applier, by kind (rule, share) and result: applied; expired, killed (the kill switch was on), refused (the store's cap, or invalid) for rules; other_region for shares.",
				prometheus.Labels{"region": region, "kind": string(kind), "result": res})
		}
		m.failures[kind] = r.Counter("sluice_apply_write_errors_total", "Failed attempts to write to the region's Redis, by kind (each retried with backoff).",
			prometheus.Labels{"region": region, "kind": string(kind)})
	}
	m.bad = r.Counter("sluice_apply_bad_records_total", "Output records that did not decode, logged and skipped.", prometheus.Labels{"region": region})
	m.commitErrors = r.Counter("sluice_apply_commit_errors_total", "Offset commits that failed (the records are applied again after a restart).", prometheus.Labels{"region": region})
	m.rewinds = r.Counter("sluice_apply_rewinds_total", "Times the region's Redis had lost the applier's mark (it restarted empty) and the output topic was read again from its start.", prometheus.Labels{"region": region})
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_apply_delay_seconds",
		Help:        "Time from an output record's publication (its Kafka timestamp) to its application to the region's Redis.",
		Buckets:     []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		ConstLabels: prometheus.Labels{"region": region}})
	r.register(h)
	m.delay = h
	return m, r.err
}
