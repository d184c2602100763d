package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Merger is the merge tier: a consumer group (Options.Group + "-merge") on
// the one-partition partials topic, so one member at a time merges. It
// collects every source partition's partial of each window, finishes a
// window once the slowest source partition's watermark has passed its end
// (idle partitions aside), and writes the output with the Writer, retrying
// with backoff until it succeeds: while Redis is down the merge tier stops
// taking records (its fetch buffer is bounded) and the partition tier goes
// on.
//
// After finishing windows, at most every CheckpointInterval, it writes a
// checkpoint (each stage's cross-window state, the finished watermark and
// each source partition's watermark) to the checkpoint topic, then commits
// the partials-topic offset of the oldest pending window's first partial
// with the checkpoint's offset as metadata. A member that takes over
// restores the checkpoint and reads the partials from there: it rebuilds the
// pending windows and finishes them as the first member would have (output
// written after the last checkpoint is written again: at-least-once).
//
// Build one with NewMerger, call Run, then Close. Stats is safe to call from
// any goroutine.
type Merger struct {
	o   Options
	cl  *kgo.Client
	adm *kadm.Client
	m   *mergeMetrics

	mu       sync.Mutex
	st       *stage.Merge // nil while the partials partition is not owned
	unsent   stage.Output // output of finished windows not written yet
	next     int64        // next partials offset to take
	dirty    bool         // windows finished since the last checkpoint
	lastCkpt time.Time

	sources  atomic.Int32 // partitions of the decision topic
	hwm      atomic.Int64
	position atomic.Int64 // next partials offset taken, for Sync and lag
	yield    atomic.Bool  // a rebalance waits: stop retrying the write
	windows  atomic.Int64

	stop   context.Context // ends on Close: a write in progress gives up
	cancel context.CancelFunc
	closed sync.Once
}

// NewMerger creates the client; Run joins the group. A Writer is required.
func NewMerger(o Options) (*Merger, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	if o.Writer == nil {
		return nil, errors.New("pipeline: a merger needs a writer")
	}
	m, err := newMergeMetrics(o.Registerer)
	if err != nil {
		return nil, err
	}
	mg := &Merger{o: o, m: m}
	mg.stop, mg.cancel = context.WithCancel(context.Background())
	if err := registerLag(o.Registerer, "merge", func() float64 { return float64(max(0, mg.hwm.Load()-mg.position.Load())) }); err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(append(o.static(),
		kgo.SeedBrokers(o.Brokers...),
		kgo.ConsumerGroup(o.Group+"-merge"),
		kgo.ConsumeTopics(o.PartialsTopic),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.FetchMaxWait(100*time.Millisecond),
		kgo.FetchMaxBytes(16<<20),
		kgo.OnOffsetsFetched(mg.offsetsFetched),
		kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) {}),
		kgo.OnPartitionsCallbackBlocked(func(context.Context, *kgo.Client) { mg.yield.Store(true) }),
		kgo.OnPartitionsRevoked(mg.revoked),
		kgo.OnPartitionsLost(mg.lost),
		kgo.DefaultProduceTopic(o.CheckpointTopic),
		kgo.RecordDeliveryTimeout(30*time.Second),
		kgo.ProducerLinger(0),
		kgo.ProducerBatchMaxBytes(maxPartialBytes),
		kgo.FetchMaxPartitionBytes(maxPartialBytes),
	)...)
	if err != nil {
		return nil, fmt.Errorf("pipeline: kafka merger: %w", err)
	}
	mg.cl, mg.adm = cl, kadm.NewClient(cl)
	return mg, nil
}

// MergerStats count what a Merger has done since it started.
type MergerStats struct {
	Partials   int64 // merged into a pending window
	Duplicates int64 // a window's partial from a partition it had already
	AfterClose int64 // for a window already finished
	Bad        int64 // undecodable or for an unknown stage
	Windows    int64 // windows finished
	Outputs    int64 // rules and shares written
	WriteErrs  int64 // failed write attempts (each retried)
}

// Stats returns the merger's counters.
func (mg *Merger) Stats() MergerStats {
	return MergerStats{
		Partials: mg.m.partials[stage.PartialMerged].Value(), Duplicates: mg.m.partials[stage.PartialDuplicate].Value(),
		AfterClose: mg.m.partials[stage.PartialFinished].Value(), Bad: mg.m.partials[stage.PartialBad].Value(),
		Windows: mg.windows.Load(), Outputs: mg.m.outputs.Value(), WriteErrs: mg.m.writeErrors.Value(),
	}
}

// Run merges until ctx ends or the merger is closed, and returns nil then;
// it returns the error if Kafka refuses it for good (FatalFetchError).
func (mg *Merger) Run(ctx context.Context) error {
	var lastMeta time.Time
	for {
		if time.Since(lastMeta) > 10*time.Second || mg.sources.Load() == 0 && time.Since(lastMeta) > 250*time.Millisecond {
			mg.refreshSources(ctx)
			lastMeta = time.Now()
		}
		fs, ok, err := Poll(ctx, mg.cl, 10_000, mg.o.Logger)
		if !ok {
			mg.cl.AllowRebalance()
			return err
		}
		mg.mu.Lock()
		if mg.st != nil {
			mg.process(ctx, fs)
		}
		mg.mu.Unlock()
		mg.cl.AllowRebalance()
	}
}

// process takes one poll's records, finishes windows and checkpoints;
// mg.mu is held.
func (mg *Merger) process(ctx context.Context, fs kgo.Fetches) {
	start := time.Now()
	n := 0
	fs.EachPartition(func(fp kgo.FetchTopicPartition) {
		mg.hwm.Store(fp.HighWatermark)
		for _, r := range fp.Records {
			n++
			pr, err := stage.DecodePartialRecord(r.Value)
			res := stage.PartialBad
			if err == nil {
				res = mg.st.Add(&pr, r.Offset)
			} else {
				mg.o.Logger.Warn("skipping a bad record of the partials topic", "offset", r.Offset, "err", err)
			}
			if pr.Kind != stage.KindMarker || err != nil {
				mg.m.partials[res].Inc()
			}
			mg.next = r.Offset + 1
		}
	})
	mg.m.in.Add(int64(n))
	mg.st.Sources = mg.sources.Load()
	done := mg.st.Advance()
	for _, f := range done {
		for _, err := range f.Errs {
			mg.m.mergeErrors.Inc()
			mg.o.Logger.Warn("left a partial out of its window", "err", err)
		}
		mg.unsent.Add(f.Out)
	}
	mg.windows.Add(int64(len(done)))
	mg.dirty = mg.dirty || len(done) > 0
	mg.yield.Store(false)
	ctx, span := mg.traceMerge(ctx, start, n, done)
	defer endSpan(span, nil)
	if !mg.write(ctx, mg.unsent) {
		// Stopped before the output was written (shutdown, or a rebalance
		// waits): it is kept for the next round, and no checkpoint covers
		// its windows until it is written, so a member that takes over
		// finishes them again.
		return
	}
	mg.unsent = stage.Output{}
	// Taken, and what it finished written: Sync may go on.
	mg.position.Store(mg.next)
	if mg.dirty && time.Since(mg.lastCkpt) >= mg.o.CheckpointInterval {
		// Windows finished and written since the last checkpoint.
		mg.checkpoint(ctx)
	}
	if n > 0 {
		mg.m.batch.Observe(time.Since(start).Seconds())
	}
}

// write delivers out, retrying with backoff; false if the merger stopped
// (ctx ended or the partition is being revoked) first.
func (mg *Merger) write(ctx context.Context, out stage.Output) bool {
	if out.Len() == 0 {
		return true
	}
	span := mg.traceWrite(ctx, out)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(mg.stop, cancel)()
	_, err := backoff.Retry(wctx, func() (struct{}, error) {
		if mg.yield.Load() {
			return struct{}{}, backoff.Permanent(errors.New("a rebalance waits"))
		}
		err := mg.o.Writer.Write(wctx, out)
		if err != nil {
			mg.m.writeErrors.Inc()
			mg.o.Logger.Warn("writing stage output failed; retrying", "err", err, "rules", len(out.Rules), "shares", len(out.Shares))
		}
		return struct{}{}, err
	}, backoff.WithBackOff(&backoff.ExponentialBackOff{InitialInterval: 100 * time.Millisecond, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: 5 * time.Second}),
		backoff.WithMaxElapsedTime(0))
	endSpan(span, err)
	if err != nil {
		return false
	}
	mg.m.outputs.Add(int64(out.Len()))
	return true
}

// checkpoint writes the merge state to the checkpoint topic and commits the
// partials offset with the checkpoint's offset; mg.mu is held.
func (mg *Merger) checkpoint(ctx context.Context) {
	ck, err := mg.st.Checkpoint()
	if err != nil {
		mg.o.Logger.Error("checkpointing the merge failed", "err", err)
		return
	}
	rec := &kgo.Record{Key: []byte(mg.o.Group), Value: ck.Marshal()}
	if err := mg.cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		mg.m.ckptErrors.Inc()
		mg.o.Logger.Warn("writing a merge checkpoint failed; will retry", "err", err)
		return
	}
	cerr := commitWithMetadata(ctx, mg.cl, mg.o.PartialsTopic, map[int32]int64{0: mg.st.CommitOffset(mg.next)}, map[int32]string{0: stage.MergeMeta(rec.Offset)})
	if cerr != nil {
		mg.m.ckptErrors.Inc()
		mg.o.Logger.Warn("committing the merge position failed; will retry", "err", cerr)
		return
	}
	mg.m.checkpoints.Inc()
	mg.dirty, mg.lastCkpt = false, time.Now()
}

// offsetsFetched takes over the partials partition: a fresh merge state,
// restored from the checkpoint the committed offset names.
func (mg *Merger) offsetsFetched(ctx context.Context, _ *kgo.Client, resp *kmsg.OffsetFetchResponse) error {
	meta, found := "", false
	eachFetched(resp, func(topic string, p int32, offset int64, m *string) {
		if topic == mg.o.PartialsTopic && p == 0 {
			found = true
			if m != nil && offset >= 0 {
				meta = *m
			}
		}
	})
	if !found {
		return nil
	}
	st := stage.NewMerge(mg.o.Stages, mg.sources.Load())
	if off, ok := stage.ParseMergeMeta(meta); ok {
		if err := mg.restore(ctx, st, off); err != nil {
			mg.m.restoreFails.Inc()
			mg.o.Logger.Error("restoring the merge checkpoint failed; the stages start without their cross-window state", "offset", off, "err", err)
			st = stage.NewMerge(mg.o.Stages, mg.sources.Load())
		}
	}
	mg.mu.Lock()
	mg.st, mg.unsent, mg.dirty = st, stage.Output{}, false
	mg.mu.Unlock()
	return nil
}

// restore reads the checkpoint at offset off into st.
func (mg *Merger) restore(ctx context.Context, st *stage.Merge, off int64) error {
	b, err := readRecordAt(ctx, mg.o.Brokers, mg.o.CheckpointTopic, off)
	if err != nil {
		return err
	}
	ck, err := stage.UnmarshalMergeCheckpoint(b)
	if err != nil {
		return err
	}
	return st.Restore(ck)
}

func (mg *Merger) revoked(ctx context.Context, _ *kgo.Client, ps map[string][]int32) {
	if len(ps[mg.o.PartialsTopic]) == 0 {
		return
	}
	mg.mu.Lock()
	defer mg.mu.Unlock()
	if mg.st != nil && mg.dirty && mg.unsent.Len() == 0 {
		mg.checkpoint(ctx)
	}
	mg.st, mg.unsent = nil, stage.Output{}
}

func (mg *Merger) lost(_ context.Context, _ *kgo.Client, ps map[string][]int32) {
	if len(ps[mg.o.PartialsTopic]) == 0 {
		return
	}
	mg.mu.Lock()
	mg.st, mg.unsent = nil, stage.Output{}
	mg.mu.Unlock()
}

// refreshSources reads the decision topic's partition count.
func (mg *Merger) refreshSources(ctx context.Context) {
	mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, err := partitions(mctx, mg.adm, mg.o.Topic)
	if err != nil {
		if ctx.Err() == nil {
			mg.o.Logger.Warn("reading the decision topic's partitions failed", "topic", mg.o.Topic, "err", err)
		}
		return
	}
	mg.sources.Store(n)
}

// Position returns the partials-topic offset up to which the merger has
// taken every record and written the output of the windows they finished.
func (mg *Merger) Position() int64 { return mg.position.Load() }

// Close leaves the group and closes the client. Safe to call twice.
func (mg *Merger) Close() {
	mg.closed.Do(func() {
		mg.yield.Store(true)
		mg.cancel()
		mg.cl.Close()
	})
}
