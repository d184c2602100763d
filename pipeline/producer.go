package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/decision/decisionpb"
)

// DefaultTopic is the Kafka topic of decision records.
const DefaultTopic = "decisions"

// ProducerOptions configure a Producer.
type ProducerOptions struct {
	Brokers []string // required
	Topic   string   // default DefaultTopic
	// Buffer bounds the records waiting to be encoded, and separately those
	// franz-go holds unacknowledged. A full buffer drops and counts. Default 65536.
	Buffer int
	// DeliveryTimeout bounds how long a record franz-go has not yet sent may
	// wait for Kafka before it fails and is counted. One already sent in a
	// request Kafka has not answered (a silent broker) waits for the answer
	// instead, held in the buffer: the idempotent producer fails a batch
	// only where that leaves no gap in its sequence numbers (see
	// kgo.RecordDeliveryTimeout). Default 30 s.
	DeliveryTimeout time.Duration
	Logger          *slog.Logger          // default slog.Default()
	Registerer      prometheus.Registerer // nil registers no metrics
}

// ProducerStats count what happened to the records handed to Log. Every
// record ends in exactly one of Produced, Dropped or Failed (or is in flight).
type ProducerStats struct {
	Logged   int64 // handed to Log
	Dropped  int64 // lost to a full buffer
	Produced int64 // acknowledged by Kafka
	Failed   int64 // rejected by Kafka or the client
	// Truncated counts records with a text field cut to the decoder's
	// bounds; they are among the others too.
	Truncated int64
}

// Producer logs enforcer decision records to Kafka asynchronously: Log never
// blocks and never waits for Kafka; records are encoded off the request path
// by one goroutine and produced in batches by franz-go. Records are keyed by
// RecordKey, so one entity stays in one partition.
//
// A Producer implements decision.Sink and is safe for concurrent use. Close
// it to stop its goroutine.
//
// Metrics: sluice_pipeline_producer_records_total{result} with result in
// logged, dropped, produced, failed; and
// sluice_pipeline_producer_truncated_records_total, records with a text
// field cut to the decoder's bounds (see ToProto).
type Producer struct {
	cl    *kgo.Client
	topic string
	log   *slog.Logger
	in    chan item

	logged, dropped, produced, failed atomic.Int64
	truncated                         atomic.Int64
	// lastProduced and lastFailed are the Unix ns of the last record Kafka
	// acknowledged and of the last it refused (or that timed out), for Ping.
	lastProduced, lastFailed atomic.Int64
	lastDropLog              atomic.Int64 // Unix ns of the last "dropping" warning
	held                     atomic.Int64 // records handed to the client whose promise has not run

	closeOnce sync.Once
	closed    atomic.Bool
	done      chan struct{}
}

type item struct {
	rec   decision.Record
	flush chan struct{} // non-nil: a flush marker, closed when reached
	stop  bool          // the end: run returns
}

// NewProducer connects a producer; it does not wait for the brokers.
func NewProducer(o ProducerOptions) (*Producer, error) {
	if len(o.Brokers) == 0 {
		return nil, errors.New("pipeline: producer needs at least one broker")
	}
	if o.Topic == "" {
		o.Topic = DefaultTopic
	}
	if o.Buffer <= 0 {
		o.Buffer = 65536
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.DeliveryTimeout <= 0 {
		o.DeliveryTimeout = 30 * time.Second
	}
	cl, err := kgo.NewClient(
		kgo.RecordDeliveryTimeout(o.DeliveryTimeout),
		kgo.SeedBrokers(o.Brokers...),
		kgo.DefaultProduceTopic(o.Topic),
		kgo.MaxBufferedRecords(o.Buffer),
		kgo.ProducerLinger(5*time.Millisecond),
		kgo.RecordRetries(3),
	)
	if err != nil {
		return nil, fmt.Errorf("pipeline: kafka producer: %w", err)
	}
	p := &Producer{cl: cl, topic: o.Topic, log: o.Logger, in: make(chan item, o.Buffer), done: make(chan struct{})}
	if o.Registerer != nil {
		for _, c := range []struct {
			result string
			v      *atomic.Int64
		}{{"logged", &p.logged}, {"dropped", &p.dropped}, {"produced", &p.produced}, {"failed", &p.failed}} {
			v := c.v
			err := o.Registerer.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name:        "sluice_pipeline_producer_records_total",
				Help:        "Decision records by what happened to them: logged, dropped (buffer full), produced, failed.",
				ConstLabels: prometheus.Labels{"result": c.result},
			}, func() float64 { return float64(v.Load()) }))
			if err != nil {
				cl.Close()
				return nil, fmt.Errorf("pipeline: registering metrics: %w", err)
			}
		}
		err := o.Registerer.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_pipeline_producer_truncated_records_total",
			Help: "Decision records with a text field cut to the length a decoder takes (1 KiB; 8 KiB for the path and the user agent).",
		}, func() float64 { return float64(p.truncated.Load()) }))
		if err != nil {
			cl.Close()
			return nil, fmt.Errorf("pipeline: registering metrics: %w", err)
		}
	}
	go p.run()
	return p, nil
}

// Log queues rec for Kafka. It never blocks: when the buffer is full, or
// the producer is closed, the record is dropped and counted.
func (p *Producer) Log(rec decision.Record) {
	p.logged.Add(1)
	if p.closed.Load() {
		p.dropped.Add(1)
		return
	}
	select {
	case p.in <- item{rec: rec}:
	default:
		p.drop()
	}
}

// drop counts a record lost to a full buffer, and logs it at most every 10
// s (found by a fresh user: with Kafka down, 199 776 records dropped and
// the sidecar's log said nothing).
func (p *Producer) drop() {
	n := p.dropped.Add(1)
	if now, last := time.Now().UnixNano(), p.lastDropLog.Load(); now-last > int64(10*time.Second) && p.lastDropLog.CompareAndSwap(last, now) {
		p.log.Warn("dropping decision records: the producer's buffer is full (Kafka slow or unreachable)", "dropped_so_far", n)
	}
}

func (p *Producer) run() {
	defer close(p.done)
	var d decisionpb.Decision
	var lastErr atomic.Int64 // unix ns of the last logged failure
	for it := range p.in {
		if it.stop {
			return
		}
		if it.flush != nil {
			close(it.flush)
			continue
		}
		if decision.ToProto(&it.rec, &d) {
			p.truncated.Add(1)
		}
		b, err := proto.Marshal(&d)
		if err != nil {
			p.failed.Add(1)
			continue
		}
		// The Kafka timestamp stays the produce time: franz-go measures the
		// delivery timeout from it. The event time travels in the record.
		r := &kgo.Record{Key: decision.RecordKey(&it.rec.Descriptors), Value: b}
		p.held.Add(1)
		p.cl.TryProduce(context.Background(), r, func(_ *kgo.Record, err error) {
			defer p.held.Add(-1)
			switch {
			case err == nil:
				p.produced.Add(1)
				p.lastProduced.Store(time.Now().UnixNano())
			case errors.Is(err, kgo.ErrMaxBuffered):
				p.drop()
			default:
				p.failed.Add(1)
				p.lastFailed.Store(time.Now().UnixNano())
				if now, last := time.Now().UnixNano(), lastErr.Load(); now-last > int64(10*time.Second) && lastErr.CompareAndSwap(last, now) {
					p.log.Warn("producing decision records failed", "err", err, "failed_so_far", p.failed.Load())
				}
			}
		})
	}
}

// Flush waits until every record logged before the call has been produced,
// dropped or failed, or ctx ends.
func (p *Producer) Flush(ctx context.Context) error {
	mark := make(chan struct{})
	select {
	case p.in <- item{flush: mark}:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-mark:
	case <-ctx.Done():
		return ctx.Err()
	}
	return p.cl.Flush(ctx)
}

// Ping checks that records can be delivered: a broker answers within ctx,
// and records are not all failing, that is, the last record Kafka refused
// or that timed out (within the last 30 s) came before the last one it
// acknowledged. A broker that answers but refuses every record (one that
// came back without its topics, a topic the producer may not write) fails
// Ping too.
func (p *Producer) Ping(ctx context.Context) error {
	if err := p.cl.Ping(ctx); err != nil {
		return fmt.Errorf("pipeline: no Kafka broker answers: %w", err)
	}
	if failed, produced := p.lastFailed.Load(), p.lastProduced.Load(); failed > produced && time.Since(time.Unix(0, failed)) < 30*time.Second {
		return fmt.Errorf("pipeline: Kafka refuses the records sent to %s (%d failed so far; see the log)", p.topic, p.failed.Load())
	}
	return nil
}

// Stats returns the producer's counters.
func (p *Producer) Stats() ProducerStats {
	return ProducerStats{Logged: p.logged.Load(), Dropped: p.dropped.Load(), Produced: p.produced.Load(), Failed: p.failed.Load(), Truncated: p.truncated.Load()}
}

// Close flushes what it can within 5 s and stops the producer. It may be
// called more than once; a Log after Close drops its record and counts it.
func (p *Producer) Close() {
	p.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Flush(ctx)
		p.closed.Store(true)
		p.in <- item{stop: true} // the channel stays open: a late Log must not panic
		<-p.done
		// Records a Log queued after the flush: dropped, and counted.
		for {
			select {
			case <-p.in:
				p.dropped.Add(1)
				continue
			default:
			}
			break
		}
		p.cl.Close() // fails the records it still holds (counted as failed)
		// Close returns before the client has called every promise: wait
		// (briefly) for the failures of the records it held to be counted.
		for deadline := time.Now().Add(2 * time.Second); p.held.Load() > 0 && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		// What Kafka never took, said once: the per-failure warning is at
		// most one per 10 s, and a process stopping says nothing after it
		// (found by a fresh user: 50 records lost at shutdown showed as
		// "failed_so_far=1").
		// lost is every record not produced: those failed or dropped so far,
		// and those the client still held, whose failures it may report
		// after Close returns (a fresh user's summary counted 67 of 379).
		if st := p.Stats(); st.Produced < st.Logged {
			p.log.Warn("the decision-record producer stopped with records Kafka never acknowledged: they are lost",
				"lost", st.Logged-st.Produced, "logged", st.Logged, "produced", st.Produced, "failed", st.Failed, "dropped", st.Dropped)
		}
	})
}
