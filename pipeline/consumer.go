package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluice-rl/sluice/pipeline/decisionpb"
	"github.com/sluice-rl/sluice/rules"
)

// Output is what stages produce when windows close: dynamic rules for every
// region and shares for the regions they name.
type Output struct {
	Rules  []rules.Rule
	Shares []rules.Share
}

func (o *Output) add(x Output) {
	o.Rules = append(o.Rules, x.Rules...)
	o.Shares = append(o.Shares, x.Shares...)
}

// Stage is one processing step of the slow loop (the detector, the
// aggregator). It is an I/O-free state machine fed by one goroutine: Observe
// for each record on time, Advance when the watermark moves.
type Stage interface {
	Observe(d *decisionpb.Decision)
	// Advance closes the windows that end at or before the watermark wm
	// (event time) and returns what they produced.
	Advance(wm time.Time) Output
}

// Writer delivers stage output, e.g. to every region's Redis.
type Writer interface {
	Write(ctx context.Context, o Output) error
}

// ConsumerOptions configure a Consumer.
type ConsumerOptions struct {
	Brokers []string // required
	Topic   string   // default DefaultTopic
	Group   string   // consumer group; default "sluice-pipeline"
	// Lateness is how far behind the newest event time seen the watermark
	// trails: records older than the watermark are late, counted and skipped.
	// Default 10 s.
	Lateness   time.Duration
	Stages     []Stage
	Writer     Writer                // required
	Logger     *slog.Logger          // default slog.Default()
	Registerer prometheus.Registerer // nil registers no metrics
}

// ConsumerStats count the records a consumer has seen.
type ConsumerStats struct {
	Consumed  int64 // fetched, decoded or not
	BadRecord int64 // failed to decode
	Late      int64 // behind the watermark
	Outputs   int64 // rules and shares written
	WriteErrs int64
}

// Consumer runs stages over the decision topic as a Kafka consumer group, on
// event time: the watermark is the newest event time seen minus Lateness,
// and stages close windows as it passes. Offsets are committed after each
// batch is processed and its output written (at-least-once).
//
// Build one with NewConsumer, call Run, then Close. Stats and AdvanceTo are
// safe to call from other goroutines.
//
// Metrics: sluice_pipeline_records_total{result} (consumed, bad, late).
type Consumer struct {
	cl       *kgo.Client
	o        ConsumerOptions
	mu       sync.Mutex // serialises stage calls between Run and AdvanceTo
	maxMS    int64
	wm       int64
	pending  Output    // output whose write failed, retried before offsets move
	failedAt time.Time // when a write last failed; zero when none is pending
	stats    [5]atomic.Int64
	closed   sync.Once
}

// NewConsumer joins the consumer group; consumption starts with Run.
func NewConsumer(o ConsumerOptions) (*Consumer, error) {
	if len(o.Brokers) == 0 || o.Writer == nil {
		return nil, errors.New("pipeline: consumer needs brokers and a writer")
	}
	if o.Topic == "" {
		o.Topic = DefaultTopic
	}
	if o.Group == "" {
		o.Group = "sluice-pipeline"
	}
	if o.Lateness == 0 {
		o.Lateness = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(o.Brokers...),
		kgo.ConsumerGroup(o.Group),
		kgo.ConsumeTopics(o.Topic),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
		kgo.FetchMaxWait(100*time.Millisecond),
	)
	if err != nil {
		return nil, fmt.Errorf("pipeline: kafka consumer: %w", err)
	}
	c := &Consumer{cl: cl, o: o, maxMS: math.MinInt64, wm: math.MinInt64}
	if o.Registerer != nil {
		for i, name := range []string{"consumed", "bad", "late"} {
			v := &c.stats[i]
			err := o.Registerer.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "sluice_pipeline_records_total", Help: "Decision records consumed, and of those undecodable (bad) or behind the watermark (late).",
				ConstLabels: prometheus.Labels{"result": name},
			}, func() float64 { return float64(v.Load()) }))
			if err != nil {
				cl.Close()
				return nil, fmt.Errorf("pipeline: registering metrics: %w", err)
			}
		}
	}
	return c, nil
}

// retryWrite is the pause between attempts to write output after a failure.
const retryWrite = time.Second

var errWritePending = errors.New("pipeline: stage output is not written yet: the last write failed under a second ago")

const (
	statConsumed = iota
	statBad
	statLate
	statOutputs
	statWriteErrs
)

// Stats returns the consumer's counters.
func (c *Consumer) Stats() ConsumerStats {
	return ConsumerStats{
		Consumed: c.stats[statConsumed].Load(), BadRecord: c.stats[statBad].Load(), Late: c.stats[statLate].Load(),
		Outputs: c.stats[statOutputs].Load(), WriteErrs: c.stats[statWriteErrs].Load(),
	}
}

// Run consumes until ctx ends or the client is closed. It returns nil on a
// clean stop.
func (c *Consumer) Run(ctx context.Context) error {
	dirty := false // offsets consumed but held back by a failed write
	for {
		pctx, cancel := ctx, context.CancelFunc(func() {})
		c.mu.Lock()
		if !c.failedAt.IsZero() {
			// Output waits to be written: wake up to retry even if no
			// record arrives.
			pctx, cancel = context.WithTimeout(ctx, retryWrite)
		}
		c.mu.Unlock()
		fs := c.cl.PollFetches(pctx)
		cancel()
		if fs.IsClientClosed() || ctx.Err() != nil {
			return nil
		}
		fs.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				c.o.Logger.Warn("fetch failed", "topic", topic, "partition", p, "err", err)
			}
		})
		n := 0
		c.mu.Lock()
		fs.EachRecord(func(r *kgo.Record) {
			n++
			d, err := Decode(r.Value)
			if err != nil {
				c.stats[statBad].Add(1)
				c.o.Logger.Warn("skipping bad decision record", "partition", r.Partition, "offset", r.Offset, "err", err)
				return
			}
			if d.EventTimeMs < c.wm {
				c.stats[statLate].Add(1)
				return
			}
			c.maxMS = max(c.maxMS, d.EventTimeMs)
			for _, s := range c.o.Stages {
				s.Observe(d)
			}
		})
		wm := c.wm // no record yet: the watermark stays
		if c.maxMS != math.MinInt64 {
			wm = c.maxMS - c.o.Lateness.Milliseconds()
		}
		err := c.advanceLocked(ctx, wm)
		c.mu.Unlock()
		c.stats[statConsumed].Add(int64(n))
		if err != nil {
			// Offsets stay where they are until the output is written: a
			// restart replays these records (at-least-once).
			dirty = dirty || n > 0
			continue
		}
		if n == 0 && !dirty {
			continue
		}
		if err := c.cl.CommitUncommittedOffsets(ctx); err != nil && ctx.Err() == nil {
			c.o.Logger.Warn("committing offsets failed", "err", err)
		}
		dirty = false
	}
}

// AdvanceTo moves the watermark to t if it is behind, closing windows: a
// punctuation for a source that knows no earlier record will come (the end
// of a replay).
func (c *Consumer) AdvanceTo(ctx context.Context, t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.advanceLocked(ctx, t.UnixMilli())
}

// advanceLocked moves the watermark to wm, closing windows, and writes what
// they produced together with any output whose earlier write failed. On a
// write error the output is kept for the next call.
func (c *Consumer) advanceLocked(ctx context.Context, wm int64) error {
	if wm > c.wm {
		c.wm = wm
		t := time.UnixMilli(wm)
		for _, s := range c.o.Stages {
			c.pending.add(s.Advance(t))
		}
	}
	n := len(c.pending.Rules) + len(c.pending.Shares)
	if n == 0 {
		return nil
	}
	if !c.failedAt.IsZero() && time.Since(c.failedAt) < retryWrite {
		return errWritePending
	}
	if err := c.o.Writer.Write(ctx, c.pending); err != nil {
		c.stats[statWriteErrs].Add(1)
		c.failedAt = time.Now()
		c.o.Logger.Warn("writing stage output failed; will retry", "err", err, "pending", n)
		return err
	}
	c.pending, c.failedAt = Output{}, time.Time{}
	c.stats[statOutputs].Add(int64(n))
	return nil
}

// Close leaves the group and closes the client. Safe to call twice.
func (c *Consumer) Close() {
	c.closed.Do(func() { c.cl.Close() })
}
