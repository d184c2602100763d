package pipeline_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/pipeline"
	"github.com/sluice-rl/sluice/pipeline/decisionpb"
	"github.com/sluice-rl/sluice/rules"
)

// countStage counts records per 10 s window and emits one share per window.
type countStage struct {
	win  *pipeline.Windows[*int]
	seen int
}

func (s *countStage) Observe(d *decisionpb.Decision) {
	s.seen++
	if n, ok := s.win.For(d.EventTimeMs); ok {
		*n++
	}
}

func (s *countStage) Advance(wm time.Time) pipeline.Output {
	var out pipeline.Output
	s.win.Close(wm.UnixMilli(), func(start, end time.Time, n *int) {
		out.Shares = append(out.Shares, rules.Share{RuleID: "r", Region: "eu", Fraction: float64(*n) / 100, Version: end.UnixMilli(), ComputedAt: end})
	})
	return out
}

type memWriter struct {
	mu    sync.Mutex
	out   []rules.Share
	fails int // the next fails writes fail
}

func (w *memWriter) Write(_ context.Context, o pipeline.Output) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fails > 0 {
		w.fails--
		return errors.New("redis is down")
	}
	w.out = append(w.out, o.Shares...)
	return nil
}

func (w *memWriter) shares() []rules.Share {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]rules.Share(nil), w.out...)
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Records go from the Producer through a kfake broker on loopback TCP to a
// consumer group; a bad record is counted and skipped; windows close on the
// watermark and their output reaches the writer.
func TestProducerToConsumerOverKfake(t *testing.T) {
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, pipeline.DefaultTopic))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	brokers := kc.ListenAddrs()

	prod, err := pipeline.NewProducer(pipeline.ProducerOptions{Brokers: brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	stage := &countStage{win: pipeline.NewWindows(10*time.Second, func() *int { return new(int) })}
	w := &memWriter{}
	cons, err := pipeline.NewConsumer(pipeline.ConsumerOptions{Brokers: brokers, Lateness: 5 * time.Second, Stages: []pipeline.Stage{stage}, Writer: w})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = cons.Run(ctx) }()
	defer func() { cancel(); <-done; cons.Close() }()

	// 30 records at 0..29 s: windows [0,10) [10,20) [20,30) of 10 each.
	t0 := time.UnixMilli(1_700_000_000_000).Truncate(10 * time.Second)
	for i := 0; i < 30; i++ {
		rec := enforcer.Record{Time: t0.Add(time.Duration(i) * time.Second), Outcome: enforcer.Allowed, Region: "eu"}
		rec.Descriptors[rules.KeyClientIP] = "192.0.2.1"
		prod.Log(rec)
	}
	// A record no decoder accepts, from another client.
	raw, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(pipeline.DefaultTopic))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if err := raw.ProduceSync(context.Background(), &kgo.Record{Value: []byte("not a decision")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := prod.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := prod.Stats(); s.Produced != 30 || s.Dropped != 0 || s.Failed != 0 {
		t.Fatalf("producer %+v", s)
	}
	eventually(t, "31 records consumed", func() bool { return cons.Stats().Consumed == 31 })
	if s := cons.Stats(); s.BadRecord != 1 || s.Late != 0 || stage.seen != 30 {
		t.Fatalf("consumer %+v, stage saw %d", s, stage.seen)
	}
	// The watermark is 29 s - 5 s: the windows ending at 10 s and 20 s have
	// closed, the one ending at 30 s has not.
	if got := w.shares(); len(got) != 2 || got[0].Fraction != 0.10 || got[1].Fraction != 0.10 {
		t.Fatalf("after the records: %+v, want two windows of 10", got)
	}
	if err := cons.AdvanceTo(context.Background(), t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got := w.shares(); len(got) != 3 || got[1].Fraction != 0.10 || got[2].Fraction != 0.10 {
		t.Fatalf("after the punctuation: %+v", got)
	}
	// A failed write loses nothing: the output is kept and written later.
	w.mu.Lock()
	w.fails = 1
	w.mu.Unlock()
	for i := 60; i < 80; i++ {
		prod.Log(enforcer.Record{Time: t0.Add(time.Duration(i) * time.Second), Outcome: enforcer.Allowed})
	}
	if err := prod.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the window after the failed write", func() bool { return len(w.shares()) == 4 })
	if s := cons.Stats(); s.WriteErrs != 1 || w.shares()[3].Fraction != 0.10 {
		t.Errorf("after a failed write: %+v %+v", s, w.shares())
	}
	// A record behind the watermark is late: counted, not observed.
	prod.Log(enforcer.Record{Time: t0, Outcome: enforcer.Denied})
	if err := prod.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the late record", func() bool { return cons.Stats().Late == 1 })
	if stage.seen != 50 {
		t.Errorf("stage saw %d records, want 50: the late one must not reach it", stage.seen)
	}
}

func TestProducerDropsWhenFullAndNeverBlocks(t *testing.T) {
	// No broker listens here: records pile up, then drop.
	prod, err := pipeline.NewProducer(pipeline.ProducerOptions{Brokers: []string{"127.0.0.1:1"}, Buffer: 8})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for i := 0; i < 1000; i++ {
		prod.Log(enforcer.Record{Time: time.UnixMilli(1), Outcome: enforcer.Allowed})
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("1000 Log calls took %v: Log must not block", d)
	}
	eventually(t, "drops counted", func() bool {
		s := prod.Stats()
		return s.Logged == 1000 && s.Dropped >= 1000-2*8-1
	})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_ = prod.Flush(ctx)
}
