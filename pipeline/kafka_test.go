package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/internal/stagetest"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
)

const testPartitions = 8

// newKafka starts an in-process broker on loopback TCP with the decision
// topic and the pipeline's topics.
func newKafka(t *testing.T) []string {
	t.Helper()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(testPartitions, DefaultTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	brokers := kc.ListenAddrs()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := EnsureTopics(ctx, Options{Brokers: brokers}, 0); err != nil {
		t.Fatal(err)
	}
	return brokers
}

var t0 = time.UnixMilli(1_700_000_000_000) // a multiple of every test window

// decisions generates n encoded decision records over about span of event
// time, keyed by client IP (so by partition), each with its Kafka timestamp
// at its event time plus up to 2 s of disorder: none is late with a
// lateness of 3 s. It returns them with the exact count per window of size.
func decisions(seed uint64, n int, span, size time.Duration) ([]*kgo.Record, map[int64]int) {
	r := rand.New(rand.NewPCG(seed, 7))
	zipf := rand.NewZipf(r, 1.2, 1, 499)
	exact := map[int64]int{}
	out := make([]*kgo.Record, n)
	for i := range n {
		now := t0.Add(span * time.Duration(i) / time.Duration(n))
		et := now.Add(-time.Duration(r.IntN(2000)) * time.Millisecond).UnixMilli()
		ip := fmt.Sprintf("198.51.100.%d", zipf.Uint64())
		b, err := proto.Marshal(&decisionpb.Decision{Version: 1, EventTimeMs: et, Region: "eu", Outcome: decisionpb.Outcome_OUTCOME_ALLOWED,
			Descriptors: &decisionpb.Descriptors{ClientIp: ip}})
		if err != nil {
			panic(err)
		}
		out[i] = &kgo.Record{Topic: DefaultTopic, Key: []byte("client_ip=" + ip), Value: b, Timestamp: now}
		exact[stage.FloorDiv(et, size.Milliseconds())]++
	}
	return out, exact
}

func produce(t *testing.T, brokers []string, recs []*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// memWriter keeps what the merge tier wrote; the next fails writes fail.
type memWriter struct {
	mu     sync.Mutex
	shares []rules.Share
	fails  int
	calls  int
}

func (w *memWriter) Write(_ context.Context, o stage.Output) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls++
	if w.fails > 0 {
		w.fails--
		return errors.New("redis is down")
	}
	w.shares = append(w.shares, o.Shares...)
	return nil
}

// lines returns the written windows as "stage@end key", in write order.
func (w *memWriter) lines() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, s := range w.shares {
		out = append(out, fmt.Sprintf("%s@%d %s", s.RuleID, s.Version-t0.UnixMilli(), s.Key))
	}
	return out
}

func (w *memWriter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.shares)
}

func testStages() []stage.Stage { return slowStages(0) }

// slowStages are the test stages, taking delay over each record.
func slowStages(delay time.Duration) []stage.Stage {
	return []stage.Stage{&stagetest.CountStage{ID: "short", Size: 5 * time.Second, Delay: delay}, &stagetest.CountStage{ID: "long", Size: 20 * time.Second}}
}

func testOptions(brokers []string, w stage.Writer) Options {
	return Options{Brokers: brokers, Stages: testStages(), Writer: w, Lateness: 3 * time.Second,
		IdleTimeout: time.Minute, CommitInterval: 50 * time.Millisecond, CheckpointInterval: 50 * time.Millisecond}
}

// member is one consumer-tier process.
type member struct {
	c    *Consumer
	stop context.CancelFunc
	done chan struct{}
}

func startConsumer(t *testing.T, o Options) *member {
	t.Helper()
	return startConsumerWith(t, o, testStages())
}

// startConsumerWith starts a consumer with its own stage objects, as
// another process has.
func startConsumerWith(t *testing.T, o Options, stages []stage.Stage) *member {
	t.Helper()
	o.Stages = stages
	c, err := NewConsumer(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &member{c: c, stop: cancel, done: make(chan struct{})}
	go func() { defer close(m.done); _ = c.Run(ctx) }()
	t.Cleanup(m.close)
	return m
}

// owned is the number of partitions c has a task for.
func (m *member) close() {
	m.stop()
	<-m.done
	m.c.Close()
}

type mergeMember struct {
	m    *Merger
	stop context.CancelFunc
	done chan struct{}
}

func startMerger(t *testing.T, o Options) *mergeMember {
	t.Helper()
	o.Stages = testStages()
	mg, err := NewMerger(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &mergeMember{m: mg, stop: cancel, done: make(chan struct{})}
	go func() { defer close(m.done); _ = mg.Run(ctx) }()
	t.Cleanup(m.close)
	return m
}

func (m *mergeMember) close() {
	m.stop()
	<-m.done
	m.m.Close()
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// wantWindows is the number of windows the test stages finish for records
// whose exact per-window counts (5 s windows) are exact5.
func wantWindows(exact5 map[int64]int) int {
	long := map[int64]bool{}
	for start := range exact5 {
		long[stage.FloorDiv(start, 20_000)] = true
	}
	return len(exact5) + len(long)
}

// The same records give the same output, window by window and byte for
// byte, whether one consumer or four take them, and whether they arrive
// all at once (a fast replay) or over time while consumers join and leave
// and the merger is replaced (real time, with rebalances). Each window's
// record count is the exact count.
func TestSameOutputWhateverTheConsumers(t *testing.T) {
	recs, exact := decisions(1, 6000, 90*time.Second, 5*time.Second)
	end := t0.Add(time.Hour)
	want := wantWindows(exact)

	run := func(t *testing.T, consumers int, realtime bool) []string {
		brokers := newKafka(t)
		w := &memWriter{}
		o := testOptions(brokers, w)
		if !realtime {
			// The group forms first, so that every consumer owns partitions,
			// then the whole input arrives at once.
			startMerger(t, o)
			var cs []*member
			for range consumers {
				cs = append(cs, startConsumer(t, o))
			}
			waitFor(t, "every consumer to own partitions", 30*time.Second, func() bool {
				total := 0
				for _, c := range cs {
					n := c.c.owned()
					if n == 0 {
						return false
					}
					total += n
				}
				return total == testPartitions
			})
			produce(t, brokers, recs)
			if _, err := Punctuate(context.Background(), brokers, DefaultTopic, end); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "every window", 60*time.Second, func() bool { return w.count() >= want })
			for _, c := range cs {
				if c.c.Stats().Consumed == 0 {
					t.Fatalf("a consumer took no record: %+v", c.c.Stats())
				}
			}
			return w.lines()
		}
		// Real time: the records arrive in ten slices while the group
		// changes under them: one consumer, then four, then one leaves, and
		// the merger is replaced by another.
		first := startConsumer(t, o)
		mg := startMerger(t, o)
		var members []*member
		for i := range 10 {
			produce(t, brokers, recs[i*len(recs)/10:(i+1)*len(recs)/10])
			switch i {
			case 2:
				for range 3 {
					members = append(members, startConsumer(t, o))
				}
			case 5:
				first.close()
			case 7:
				waitFor(t, "a window merged", 30*time.Second, func() bool { return w.count() > 0 })
				mg.close()
				mg = startMerger(t, o)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if _, err := Punctuate(context.Background(), brokers, DefaultTopic, end); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "every window", 60*time.Second, func() bool { return len(dedupe(w.lines())) >= want })
		busy := 0
		if first.c.Stats().Consumed > 0 {
			busy++
		}
		for _, m := range members {
			if m.c.Stats().Consumed > 0 {
				busy++
			}
		}
		if busy < 2 {
			t.Fatalf("only %d consumer took records: the group did not rebalance under the stream", busy)
		}
		return dedupe(w.lines())
	}

	one := run(t, 1, false)
	if len(one) != want {
		t.Fatalf("one consumer wrote %d windows, want %d", len(one), want)
	}
	for _, l := range one {
		var stage string
		var endMs int64
		var n int
		if _, err := fmt.Sscanf(l, "%s", &stage); err != nil {
			t.Fatal(err)
		}
		name, at, _ := strings.Cut(stage, "@")
		fmt.Sscan(at, &endMs)
		fmt.Sscanf(l[strings.Index(l, "n="):], "n=%d", &n)
		exactN := 0
		if name == "short" {
			exactN = exact[t0.UnixMilli()+endMs-5000]
		} else {
			for s := t0.UnixMilli() + endMs - 20_000; s < t0.UnixMilli()+endMs; s += 5000 {
				exactN += exact[s]
			}
		}
		if n != exactN {
			t.Fatalf("%s: counted %d, exactly %d", l, n, exactN)
		}
	}
	t.Run("four consumers", func(t *testing.T) {
		if got := run(t, 4, false); !slices.Equal(got, one) {
			t.Fatalf("four consumers:\n%s\none:\n%s", strings.Join(got, "\n"), strings.Join(one, "\n"))
		}
	})
	t.Run("real time with rebalances", func(t *testing.T) {
		if got := run(t, 1, true); !slices.Equal(got, one) {
			t.Fatalf("real time:\n%s\nfast, one consumer:\n%s", strings.Join(got, "\n"), strings.Join(one, "\n"))
		}
	})
}

// dedupe drops windows written twice (a merger that took over finishes
// again what its predecessor finished after its last checkpoint), keeping
// the first; a window written twice must be written the same.
func dedupe(lines []string) []string {
	seen := map[string]string{}
	var out []string
	for _, l := range lines {
		id, rest, _ := strings.Cut(l, " ")
		if prev, ok := seen[id]; ok {
			if prev != rest {
				out = append(out, "CONFLICT "+l+" vs "+prev)
			}
			continue
		}
		seen[id] = rest
		out = append(out, l)
	}
	return out
}

// A slow stage pauses its own partitions: with one batch of room per queue,
// fetching stops while the stage works through what it holds, and resumes;
// every record is still counted once, exactly.
func TestSlowStagePausesItsPartitions(t *testing.T) {
	brokers := newKafka(t)
	recs, exact := decisions(3, 1500, 30*time.Second, 5*time.Second)
	produce(t, brokers, recs)
	if _, err := Punctuate(context.Background(), brokers, DefaultTopic, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	w := &memWriter{}
	o := testOptions(brokers, w)
	o.QueueBatches, o.MaxPollRecords = 1, 20
	mg := startMerger(t, o)
	c := startConsumerWith(t, o, slowStages(200*time.Microsecond))
	waitFor(t, "a backlog", 30*time.Second, func() bool { return c.c.lag() > 100 })
	want := wantWindows(exact)
	waitFor(t, "every window", 60*time.Second, func() bool { return w.count() >= want })
	// Caught up: no lag left in either tier.
	waitFor(t, "no lag", 10*time.Second, func() bool { return c.c.lag() == 0 && mg.m.Position() == mg.m.hwm.Load() })
	if mg.m.hwm.Load() == 0 {
		t.Fatal("the merge tier never saw the partials topic's high watermark")
	}
	if s := c.c.Stats(); s.Pauses == 0 || s.Late != 0 || s.Consumed != int64(len(recs))+testPartitions {
		t.Fatalf("consumer %+v: want pauses, and every record once", s)
	}
	total := 0
	for _, l := range w.lines() {
		if strings.HasPrefix(l, "short@") {
			var n int
			fmt.Sscanf(l[strings.Index(l, "n="):], "n=%d", &n)
			total += n
		}
	}
	if total != len(recs) {
		t.Fatalf("counted %d records, want %d", total, len(recs))
	}
}

// A partition that goes quiet closes the windows it holds open, so the
// merge tier, which stops waiting for it, finishes them with its records:
// every window's count stays exact.
func TestIdlePartitionClosesItsWindows(t *testing.T) {
	brokers := newKafka(t)
	w := &memWriter{}
	o := testOptions(brokers, w)
	o.IdleTimeout = 300 * time.Millisecond
	startMerger(t, o)
	c := startConsumer(t, o)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	exact := map[int64]int{}
	send := func(p int32, et time.Time) {
		b, err := proto.Marshal(&decisionpb.Decision{Version: 1, EventTimeMs: et.UnixMilli(), Region: "eu", Outcome: decisionpb.Outcome_OUTCOME_ALLOWED,
			Descriptors: &decisionpb.Descriptors{ClientIp: fmt.Sprintf("192.0.2.%d", p)}})
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: DefaultTopic, Partition: p, Value: b, Timestamp: et}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		exact[stage.FloorDiv(et.UnixMilli(), 5000)]++
	}
	// Every partition for 18 s of event time; then partition 0 alone, after
	// the others have been quiet past IdleTimeout.
	for ms := 0; ms < 18_000; ms += 250 {
		for p := range int32(testPartitions) {
			send(p, t0.Add(time.Duration(ms)*time.Millisecond))
		}
	}
	for ms := 18_000; ms < 60_000; ms += 250 {
		send(0, t0.Add(time.Duration(ms)*time.Millisecond))
		if ms < 21_000 {
			time.Sleep(100 * time.Millisecond) // partition 0 stays busy while the others go idle
		}
	}
	waitFor(t, "the window ending at 40 s", 30*time.Second, func() bool {
		return slices.ContainsFunc(w.lines(), func(l string) bool { return strings.HasPrefix(l, "short@40000 ") })
	})
	for _, l := range w.lines() {
		if !strings.HasPrefix(l, "short@") {
			continue
		}
		var end int64
		var n int
		fmt.Sscanf(l, "short@%d n=%d", &end, &n)
		if want := exact[t0.UnixMilli()+end-5000]; n != want {
			t.Errorf("%s: counted %d, exactly %d", l, n, want)
		}
	}
	if s := c.c.Stats(); s.Late != 0 {
		t.Errorf("consumer %+v: no record is late", s)
	}
}
