package pipeline

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/decision"
)

func TestProducerDropsWhenFullAndNeverBlocks(t *testing.T) {
	// No broker listens here: records pile up, then drop.
	prod, err := NewProducer(ProducerOptions{Brokers: []string{"127.0.0.1:1"}, Buffer: 8})
	if err != nil {
		t.Fatal(err)
	}
	for range 1000 {
		prod.Log(decision.Record{Time: time.UnixMilli(1), Outcome: decision.Allowed})
	}
	waitFor(t, "drops counted", 20*time.Second, func() bool {
		s := prod.Stats()
		return s.Logged == 1000 && s.Dropped >= 1000-2*8-1
	})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_ = prod.Flush(ctx)
}

// A limiter still deciding while its producer closes: Log after Close drops
// the record and counts it, and never panics.
func TestProducerLogAfterClose(t *testing.T) {
	brokers := newKafka(t)
	prod, err := NewProducer(ProducerOptions{Brokers: brokers})
	if err != nil {
		t.Fatal(err)
	}
	prod.Log(decision.Record{Time: time.UnixMilli(1), Outcome: decision.Allowed})
	prod.Close()
	prod.Close()
	prod.Log(decision.Record{Time: time.UnixMilli(2), Outcome: decision.Allowed})
	if s := prod.Stats(); s.Logged != 2 || s.Produced != 1 || s.Dropped != 1 {
		t.Fatalf("%+v: want the first produced and the one after Close dropped", s)
	}
}
