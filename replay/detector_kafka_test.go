package replay_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/detector"
	"github.com/sluice-rl/sluice/pipeline"
	"github.com/sluice-rl/sluice/pipeline/stage"
)

type ruleLog struct {
	mu    sync.Mutex
	lines []string
}

func (w *ruleLog) Write(_ context.Context, o stage.Output) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range o.Rules {
		w.lines = append(w.lines, fmt.Sprintf("%d %s %s %v", r.Version, r.ID, r.Origin, r.Evidence))
	}
	return nil
}

func (w *ruleLog) get() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.lines)
}

func stages() []stage.Stage {
	s, err := detector.Signals(detector.Options{})
	if err != nil {
		panic(err)
	}
	return s
}

// The detector's rules, evidence included, are the same whether one
// consumer or four read the decisions.
func TestDetectorSameRulesWithOneOrFourConsumers(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var recs []*kgo.Record
	add := func(at time.Time, d *decisionpb.Decision) {
		d.Version, d.Outcome, d.EventTimeMs = 1, decisionpb.Outcome_OUTCOME_ALLOWED, at.UnixMilli()
		b, err := proto.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, &kgo.Record{Topic: pipeline.DefaultTopic, Key: []byte(d.Descriptors.ClientIp), Value: b, Timestamp: at})
	}
	for s := range 6 * 60 {
		at := t0.Add(time.Duration(s) * time.Second)
		for i := range 60 {
			c := r.IntN(2000)
			add(at.Add(time.Duration(i)*time.Second/60), &decisionpb.Decision{Status: 200, UserAgent: fmt.Sprint("browser-", c%7),
				Descriptors: &decisionpb.Descriptors{ClientIp: fmt.Sprintf("10.1.%d.%d", c/256, c%256), Asn: uint32(64500 + c%30), Ja4: fmt.Sprintf("t13d1516h2_8daaf6152771_%012x", c%6), Route: fmt.Sprint("/r", c%5)}})
		}
		if s >= 3*60 { // a scraper and a cluster on /login
			for i := range 15 {
				add(at.Add(time.Duration(i)*time.Second/15), &decisionpb.Decision{Status: 404, UserAgent: "python-requests/2.31",
					Descriptors: &decisionpb.Descriptors{ClientIp: "198.51.100.9", Asn: 64666, Ja4: "t13d1516h2_8daaf6152771_000000000009", Path: fmt.Sprintf("/x/%d", r.Int())}})
				b := r.IntN(5000)
				add(at.Add(time.Duration(i)*time.Second/15), &decisionpb.Decision{Status: 401,
					Descriptors: &decisionpb.Descriptors{ClientIp: fmt.Sprintf("172.16.%d.%d", b/256, b%256), Asn: uint32(7000 + b%20), Ja4: "t13d201100_2b729b4bf6f3_9e7b989ebec8", Route: "/login"}})
			}
		}
	}
	run := func(consumers int) []string {
		kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(8, pipeline.DefaultTopic))
		if err != nil {
			t.Fatal(err)
		}
		defer kc.Close()
		brokers := kc.ListenAddrs()
		w := &ruleLog{}
		o := pipeline.Options{Brokers: brokers, Writer: w, Lateness: 3 * time.Second, IdleTimeout: time.Minute, Stages: stages()}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		if err := pipeline.EnsureTopics(ctx, o, 0); err != nil {
			t.Fatal(err)
		}
		m, err := pipeline.NewMerger(o)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		go m.Run(ctx)
		var cs []*pipeline.Consumer
		for range consumers {
			co := o
			co.Stages = stages()
			c, err := pipeline.NewConsumer(co)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			go c.Run(ctx)
			cs = append(cs, c)
		}
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		fresh := make([]*kgo.Record, len(recs)) // a produced record keeps its context
		for i, r := range recs {
			fresh[i] = &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Timestamp: r.Timestamp}
		}
		if err := cl.ProduceSync(ctx, fresh...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if _, err := pipeline.Punctuate(ctx, brokers, pipeline.DefaultTopic, t0.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		want := int64(len(recs) + 8)
		deadline := time.Now().Add(3 * time.Minute)
		wait := func(what string, done func() bool) {
			for !done() {
				if time.Now().After(deadline) {
					t.Fatalf("timed out waiting for %s", what)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		wait("every record processed", func() bool {
			n := int64(0)
			for _, c := range cs {
				n += c.Processed()
			}
			return n >= want
		})
		// Then the merge tier has taken every partial, and written what it
		// finished.
		// Consumers that joined late may process some records twice, so
		// wait until the partials topic stops growing too.
		adm := kadm.NewClient(cl)
		for prev := int64(-1); ; {
			ends, err := adm.ListEndOffsets(ctx, pipeline.DefaultGroup+".partials")
			if err != nil {
				t.Fatal(err)
			}
			end, _ := ends.Lookup(pipeline.DefaultGroup+".partials", 0)
			if end.Offset == prev {
				break
			}
			prev = end.Offset
			wait("the merge tier", func() bool { return m.Position() >= end.Offset })
			time.Sleep(500 * time.Millisecond)
		}
		return w.get()
	}
	one := run(1)
	if len(one) < 2 {
		t.Fatalf("only %d rules: %v", len(one), one)
	}
	if four := run(4); !slices.Equal(one, four) {
		t.Fatalf("four consumers:\n%v\none:\n%v", four, one)
	}
}
