package analytics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluice-rl/sluice/pipeline"
)

// DefaultGroup is the sink's consumer group.
const DefaultGroup = "sluice-clickhouse"

// SinkOptions configure a Sink.
type SinkOptions struct {
	Brokers []string // required
	// Topic is the decision topic; default pipeline.DefaultTopic.
	Topic string
	// OutputTopic is the pipeline's output topic, whose rules and shares
	// go to dynamic_rules and shares; default pipeline.DefaultOutputTopic.
	OutputTopic string
	// NoOutput reads the decision topic only.
	NoOutput bool
	// Group is the consumer group; default DefaultGroup. It is the sink's
	// own: a dead ClickHouse holds back this group only.
	Group string
	// Conn is the ClickHouse connection (Open), its database migrated
	// (Migrate). Required.
	Conn driver.Conn
	// BatchRows flushes a batch once it holds this many records; default
	// 10 000.
	BatchRows int
	// FlushInterval flushes a batch this long after its first record at
	// the latest (plus up to one 250 ms poll); default 1 s.
	FlushInterval time.Duration
	// RetryMax caps the backoff between attempts to insert a batch into a
	// failing ClickHouse (from 100 ms, doubling); default 5 s.
	RetryMax time.Duration

	Logger     *slog.Logger          // default slog.Default()
	Registerer prometheus.Registerer // nil registers no metrics
}

func (o *SinkOptions) defaults() error {
	if len(o.Brokers) == 0 {
		return errors.New("analytics: no Kafka brokers")
	}
	if o.Conn == nil {
		return errors.New("analytics: the sink needs a ClickHouse connection")
	}
	if o.Topic == "" {
		o.Topic = pipeline.DefaultTopic
	}
	if o.OutputTopic == "" {
		o.OutputTopic = pipeline.DefaultOutputTopic
	}
	if !o.NoOutput && o.OutputTopic == o.Topic {
		return fmt.Errorf("analytics: topic %q is both the decision and the output topic", o.Topic)
	}
	if o.Group == "" {
		o.Group = DefaultGroup
	}
	if o.BatchRows <= 0 {
		o.BatchRows = 10_000
	}
	if o.FlushInterval <= 0 {
		o.FlushInterval = time.Second
	}
	if o.RetryMax <= 0 {
		o.RetryMax = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return nil
}

// Sink writes the decision topic's records to ClickHouse's decisions table,
// and the output topic's dynamic rules and shares to dynamic_rules and
// shares, in batches flushed on size (BatchRows) or time (FlushInterval).
// It is a consumer group of its own (DefaultGroup), beside the pipeline's:
// it shares no state with the detector or the aggregator, so a dead
// ClickHouse pauses the sink only.
//
// Delivery is at least once: offsets are committed only after ClickHouse
// acknowledged every row of the batch before them. While ClickHouse fails,
// the sink retries the batch with backoff (100 ms up to RetryMax) and reads
// no further; Kafka keeps the records. A batch given up for a rebalance or
// at Close is not committed, and is read again by whoever owns its
// partitions next. A record inserted twice (a retry after an insert whose
// acknowledgement was lost, or a redelivery) is collapsed by the tables'
// ReplacingMergeTree engines and counted once by the reports: see
// docs/analytics.md.
//
// A record that does not decode, a watermark marker and a decision dated
// past 2106 are skipped and counted (sluice_clickhouse_skipped_records_total).
//
// Build one with NewSink, call Run, then Close. Stats is safe to call from
// any goroutine.
type Sink struct {
	o  SinkOptions
	cl *kgo.Client
	m  *sinkMetrics

	mu  sync.Mutex
	hwm map[topicPartition]int64 // the high watermark last fetched
	pos map[topicPartition]int64 // the next offset to commit

	yield  atomic.Bool // a rebalance waits: give the batch up
	stop   context.Context
	cancel context.CancelFunc
	closed sync.Once
}

type topicPartition struct {
	topic     string
	partition int32
}

// NewSink creates the Kafka client; Run joins the group.
func NewSink(o SinkOptions) (*Sink, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	s := &Sink{o: o, hwm: map[topicPartition]int64{}, pos: map[topicPartition]int64{}}
	m, err := newSinkMetrics(o.Registerer, s.lag)
	if err != nil {
		return nil, err
	}
	s.m = m
	s.stop, s.cancel = context.WithCancel(context.Background())
	topics := []string{o.Topic}
	if !o.NoOutput {
		topics = append(topics, o.OutputTopic)
	}
	cl, err := kgo.NewClient(pipeline.ApplyGroupOpts(o.Brokers, o.Group, topics, &s.yield)...)
	if err != nil {
		return nil, fmt.Errorf("analytics: kafka sink: %w", err)
	}
	s.cl = cl
	return s, nil
}

// SinkStats count what a Sink has done since it started.
type SinkStats struct {
	// Rows acknowledged by ClickHouse, per table (a batch retried after a
	// partial failure counts its rows again).
	Rows map[string]int64
	// Batches flushed whole and committed; Abandoned batches given up
	// before ClickHouse took them (read again).
	Batches, Abandoned int64
	// InsertFailures counts failed attempts to insert a batch (each
	// retried).
	InsertFailures int64
	// Skipped records, by reason (SkipBadDecision, ...).
	Skipped map[string]int64
	// CommitErrors counts failed offset commits.
	CommitErrors int64
}

// Stats returns the sink's counters.
func (s *Sink) Stats() SinkStats {
	st := SinkStats{Rows: map[string]int64{}, Skipped: map[string]int64{},
		Batches: counterValue(s.m.batches), Abandoned: counterValue(s.m.abandoned),
		InsertFailures: counterValue(s.m.failures), CommitErrors: counterValue(s.m.commitErrors)}
	for t, c := range s.m.rows {
		st.Rows[t] = counterValue(c)
	}
	for r, c := range s.m.skipped {
		st.Skipped[r] = counterValue(c)
	}
	return st
}

// Lag returns the records fetched from Kafka's high watermarks that are
// not yet committed, summed over the partitions this sink has fetched.
func (s *Sink) Lag() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for tp, h := range s.hwm {
		n += max(0, h-s.pos[tp])
	}
	return n
}

func (s *Sink) lag() float64 { return float64(s.Lag()) }

// CatchUp waits until the sink's group has committed, on every partition
// of the topics it reads, the end offsets those partitions had when it was
// called: every record written to them before the call is then in
// ClickHouse. It returns ctx's error if that takes longer (while
// ClickHouse is down, say). A replay calls it at its end.
func (s *Sink) CatchUp(ctx context.Context) error {
	adm := kadm.NewClient(s.cl)
	topics := []string{s.o.Topic}
	if !s.o.NoOutput {
		topics = append(topics, s.o.OutputTopic)
	}
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return fmt.Errorf("analytics: reading the ends of %v: %w", topics, err)
	}
	if err := ends.Error(); err != nil {
		return fmt.Errorf("analytics: reading the ends of %v: %w", topics, err)
	}
	for {
		committed, err := adm.FetchOffsets(ctx, s.o.Group)
		if err == nil {
			err = committed.Error()
		}
		behind := int64(0)
		if err == nil {
			ends.Each(func(o kadm.ListedOffset) {
				c, ok := committed.Lookup(o.Topic, o.Partition)
				at := int64(0)
				if ok {
					at = c.At
				}
				behind += max(0, o.Offset-at)
			})
			if behind == 0 {
				return nil
			}
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			if err != nil {
				return fmt.Errorf("analytics: the sink has not caught up: %w (last error: %v)", ctx.Err(), err)
			}
			return fmt.Errorf("analytics: the sink has not caught up: %d records not yet written: %w", behind, ctx.Err())
		case <-t.C:
		}
	}
}

// Run reads, batches and writes records until ctx ends or the sink is
// closed, and returns nil then; it returns the error if Kafka refuses it for
// good (pipeline.FatalFetchError). A pending batch is then abandoned (and
// counted): its records are read again by the next sink.
func (s *Sink) Run(ctx context.Context) error {
	var pending []*kgo.Record
	var first time.Time // when the pending batch got its first record
	for {
		fs, ok, err := pipeline.Poll(ctx, s.cl, s.o.BatchRows-len(pending), s.o.Logger)
		if !ok || s.stop.Err() != nil {
			if len(pending) > 0 {
				s.m.abandoned.Inc()
			}
			s.cl.AllowRebalance()
			return err
		}
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			s.mu.Lock()
			s.hwm[topicPartition{p.Topic, p.Partition}] = p.HighWatermark
			s.mu.Unlock()
			pending = append(pending, p.Records...)
		})
		if len(pending) == 0 {
			s.cl.AllowRebalance()
			s.yield.Store(false)
			continue
		}
		if first.IsZero() {
			first = time.Now()
		}
		if len(pending) < s.o.BatchRows && time.Since(first) < s.o.FlushInterval && !s.yield.Load() {
			continue // a rebalance waits for this batch at most FlushInterval
		}
		if s.flush(ctx, pending) {
			s.commit(ctx, pending)
		} else {
			s.m.abandoned.Inc()
		}
		pending, first = nil, time.Time{}
		s.cl.AllowRebalance()
		s.yield.Store(false)
	}
}

// flush inserts recs into ClickHouse, retrying until it succeeds; false if
// it stopped first (ctx ended, Close, or an attempt failed while a
// rebalance waits).
func (s *Sink) flush(ctx context.Context, recs []*kgo.Record) bool {
	var b batch
	for _, r := range recs {
		b.add(r, s.o.Topic)
	}
	for reason, n := range b.skipped {
		s.m.skipped[reason].Add(float64(n))
		if reason != SkipPunctuation {
			s.o.Logger.Warn("skipping records the sink cannot write", "reason", reason, "records", n)
		}
	}
	start := time.Now()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.stop, cancel)()
	tables := []struct {
		name, query string
		rows        [][]any
	}{{TableDecisions, insertDecisions, b.decisions}, {TableRules, insertRules, b.rules}, {TableShares, insertShares, b.shares}}
	done := make([]bool, len(tables))
	_, err := backoff.Retry(rctx, func() (struct{}, error) {
		for i, t := range tables {
			if done[i] {
				continue
			}
			ictx, icancel := context.WithTimeout(rctx, time.Minute)
			err := insert(ictx, s.o.Conn, t.query, t.rows)
			icancel()
			if err != nil {
				if rctx.Err() != nil {
					return struct{}{}, err
				}
				s.m.failures.Inc()
				if s.yield.Load() { // a rebalance waits: give the batch up
					s.o.Logger.Warn("inserting into ClickHouse failed; giving the batch up to a rebalance", "table", t.name, "rows", len(t.rows), "err", err)
					return struct{}{}, backoff.Permanent(err)
				}
				s.o.Logger.Warn("inserting into ClickHouse failed; retrying", "table", t.name, "rows", len(t.rows), "err", err)
				return struct{}{}, err
			}
			done[i] = true
			s.m.rows[t.name].Add(float64(len(t.rows)))
		}
		return struct{}{}, nil
	}, backoff.WithBackOff(&backoff.ExponentialBackOff{InitialInterval: 100 * time.Millisecond, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: s.o.RetryMax}),
		backoff.WithMaxElapsedTime(0))
	if err != nil {
		return false
	}
	s.m.batches.Inc()
	s.m.duration.Observe(time.Since(start).Seconds())
	return true
}

// commit commits past recs, which ClickHouse has acknowledged. A failed
// commit is logged and counted: the next one covers it, and a restart
// writes the records again (deduplicated).
func (s *Sink) commit(ctx context.Context, recs []*kgo.Record) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := s.cl.CommitRecords(cctx, recs...); err != nil {
		s.m.commitErrors.Inc()
		s.o.Logger.Warn("committing written records failed; a restart writes them again", "err", err)
		return
	}
	s.mu.Lock()
	for _, r := range recs {
		tp := topicPartition{r.Topic, r.Partition}
		s.pos[tp] = max(s.pos[tp], r.Offset+1)
	}
	s.mu.Unlock()
}

// Close stops an insert in progress, leaves the group and closes the
// client; Run returns. What was written has been committed. Safe to call
// twice. The connection is the caller's.
func (s *Sink) Close() {
	s.closed.Do(func() {
		s.yield.Store(true)
		s.cancel()
		s.cl.Close()
	})
}

// sinkMetrics are a Sink's metrics.
type sinkMetrics struct {
	rows         map[string]prometheus.Counter
	skipped      map[string]prometheus.Counter
	batches      prometheus.Counter
	abandoned    prometheus.Counter
	failures     prometheus.Counter
	commitErrors prometheus.Counter
	duration     prometheus.Observer
}

func newSinkMetrics(reg prometheus.Registerer, lag func() float64) (*sinkMetrics, error) {
	m := &sinkMetrics{rows: map[string]prometheus.Counter{}, skipped: map[string]prometheus.Counter{}}
	var cs []prometheus.Collector
	counter := func(name, help string, labels prometheus.Labels) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
		cs = append(cs, c)
		return c
	}
	for _, t := range []string{TableDecisions, TableRules, TableShares} {
		m.rows[t] = counter("sluice_clickhouse_rows_written_total", "Rows ClickHouse acknowledged, by table.", prometheus.Labels{"table": t})
	}
	for _, r := range []string{SkipBadDecision, SkipBadOutput, SkipPunctuation, SkipOutOfRange} {
		m.skipped[r] = counter("sluice_clickhouse_skipped_records_total",
			"Kafka records the sink did not write, by reason: bad_decision, bad_output (do not decode), punctuation (watermark markers), out_of_range (event time past 2106).",
			prometheus.Labels{"reason": r})
	}
	m.batches = counter("sluice_clickhouse_batches_total", "Batches ClickHouse acknowledged whole, whose offsets were then committed.", nil)
	m.abandoned = counter("sluice_clickhouse_abandoned_batches_total", "Batches given up before ClickHouse took them (a rebalance, or shutdown): not committed, read again.", nil)
	m.failures = counter("sluice_clickhouse_insert_failures_total", "Failed attempts to insert a batch into ClickHouse (each retried with backoff).", nil)
	m.commitErrors = counter("sluice_clickhouse_commit_errors_total", "Offset commits that failed (the records are written again after a restart, and deduplicated).", nil)
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_clickhouse_flush_duration_seconds",
		Help:    "Time from the first insert attempt of a batch to ClickHouse's acknowledgement of all of it, retries included.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}})
	cs = append(cs, h, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_clickhouse_lag_records",
		Help: "Records of the decision and output topics, up to the high watermarks last fetched, not yet written and committed by the sink."}, lag))
	m.duration = h
	if reg != nil {
		for _, c := range cs {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("analytics: registering metrics: %w", err)
			}
		}
	}
	return m, nil
}

func counterValue(c prometheus.Counter) int64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return 0
	}
	return int64(m.GetCounter().GetValue())
}
