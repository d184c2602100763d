package pipeline

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Pipeline runs both tiers, a Consumer and a Merger, in one process, as a
// replay does. Several processes running a Pipeline
// with the same Options share the partitions of the decision topic, and one
// of them merges.
type Pipeline struct {
	Consumer *Consumer
	Merger   *Merger
	o        Options
	adm      *kadm.Client
	admCl    *kgo.Client
	wg       sync.WaitGroup
	closed   sync.Once
	failed   chan struct{} // closed when a tier stopped with an error
	errOnce  sync.Once
	err      error
}

// New creates both tiers. The topics must exist (see EnsureTopics).
func New(o Options) (*Pipeline, error) {
	c, err := NewConsumer(o)
	if err != nil {
		return nil, err
	}
	m, err := NewMerger(o)
	if err != nil {
		c.Close()
		return nil, err
	}
	_ = o.defaults() // NewConsumer checked them
	cl, err := kgo.NewClient(kgo.SeedBrokers(o.Brokers...))
	if err != nil {
		c.Close()
		m.Close()
		return nil, fmt.Errorf("pipeline: kafka admin: %w", err)
	}
	return &Pipeline{Consumer: c, Merger: m, o: o, adm: kadm.NewClient(cl), admCl: cl, failed: make(chan struct{})}, nil
}

// Start runs both tiers until ctx ends or Close. A tier that stops with an
// error (Kafka refuses it for good: FatalFetchError) makes Err return it and
// Sync fail with it.
func (p *Pipeline) Start(ctx context.Context) {
	p.wg.Add(2)
	for _, run := range []func(context.Context) error{p.Consumer.Run, p.Merger.Run} {
		go func() {
			defer p.wg.Done()
			if err := run(ctx); err != nil {
				p.errOnce.Do(func() { p.err = err; close(p.failed) })
			}
		}()
	}
}

// Err returns the error a tier stopped with, nil while both run or after
// they stopped as asked.
func (p *Pipeline) Err() error {
	select {
	case <-p.failed:
		return p.err
	default:
		return nil
	}
}

// Sync waits until the Consumer has processed at least records records of
// the decision topic (punctuations included) and the Merger has taken every
// partial sent until then, or ctx ends. A replay calls it to let the slow
// loop's output reach the enforcers before it goes on.
func (p *Pipeline) Sync(ctx context.Context, records int64) error {
	for p.Consumer.Processed() < records {
		if err := p.Err(); err != nil {
			return err
		}
		if err := sleepCtx(ctx, time.Millisecond); err != nil {
			return fmt.Errorf("pipeline: %d of %d records processed: %w", p.Consumer.Processed(), records, err)
		}
	}
	ends, err := p.adm.ListEndOffsets(ctx, p.o.PartialsTopic)
	if err != nil {
		return fmt.Errorf("pipeline: reading the end of %s: %w", p.o.PartialsTopic, err)
	}
	end, ok := ends.Lookup(p.o.PartialsTopic, 0)
	if !ok || end.Err != nil {
		return fmt.Errorf("pipeline: reading the end of %s: %v", p.o.PartialsTopic, end.Err)
	}
	for p.Merger.Position() < end.Offset {
		if err := p.Err(); err != nil {
			return err
		}
		if err := sleepCtx(ctx, time.Millisecond); err != nil {
			return fmt.Errorf("pipeline: merger at %d of %d partials: %w", p.Merger.Position(), end.Offset, err)
		}
	}
	return nil
}

// Partitions returns the number of partitions of the decision topic.
func (p *Pipeline) Partitions(ctx context.Context) (int32, error) {
	return partitions(ctx, p.adm, p.o.Topic)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Close stops both tiers; call it after ctx given to Start has ended, or
// instead. Safe to call twice.
func (p *Pipeline) Close() {
	p.closed.Do(func() {
		p.Consumer.Close()
		p.Merger.Close()
		p.wg.Wait()
		p.admCl.Close()
	})
}
