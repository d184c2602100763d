package pipeline

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/syncbuf"

	"github.com/sluice-rl/sluice/decision"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
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

// TestProducerPingSeesRefusedRecords: a broker that answers but refuses
// every record (the topic is not there) fails Ping, and Ping passes again
// once records are acknowledged.
func TestProducerPingSeesRefusedRecords(t *testing.T) {
	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	prod, err := NewProducer(ProducerOptions{Brokers: kc.ListenAddrs(), DeliveryTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := prod.Ping(ctx); err != nil {
		t.Fatalf("Ping before any record: %v", err)
	}
	prod.Log(decision.Record{Time: time.UnixMilli(1), Outcome: decision.Allowed})
	waitFor(t, "the record refused", 20*time.Second, func() bool { return prod.Stats().Failed == 1 })
	if err := prod.Ping(ctx); err == nil || !strings.Contains(err.Error(), "refuses") {
		t.Fatalf("Ping with every record refused: %v, want an error", err)
	}
	adm := kadm.NewClient(prod.cl)
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, DefaultTopic); err != nil {
		t.Fatal(err)
	}
	prod.Log(decision.Record{Time: time.UnixMilli(2), Outcome: decision.Allowed})
	waitFor(t, "the record produced", 20*time.Second, func() bool { return prod.Stats().Produced == 1 })
	if err := prod.Ping(ctx); err != nil {
		t.Fatalf("Ping once records flow again: %v", err)
	}
}

// TestProducerLogsDrops: records dropped for a full buffer are counted and
// said in the log (once per 10 s), not only in a metric: found by a fresh
// user, whose sidecar dropped 199 776 records with Kafka down and logged
// nothing.
func TestProducerLogsDrops(t *testing.T) {
	var buf syncbuf.Buffer
	p, err := NewProducer(ProducerOptions{Brokers: []string{"127.0.0.1:1"}, Buffer: 4,
		Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for range 1000 {
		p.Log(decision.Record{})
	}
	if s := p.Stats(); s.Dropped == 0 {
		t.Fatalf("no record dropped with a buffer of 4 and Kafka unreachable: %+v", s)
	}
	if n := strings.Count(buf.String(), "dropping decision records"); n != 1 {
		t.Errorf("%d warnings of drops in the log, want one (at most one per 10 s):\n%s", n, buf.String())
	}
}

// TestProducerCloseSaysWhatWasLost: found by a fresh user. Records still
// waiting for an unreachable Kafka at shutdown were lost with one line,
// "failed_so_far=1", logged before most of them failed. Close says how
// many Kafka never acknowledged, and the counters account for each.
func TestProducerCloseSaysWhatWasLost(t *testing.T) {
	var buf syncbuf.Buffer
	p, err := NewProducer(ProducerOptions{Brokers: []string{"127.0.0.1:1"},
		Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		p.Log(decision.Record{})
	}
	p.Close()
	s := p.Stats()
	if s.Logged != 50 || s.Produced != 0 || s.Failed+s.Dropped != 50 {
		t.Errorf("stats %+v: want 50 logged, each failed or dropped", s)
	}
	if !strings.Contains(buf.String(), "records Kafka never acknowledged") || !strings.Contains(buf.String(), "lost=50 logged=50 produced=0") {
		t.Errorf("Close said nothing of the 50 records lost:\n%s", buf.String())
	}
}
