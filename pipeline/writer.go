package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

// RegionWriter writes stage output to each region's Redis: dynamic rules to
// every region, each share only to the region it belongs to. It is safe for
// concurrent use.
//
// A region whose Redis fails holds back every region: the merge tier retries
// the whole write until all take it. TopicWriter with an Applier per region
// does not.
type RegionWriter struct {
	stores  map[string]*store.Store
	refused atomic.Int64
	// Logger, if set, reports rules refused at a region's cap.
	Logger *slog.Logger
}

// Refused counts the writes in which a region's dynamic-rule cap refused
// some rules (store.ErrCapReached); they are not retried.
func (w *RegionWriter) Refused() int64 { return w.refused.Load() }

// NewRegionWriter returns a writer over one store per region name.
func NewRegionWriter(stores map[string]*store.Store) *RegionWriter {
	return &RegionWriter{stores: stores}
}

// Write delivers o; it tries every region and returns the errors joined.
func (w *RegionWriter) Write(ctx context.Context, o stage.Output) error {
	byRegion := map[string][]rules.Share{}
	var errs []error
	for _, s := range o.Shares {
		if _, ok := w.stores[s.Region]; !ok {
			errs = append(errs, fmt.Errorf("share for unknown region %q", s.Region))
			continue
		}
		byRegion[s.Region] = append(byRegion[s.Region], s)
	}
	for region, st := range w.stores {
		if err := st.PutRules(ctx, o.Rules); errors.Is(err, store.ErrCapReached) {
			// Retrying cannot help: the rules past the cap are refused, and
			// counted; the others are written.
			w.refused.Add(1)
			if w.Logger != nil {
				w.Logger.Warn("dynamic rules refused: the region's cap is reached", "region", region, "err", err)
			}
		} else if err != nil {
			errs = append(errs, fmt.Errorf("region %s: %w", region, err))
		}
		if err := st.PutShares(ctx, byRegion[region]); err != nil {
			errs = append(errs, fmt.Errorf("region %s: %w", region, err))
		}
	}
	return errors.Join(errs...)
}

// TopicWriterOptions configure a TopicWriter.
type TopicWriterOptions struct {
	Brokers []string // required
	// Topic is the output topic; default DefaultOutputTopic. EnsureTopics
	// creates it.
	Topic  string
	Logger *slog.Logger // default slog.Default()
}

// TopicWriter publishes stage output to the output topic, one record per
// rule and per share (see OutputRecord), for an Applier per region to
// apply to that region's Redis. Write returns once Kafka has acknowledged
// every record (acks from all in-sync replicas, idempotent producer), so the
// merge tier checkpoints only output that is in the topic; a rule or share
// that cannot be encoded (a NaN fraction) is logged and left out rather than
// retried for ever. Build one with NewTopicWriter and Close it when done;
// it is safe for concurrent use.
//
// Unlike RegionWriter it does not wait for any region's Redis: a dead
// region's Redis holds back only that region's Applier.
type TopicWriter struct {
	cl     *kgo.Client
	topic  string
	log    *slog.Logger
	closed sync.Once
}

// NewTopicWriter creates the producer. The topic must exist (EnsureTopics
// or EnsureOutputTopic).
func NewTopicWriter(o TopicWriterOptions) (*TopicWriter, error) {
	if len(o.Brokers) == 0 {
		return nil, errors.New("pipeline: no Kafka brokers for the output topic")
	}
	if o.Topic == "" {
		o.Topic = DefaultOutputTopic
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(o.Brokers...),
		kgo.DefaultProduceTopic(o.Topic),
		kgo.ProducerLinger(0),
		kgo.RecordDeliveryTimeout(30*time.Second),
	)
	if err != nil {
		return nil, fmt.Errorf("pipeline: kafka producer for %s: %w", o.Topic, err)
	}
	return &TopicWriter{cl: cl, topic: o.Topic, log: o.Logger}, nil
}

// Write publishes o's rules and shares, in that order, and waits for
// Kafka's acknowledgement. It returns the first produce error (the caller
// retries; a record written twice is applied twice, which the stores take
// as an overwrite).
func (w *TopicWriter) Write(ctx context.Context, o stage.Output) error {
	recs := make([]*kgo.Record, 0, o.Len())
	add := func(k, v []byte, err error) {
		if err != nil {
			w.log.Error("leaving out stage output that cannot be encoded", "err", err)
			return
		}
		recs = append(recs, &kgo.Record{Key: k, Value: v})
	}
	for i := range o.Rules {
		add(encodeRule(&o.Rules[i]))
	}
	for i := range o.Shares {
		add(encodeShare(&o.Shares[i]))
	}
	if len(recs) == 0 {
		return nil
	}
	if err := w.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("pipeline: publishing %d records to %s: %w", len(recs), w.topic, err)
	}
	return nil
}

// Close flushes nothing (Write is synchronous) and closes the client. Safe
// to call twice.
func (w *TopicWriter) Close() { w.closed.Do(w.cl.Close) }
