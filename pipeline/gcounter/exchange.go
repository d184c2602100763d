package gcounter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/pipeline"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

// DefaultQuotaTopic is the topic the regions exchange G-Counter counts on
// (QuotaPublisher writes it, QuotaApplier reads it).
const DefaultQuotaTopic = "sluice.quotas"

// quotaRetention keeps a month's window (31 days) and its slack.
const quotaRetention = 35 * 24 * time.Hour

// QuotaFormat is the version of the quota topic's record encoding.
const QuotaFormat = 1

// ErrBadQuotaRecord is wrapped by every error of DecodeQuotaRecord.
var ErrBadQuotaRecord = errors.New("pipeline: bad quota record")

// QuotaRecord is one record of the quota topic: one region's count of one
// G-Counter window (decision.QuotaCount). Its Kafka key,
//
//	gc/<rule id>/<entity tag>/<window start, Unix ms>/<region>
//
// names the window and the region, so that a compacted topic keeps the
// newest count of each; its value is JSON, version 1:
//
//	{"format":1,"count":{"rule":..,"tag":..,"window":..,"end":..,"region":..,"count":..}}
//
// A region's count only grows, and readers merge by maximum, so the topic's
// order, compaction and redeliveries change nothing.
type QuotaRecord struct {
	Format int                 `json:"format"`
	Count  decision.QuotaCount `json:"count"`
}

// QuotaKey returns the Kafka key of q's record.
func QuotaKey(q *decision.QuotaCount) string {
	return "gc/" + q.Rule + "/" + q.Tag + "/" + strconv.FormatInt(q.Window.UnixMilli(), 10) + "/" + q.Region
}

// EncodeQuotaRecord returns q's record's key and value.
func EncodeQuotaRecord(q *decision.QuotaCount) (key, value []byte, err error) {
	if err := q.Validate(); err != nil {
		return nil, nil, err
	}
	v, err := json.Marshal(QuotaRecord{Format: QuotaFormat, Count: *q})
	return []byte(QuotaKey(q)), v, err
}

// DecodeQuotaRecord decodes a quota topic record: a known format, a valid
// count (decision.QuotaCount.Validate), and a key that names it. Errors wrap
// ErrBadQuotaRecord.
func DecodeQuotaRecord(key, value []byte) (decision.QuotaCount, error) {
	var r QuotaRecord
	bad := func(format string, a ...any) (decision.QuotaCount, error) {
		return decision.QuotaCount{}, fmt.Errorf("%w: key %q: %s", ErrBadQuotaRecord, key, fmt.Sprintf(format, a...))
	}
	dec := json.NewDecoder(strings.NewReader(string(value)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return bad("%v", err)
	}
	if r.Format != QuotaFormat {
		return bad("format %d, want %d", r.Format, QuotaFormat)
	}
	if err := r.Count.Validate(); err != nil {
		return bad("%v", err)
	}
	if string(key) != QuotaKey(&r.Count) {
		return bad("the key does not name the count's window and region (%s)", QuotaKey(&r.Count))
	}
	return r.Count, nil
}

// EnsureQuotaTopic creates the quota topic (DefaultQuotaTopic if topic is
// empty) if it does not exist, with the given partitions (at least 1),
// cleanup.policy compact,delete and retention.ms of 35 days: compaction
// keeps the newest count per window and region, and retention drops the
// windows that ended (a month's and its slack).
func EnsureQuotaTopic(ctx context.Context, brokers []string, topic string, partitions int32) error {
	if topic == "" {
		topic = DefaultQuotaTopic
	}
	partitions = max(partitions, 1)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return fmt.Errorf("pipeline: kafka admin: %w", err)
	}
	defer cl.Close()
	policy, retention := "compact,delete", strconv.FormatInt(quotaRetention.Milliseconds(), 10)
	conf := map[string]*string{"cleanup.policy": &policy, "retention.ms": &retention}
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, partitions, -1, conf, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("pipeline: creating topic %s: %w", topic, err)
	}
	return nil
}

// QuotaSource gives a region's G-Counter counts; *enforcer.Limiter has it.
type QuotaSource interface {
	QuotaCounts(ctx context.Context) ([]decision.QuotaCount, error)
}

// QuotaPublisherOptions configure a QuotaPublisher.
type QuotaPublisherOptions struct {
	Brokers []string    // required
	Source  QuotaSource // required: the region's limiter
	// Topic; default DefaultQuotaTopic.
	Topic string
	// Interval between two publications; default 1 s. It bounds, with the
	// topic's and the appliers' delay, how stale a region's view of the
	// others' counts is (see docs/enforcement.md, "G-Counter quotas").
	Interval time.Duration

	Logger     *slog.Logger          // default slog.Default()
	Registerer prometheus.Registerer // nil registers no metrics
}

// QuotaPublisher publishes a limiter's G-Counter counts to the quota topic
// every Interval: the counts of the windows the limiter counted in since
// the last publication, read from its region's Redis. Counts that Kafka
// did not take are kept (the larger of each window's) and sent with the
// next publication.
//
// Build one with NewQuotaPublisher, call Run, then Close. Publish is safe
// to call from one goroutine at a time.
type QuotaPublisher struct {
	o       QuotaPublisherOptions
	cl      *kgo.Client
	pending map[string]decision.QuotaCount // by key: counts not yet acknowledged
	sent    *pipeline.Counter
	errs    *pipeline.Counter
	closed  sync.Once
}

// NewQuotaPublisher creates the producer.
func NewQuotaPublisher(o QuotaPublisherOptions) (*QuotaPublisher, error) {
	if len(o.Brokers) == 0 {
		return nil, errors.New("pipeline: no Kafka brokers")
	}
	if o.Source == nil {
		return nil, errors.New("pipeline: a quota publisher needs its region's limiter (Source)")
	}
	if o.Topic == "" {
		o.Topic = DefaultQuotaTopic
	}
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	r := pipeline.NewRegistry(o.Registerer)
	p := &QuotaPublisher{o: o, pending: map[string]decision.QuotaCount{},
		sent: r.Counter("sluice_quota_counts_published_total", "G-Counter counts of this region published to the quota topic.", nil),
		errs: r.Counter("sluice_quota_publish_errors_total", "Failed publications of G-Counter counts (each kept for the next).", nil),
	}
	if r.Err() != nil {
		return nil, fmt.Errorf("pipeline: registering metrics: %w", r.Err())
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(o.Brokers...), kgo.DefaultProduceTopic(o.Topic),
		kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ProducerLinger(0))
	if err != nil {
		return nil, fmt.Errorf("pipeline: kafka quota publisher: %w", err)
	}
	p.cl = cl
	return p, nil
}

// Run publishes every Interval until ctx ends or the publisher is closed,
// then publishes once more (within 5 s) and returns nil.
func (p *QuotaPublisher) Run(ctx context.Context) error {
	t := time.NewTicker(p.o.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = p.Publish(fctx)
			return nil
		case <-t.C:
			if err := p.Publish(ctx); err != nil && ctx.Err() == nil {
				p.o.Logger.Warn("publishing G-Counter counts failed; kept for the next publication", "err", err)
			}
		}
	}
}

// Publish reads the source's counts and produces them with those kept from
// failed publications, waiting for Kafka's acknowledgement.
func (p *QuotaPublisher) Publish(ctx context.Context) error {
	qs, err := p.o.Source.QuotaCounts(ctx)
	for _, q := range qs {
		k := QuotaKey(&q)
		if old, ok := p.pending[k]; !ok || q.Count > old.Count {
			p.pending[k] = q
		}
	}
	if len(p.pending) == 0 {
		return err
	}
	recs := make([]*kgo.Record, 0, len(p.pending))
	for _, q := range p.pending {
		k, v, eerr := EncodeQuotaRecord(&q)
		if eerr != nil { // not a count the limiter makes: drop it, counted
			p.errs.Inc()
			delete(p.pending, QuotaKey(&q))
			continue
		}
		recs = append(recs, &kgo.Record{Key: k, Value: v})
	}
	res := p.cl.ProduceSync(ctx, recs...)
	for _, r := range res {
		if r.Err != nil {
			p.errs.Inc()
			if err == nil {
				err = r.Err
			}
			continue
		}
		p.sent.Inc()
		delete(p.pending, string(r.Record.Key))
	}
	return err
}

// Close closes the client; Run returns. Safe to call twice.
func (p *QuotaPublisher) Close() { p.closed.Do(p.cl.Close) }

// QuotaApplierOptions configure a QuotaApplier.
type QuotaApplierOptions struct {
	Brokers []string // required
	// Region whose Redis the applier writes (required). Its own counts are
	// merged too, by maximum, which restores them after its Redis lost
	// them; otherwise its enforcers write them.
	Region string
	Redis  redis.UniversalClient // required: the region's Redis
	// Merge merges counts into a region's Redis by element-wise maximum and
	// returns how many fields it raised (required: enforcer.MergeQuotaCounts,
	// which owns the keys' layout and the merge script). The exchange takes
	// it as a function so that the slow loop links no enforcer.
	Merge func(ctx context.Context, rdb redis.UniversalClient, own string, counts []decision.QuotaCount, now time.Time) (int, error)
	// Topic; default DefaultQuotaTopic. Group; default "sluice-quotas-" +
	// Region: every region reads every record.
	Topic, Group string
	// Now is the clock against which ended windows are skipped; default
	// time.Now.
	Now func() time.Time
	// RetryMax caps the backoff between attempts to write to a failing
	// Redis (from 100 ms, doubling). Default 5 s.
	RetryMax time.Duration

	Logger     *slog.Logger          // default slog.Default()
	Registerer prometheus.Registerer // nil registers no metrics
}

// QuotaApplier merges the other regions' G-Counter counts from the quota
// topic into its region's Redis (Options.Merge, enforcer.MergeQuotaCounts: element-wise
// maximum), committing offsets only past records Redis took; while Redis
// fails it retries with backoff and reads no further. Merging again is
// harmless, so a restart that reads records again converges to the same
// state.
//
// Build one with NewQuotaApplier, call Run, then Close. Stats is safe to
// call from any goroutine.
type QuotaApplier struct {
	o      QuotaApplierOptions
	cl     *kgo.Client
	merged *pipeline.Counter // fields raised
	read   *pipeline.Counter
	bad    *pipeline.Counter
	fails  *pipeline.Counter
	stop   context.Context
	cancel context.CancelFunc
	closed sync.Once
}

// NewQuotaApplier creates the consumer; Run joins the group.
func NewQuotaApplier(o QuotaApplierOptions) (*QuotaApplier, error) {
	switch {
	case len(o.Brokers) == 0:
		return nil, errors.New("pipeline: no Kafka brokers")
	case !rules.ValidID(o.Region):
		return nil, fmt.Errorf("pipeline: region %q: want 1-64 characters of A-Z a-z 0-9 _ . -", o.Region)
	case o.Redis == nil:
		return nil, fmt.Errorf("pipeline: the quota applier of region %s needs its Redis", o.Region)
	case o.Merge == nil:
		return nil, fmt.Errorf("pipeline: the quota applier of region %s needs a Merge (enforcer.MergeQuotaCounts)", o.Region)
	}
	if o.Topic == "" {
		o.Topic = DefaultQuotaTopic
	}
	if o.Group == "" {
		o.Group = "sluice-quotas-" + o.Region
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
	r := pipeline.NewRegistry(o.Registerer)
	l := prometheus.Labels{"region": o.Region}
	a := &QuotaApplier{o: o,
		read:   r.Counter("sluice_quota_records_total", "Quota records read by the region's quota applier.", l),
		merged: r.Counter("sluice_quota_fields_raised_total", "Per-region counts the quota applier raised in the region's Redis (a count below the merged one raises nothing).", l),
		bad:    r.Counter("sluice_quota_bad_records_total", "Quota records that did not decode, skipped.", l),
		fails:  r.Counter("sluice_quota_write_errors_total", "Failed merges into the region's Redis (each retried with backoff).", l),
	}
	if r.Err() != nil {
		return nil, fmt.Errorf("pipeline: registering metrics: %w", r.Err())
	}
	a.stop, a.cancel = context.WithCancel(context.Background())
	cl, err := kgo.NewClient(pipeline.ApplyGroupOpts(o.Brokers, o.Group, []string{o.Topic}, nil)...)
	if err != nil {
		return nil, fmt.Errorf("pipeline: kafka quota applier: %w", err)
	}
	a.cl = cl
	return a, nil
}

// QuotaApplierStats count what a QuotaApplier has done since it started.
type QuotaApplierStats struct {
	Read, Raised, Bad, WriteErrors int64
}

// Stats returns the applier's counters.
func (a *QuotaApplier) Stats() QuotaApplierStats {
	return QuotaApplierStats{Read: a.read.Value(), Raised: a.merged.Value(), Bad: a.bad.Value(), WriteErrors: a.fails.Value()}
}

// Run merges records until ctx ends or the applier is closed, and returns
// nil then; it returns the error if Kafka refuses it for good
// (pipeline.FatalFetchError).
func (a *QuotaApplier) Run(ctx context.Context) error {
	var checked time.Time
	for {
		fs, ok, err := pipeline.Poll(ctx, a.cl, 10_000, a.o.Logger)
		if !ok {
			a.cl.AllowRebalance()
			return err
		}
		recs := fs.Records()
		if time.Since(checked) >= 5*time.Second {
			checked = time.Now()
			if a.rewound(ctx) {
				recs = nil // read again from the start
			}
		}
		if len(recs) > 0 && a.merge(ctx, recs) {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			if err := a.cl.CommitRecords(cctx, recs...); err != nil {
				a.o.Logger.Warn("committing merged quota counts failed; a restart merges them again", "region", a.o.Region, "err", err)
			}
			cancel()
		}
		a.cl.AllowRebalance()
	}
}

// rewound reads the quota topic again from its start when the region's
// Redis lost its mark (store.QuotasAppliedKey: gone, the Redis restarted
// empty and lost the other regions' counts, and its own, which the
// committed offsets would never bring back; see pipeline.RewindIfLost), and reports
// whether it did. While reading again, every region's counts are merged,
// its own included: the topic holds what this region published before it
// lost them.
func (a *QuotaApplier) rewound(ctx context.Context) bool {
	present := func(ctx context.Context) (bool, error) {
		n, err := a.o.Redis.Exists(ctx, store.QuotasAppliedKey).Result()
		return n == 1, err
	}
	mark := func(ctx context.Context) error { return a.o.Redis.Set(ctx, store.QuotasAppliedKey, "1", 0).Err() }
	if _, ok := pipeline.RewindIfLost(ctx, a.cl, a.o.Topic, present, mark); !ok {
		return false
	}
	a.o.Logger.Warn("the region's Redis lost the G-Counter counts merged into it (it restarted empty?): reading the quota topic again from its start",
		"region", a.o.Region, "topic", a.o.Topic)
	return true
}

// merge merges one poll's records; false if it stopped first.
func (a *QuotaApplier) merge(ctx context.Context, recs []*kgo.Record) bool {
	qs := make([]decision.QuotaCount, 0, len(recs))
	for _, rec := range recs {
		a.read.Inc()
		q, err := DecodeQuotaRecord(rec.Key, rec.Value)
		if err != nil {
			a.bad.Inc()
			a.o.Logger.Warn("skipping a quota record that does not decode", "region", a.o.Region,
				"partition", rec.Partition, "offset", rec.Offset, "err", err)
			continue
		}
		qs = append(qs, q)
	}
	if len(qs) == 0 {
		return true
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(a.stop, cancel)()
	n, err := backoff.Retry(rctx, func() (int, error) {
		// Every region's, its own too: a Redis that lost its own field gets
		// it back from what this region published (see rewound).
		n, err := a.o.Merge(rctx, a.o.Redis, "", qs, a.o.Now())
		if err != nil && rctx.Err() == nil {
			a.fails.Inc()
			a.o.Logger.Warn("merging quota counts into the region's Redis failed; retrying", "region", a.o.Region, "err", err)
		}
		return n, err
	}, backoff.WithBackOff(&backoff.ExponentialBackOff{InitialInterval: 100 * time.Millisecond, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: a.o.RetryMax}),
		backoff.WithMaxElapsedTime(0))
	if err != nil {
		return false
	}
	a.merged.Add(int64(n))
	return true
}

// Close stops a merge in progress, leaves the group and closes the client;
// Run returns. Safe to call twice.
func (a *QuotaApplier) Close() {
	a.closed.Do(func() {
		a.cancel()
		a.cl.Close()
	})
}
