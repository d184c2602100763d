package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/pipeline/stage"
)

// Consumer is the partition tier: a consumer group (cooperative-sticky) on
// the decision topic. Each partition it owns has its own pipeline of two
// goroutines joined by bounded queues, fetch → decode → stages:
//
//   - the poll loop hands each partition's fetched batch to its decode
//     queue; when that queue is full it pauses fetching that partition (and
//     only that one) until the partition's stages catch up, so a slow stage
//     holds at most QueueBatches batches per queue in memory;
//   - the decoder sends undecodable records to the dead-letter topic (via
//     the stages goroutine, in order) and the rest on;
//   - the stages goroutine applies the watermark policy (see partState),
//     feeds each stage's open window, sends the partials of closed windows
//     and watermark markers to the partials topic, and only then moves the
//     partition's commit position.
//
// Offsets are committed (every CommitInterval, and for partitions being
// revoked) with the partition's watermark state in the commit metadata, so
// the next owner of a partition, after a rebalance or a restart, resumes at
// the first record of its oldest open window with the same watermark and
// rebuilds the same windows: delivery is at-least-once and the partials are
// the same as without the move.
//
// Build one with NewConsumer, call Run, then Close. Stats is safe to call
// from any goroutine.
type Consumer struct {
	o  Options
	cl *kgo.Client
	m  *consumerMetrics

	mu    sync.Mutex
	tasks map[int32]*task
	// rewind: partitions whose open-window state could not be read, to
	// read again from the state's rewind point (adjustOffsets).
	rewind map[int32]int64

	processed atomic.Int64
	closed    sync.Once
}

// NewConsumer creates the client and joins the group when Run starts
// polling. Stages are required.
func NewConsumer(o Options) (*Consumer, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	if len(o.Stages) == 0 {
		return nil, errors.New("pipeline: a consumer needs at least one stage")
	}
	m, err := newConsumerMetrics(o.Registerer, o.Stages)
	if err != nil {
		return nil, err
	}
	c := &Consumer{o: o, m: m, tasks: map[int32]*task{}}
	if err := registerLag(o.Registerer, "partition", c.lag); err != nil {
		return nil, err
	}
	if o.Registerer != nil {
		owned := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_pipeline_partitions_owned",
			Help: "Partitions of the decision topic this process's partition tier owns (a restarted static member has them back at once)."},
			func() float64 { return float64(c.owned()) })
		if err := o.Registerer.Register(owned); err != nil {
			return nil, fmt.Errorf("pipeline: registering metrics: %w", err)
		}
	}
	cl, err := kgo.NewClient(append(o.static(),
		kgo.SeedBrokers(o.Brokers...),
		kgo.ConsumerGroup(o.Group),
		kgo.ConsumeTopics(o.Topic),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.FetchMaxWait(100*time.Millisecond),
		kgo.FetchMaxBytes(32<<20),
		kgo.FetchMaxPartitionBytes(1<<20),
		kgo.OnOffsetsFetched(c.offsetsFetched),
		kgo.AdjustFetchOffsetsFn(c.adjustOffsets),
		kgo.OnPartitionsAssigned(c.assigned),
		kgo.OnPartitionsRevoked(c.revoked),
		kgo.OnPartitionsLost(c.lost),
		// Partials and dead letters: idempotent, ordered per partition.
		kgo.RecordDeliveryTimeout(30*time.Second),
		kgo.ProducerLinger(0),
		kgo.ProducerBatchMaxBytes(maxPartialBytes),
	)...)
	if err != nil {
		return nil, fmt.Errorf("pipeline: kafka consumer: %w", err)
	}
	c.cl = cl
	return c, nil
}

// ConsumerStats count what a Consumer has done since it started.
type ConsumerStats struct {
	Consumed  int64 // records fetched
	BadRecord int64 // failed to decode, sent to the dead-letter topic
	Late      int64 // left out by the watermark policy
	Resent    int64 // read again for windows already sent
	Partials  int64 // window states sent to the merge tier
	Pauses    int64 // times a partition's fetching was paused
}

// Stats returns the consumer's counters.
func (c *Consumer) Stats() ConsumerStats {
	return ConsumerStats{
		Consumed: c.m.fetched.Value(), BadRecord: c.m.decodeErrors.Value(),
		Late: c.m.latePast.Value() + c.m.lateFuture.Value(), Resent: c.m.resent.Value(),
		Partials: c.m.partials.Value(), Pauses: c.m.pauses.Value(),
	}
}

// owned is how many partitions the consumer owns.
func (c *Consumer) owned() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.tasks)
}

// Processed returns the number of records whose batch has been through the
// stages, with its partials sent.
func (c *Consumer) Processed() int64 { return c.processed.Load() }

// Run polls until ctx ends or the consumer is closed, and returns nil then;
// it returns the error if Kafka refuses it for good (FatalFetchError).
// It must be called once.
func (c *Consumer) Run(ctx context.Context) error {
	var lastCommit time.Time
	for {
		c.resumeReady()
		fs, ok, err := Poll(ctx, c.cl, c.o.MaxPollRecords, c.o.Logger)
		if !ok {
			c.cl.AllowRebalance()
			return err
		}
		c.mu.Lock()
		fs.EachPartition(func(fp kgo.FetchTopicPartition) {
			if len(fp.Records) == 0 {
				return
			}
			t := c.tasks[fp.Partition]
			if t == nil {
				// Assigned without offsets fetched: no callback ran for it.
				t = c.startTask(fp.Partition, stage.FreshCheckpoint, nil)
			}
			t.hwm.Store(fp.HighWatermark)
			c.m.fetched.Add(int64(len(fp.Records)))
			t.hand(fp.Records)
		})
		c.mu.Unlock()
		c.cl.AllowRebalance()
		if time.Since(lastCommit) >= c.o.CommitInterval {
			c.commit(ctx, nil)
			c.markIdle()
			lastCommit = time.Now()
		}
	}
}

// resumeReady gives paused partitions whose queue has room their held-back
// batch, and resumes fetching them. The poll loop calls it at least every
// 250 ms.
func (c *Consumer) resumeReady() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for p, t := range c.tasks {
		if t.paused && t.offer() {
			t.paused = false
			c.cl.ResumeFetchPartitions(map[string][]int32{c.o.Topic: {p}})
		}
	}
}

// markIdle tells the merge tier about partitions that have had no record
// for IdleTimeout and have nothing queued.
func (c *Consumer) markIdle() {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now().UnixNano()
	for _, t := range c.tasks {
		if !t.paused && now-t.lastRecord.Load() >= int64(c.o.IdleTimeout) && !t.idle.Load() && len(t.fetched) == 0 && len(t.decoded) == 0 {
			select {
			case t.decoded <- &batch{idle: true}:
				t.idle.Store(true)
			default:
			}
		}
	}
}

// commit commits the commit positions of the given partitions (all when
// nil) with their watermark state as metadata.
func (c *Consumer) commit(ctx context.Context, only []*task) {
	c.mu.Lock()
	if only == nil {
		for _, t := range c.tasks {
			only = append(only, t)
		}
	}
	c.mu.Unlock()
	offsets := map[int32]int64{}
	meta := map[int32]string{}
	for _, t := range only {
		if off, m, ok := t.toCommit(); ok {
			offsets[t.p] = off
			meta[t.p] = m
		}
	}
	if len(offsets) == 0 {
		return
	}
	if err := commitWithMetadata(ctx, c.cl, c.o.Topic, offsets, meta); err != nil {
		c.m.commitErrors.Inc()
		if ctx.Err() == nil {
			c.o.Logger.Warn("committing offsets failed; the records will be read again after a restart", "err", err)
		}
		return
	}
	for _, t := range only {
		if off, ok := offsets[t.p]; ok {
			t.committed(off)
		}
	}
}

// offsetsFetched starts a task for each newly assigned partition with the
// watermark state its last owner committed, or with the open windows of the
// state its committed position names (see Options.StateInterval).
func (c *Consumer) offsetsFetched(ctx context.Context, _ *kgo.Client, resp *kmsg.OffsetFetchResponse) error {
	type fetched struct {
		p      int32
		offset int64
		meta   *string
	}
	var ps []fetched
	eachFetched(resp, func(topic string, p int32, offset int64, meta *string) {
		if topic == c.o.Topic {
			ps = append(ps, fetched{p, offset, meta})
		}
	})
	for _, f := range ps {
		// Read outside c.mu: the poll loop goes on meanwhile.
		var restored *stage.Partition
		ck := stage.FreshCheckpoint
		rewind := int64(-1)
		if f.meta != nil && f.offset >= 0 {
			if stateOff, back, rck, ok := stage.ParseStateMeta(*f.meta); ok {
				st, next, err := c.readState(ctx, stateOff)
				if err == nil && next != f.offset {
					err = fmt.Errorf("the state is for offset %d, the committed offset is %d", next, f.offset)
				}
				if err == nil {
					restored = st
				} else {
					c.m.stateFails.Inc()
					c.o.Logger.Error("reading a partition's open-window state failed; reading its records again from the state's rewind point",
						"partition", f.p, "state_offset", stateOff, "rewind", back, "err", err)
					ck, rewind = rck, back
				}
			} else if x, ok := stage.ParsePartitionCheckpoint(*f.meta); ok {
				ck = x
			} else {
				c.o.Logger.Warn("partition committed without sluice's watermark state; starting with an empty watermark",
					"partition", f.p, "offset", f.offset)
			}
		}
		c.mu.Lock()
		if c.tasks[f.p] == nil {
			t := c.startTask(f.p, ck, restored)
			switch {
			case rewind >= 0:
				t.next.Store(rewind)
				if c.rewind == nil {
					c.rewind = map[int32]int64{}
				}
				c.rewind[f.p] = rewind
			case f.offset >= 0:
				t.next.Store(f.offset)
			}
		}
		c.mu.Unlock()
	}
	return nil
}

// adjustOffsets starts the partitions whose state could not be read at
// their rewind point rather than at their committed offset.
func (c *Consumer) adjustOffsets(_ context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for p, off := range c.rewind {
		if ps := offsets[c.o.Topic]; ps != nil {
			if _, ok := ps[p]; ok {
				ps[p] = kgo.NewOffset().At(off).WithEpoch(-1)
			}
		}
	}
	c.rewind = nil
	return offsets, nil
}

// readState reads the open-window state at offset off of the checkpoint
// topic.
func (c *Consumer) readState(ctx context.Context, off int64) (*stage.Partition, int64, error) {
	b, err := readRecordAt(ctx, c.o.Brokers, c.o.CheckpointTopic, off)
	if err != nil {
		return nil, 0, err
	}
	return stage.RestorePartition(c.o.Stages, c.o.Lateness.Milliseconds(), stage.MaxFutureMs(c.o.MaxFuture), b)
}

func (c *Consumer) assigned(context.Context, *kgo.Client, map[string][]int32) {}

// revoked stops the revoked partitions' tasks, commits what they finished,
// and forgets them.
func (c *Consumer) revoked(ctx context.Context, _ *kgo.Client, lost map[string][]int32) {
	ts := c.stopTasks(lost[c.o.Topic])
	c.commit(ctx, ts)
}

// lost stops the lost partitions' tasks without committing: another member
// may own them already.
func (c *Consumer) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	c.stopTasks(lost[c.o.Topic])
}

func (c *Consumer) stopTasks(ps []int32) []*task {
	c.mu.Lock()
	var ts []*task
	for _, p := range ps {
		if t := c.tasks[p]; t != nil {
			ts = append(ts, t)
			delete(c.tasks, p)
			if t.paused {
				c.cl.ResumeFetchPartitions(map[string][]int32{c.o.Topic: {p}})
			}
		}
	}
	c.mu.Unlock()
	for _, t := range ts {
		t.stop()
	}
	return ts
}

// lag is the records between each owned partition's high watermark and its
// next record to process.
func (c *Consumer) lag() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := int64(0)
	for _, t := range c.tasks {
		if h, next := t.hwm.Load(), t.next.Load(); h > next {
			n += h - next
		}
	}
	return float64(n)
}

// Close stops every task, leaves the group and closes the client. Safe to
// call twice.
func (c *Consumer) Close() {
	c.closed.Do(func() {
		c.mu.Lock()
		ps := make([]int32, 0, len(c.tasks))
		for p := range c.tasks {
			ps = append(ps, p)
		}
		c.mu.Unlock()
		ts := c.stopTasks(ps)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c.commit(ctx, ts)
		cancel()
		c.cl.Close()
	})
}

// startTask starts partition p's goroutines; c.mu is held.
func (c *Consumer) startTask(p int32, ck stage.PartitionCheckpoint, st *stage.Partition) *task {
	if st == nil {
		st = stage.NewPartition(c.o.Stages, c.o.Lateness.Milliseconds(), stage.MaxFutureMs(c.o.MaxFuture), ck)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t := &task{
		c: c, p: p, st: st,
		fetched: make(chan []*kgo.Record, c.o.QueueBatches), decoded: make(chan *batch, c.o.QueueBatches),
		ctx: ctx, cancel: cancel, done: make(chan struct{}), lastMarker: minInt64,
		stageIn: make([]int64, len(c.o.Stages)), commitOff: -1,
	}
	t.lastRecord.Store(time.Now().UnixNano())
	t.next.Store(-1)
	c.tasks[p] = t
	go t.decode()
	go t.run()
	return t
}

// task is one owned partition's decode and stages goroutines.
type task struct {
	c  *Consumer
	p  int32
	st *stage.Partition // owned by run

	fetched chan []*kgo.Record
	decoded chan *batch

	// Owned by the poll loop, under c.mu.
	held   []*kgo.Record // a batch that found the fetch queue full
	paused bool

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	lastRecord atomic.Int64 // wall time (ns) a record was last handed in
	idle       atomic.Bool  // an idle marker was queued since
	hwm, next  atomic.Int64 // high watermark; next offset to process

	// Owned by run.
	lastMarker int64
	markedIdle bool // the last marker sent said idle
	stageIn    []int64
	lastState  time.Time // when an open-window state was last written
	hasState   bool      // the position committed is a state's

	mu         sync.Mutex
	commitOff  int64  // -1: nothing to commit
	commitMeta string // its commit metadata: a watermark state or a state's
	dirty      bool
}

// batch is a decoded batch, or an idle mark.
type batch struct {
	recs []*kgo.Record
	decs []*decisionpb.Decision // nil where the record is bad or a punctuation
	errs []error                // decode errors, by record
	idle bool
}

// hand queues a fetched batch, pausing the partition when its queue is
// full; c.mu is held.
func (t *task) hand(recs []*kgo.Record) {
	t.lastRecord.Store(time.Now().UnixNano())
	t.idle.Store(false)
	if t.paused {
		t.held = append(t.held, recs...)
		return
	}
	select {
	case t.fetched <- recs:
	default:
		t.held, t.paused = recs, true
		t.c.m.pauses.Inc()
		t.c.cl.PauseFetchPartitions(map[string][]int32{t.c.o.Topic: {t.p}})
	}
}

// offer queues the held-back batch if there is room; c.mu is held.
func (t *task) offer() bool {
	select {
	case t.fetched <- t.held:
		t.held = nil
		return true
	default:
		return false
	}
}

func (t *task) stop() {
	t.cancel()
	<-t.done
}

func (t *task) decode() {
	for {
		var recs []*kgo.Record
		select {
		case <-t.ctx.Done():
			return
		case recs = <-t.fetched:
		}
		b := &batch{recs: recs, decs: make([]*decisionpb.Decision, len(recs)), errs: make([]error, len(recs))}
		for i, r := range recs {
			if isPunctuation(r) {
				continue
			}
			b.decs[i], b.errs[i] = decision.Decode(r.Value)
		}
		select {
		case <-t.ctx.Done():
			return
		case t.decoded <- b:
		}
	}
}

func isPunctuation(r *kgo.Record) bool {
	for _, h := range r.Headers {
		if h.Key == stage.PunctuationHeader {
			return true
		}
	}
	return false
}

func punctuation(r *kgo.Record) (int64, error) {
	for _, h := range r.Headers {
		if h.Key == stage.PunctuationHeader {
			return stage.ParsePunctuation(h.Value)
		}
	}
	return 0, errors.New("no punctuation header")
}

func (t *task) run() {
	defer close(t.done)
	for {
		var b *batch
		select {
		case <-t.ctx.Done():
			return
		case b = <-t.decoded:
		}
		if err := t.process(b); err != nil {
			return // stopped while sending
		}
	}
}

// process runs one batch through the stages and sends what it closed; it
// returns an error only when the task is stopped before the sends are
// acknowledged, and then the commit position does not move.
func (t *task) process(b *batch) error {
	start := time.Now()
	m := t.c.m
	var out []*kgo.Record
	var decoded, bad, past, future, nResent int64
	for i, r := range b.recs {
		d := b.decs[i]
		if d == nil && b.errs[i] == nil { // punctuation
			ts, err := punctuation(r)
			if err == nil && t.c.o.MaxFuture > 0 && ts > r.Timestamp.UnixMilli()+t.c.o.MaxFuture.Milliseconds() {
				err = fmt.Errorf("%w: punctuation at %d ms is more than %v past the record's timestamp", decision.ErrBadRecord, ts, t.c.o.MaxFuture)
			}
			if err == nil {
				t.st.Punctuate(ts)
			} else {
				bad++
				out = append(out, t.deadLetter(r, err))
			}
			continue
		}
		if b.errs[i] != nil {
			bad++
			out = append(out, t.deadLetter(r, b.errs[i]))
			continue
		}
		decoded++
		switch t.st.Observe(d, r.Offset, r.Timestamp.UnixMilli(), t.stageIn) {
		case stage.LatePast:
			past++
			if t.c.o.LateToDeadLetter {
				out = append(out, t.deadLetter(r, fmt.Errorf("late: event time %d ms is behind the partition's watermark %d ms", d.EventTimeMs, t.st.Watermark())))
			}
		case stage.LateFuture:
			future++
			if t.c.o.LateToDeadLetter {
				out = append(out, t.deadLetter(r, fmt.Errorf("late: event time %d ms is more than %v past the record's timestamp", d.EventTimeMs, t.c.o.MaxFuture)))
			}
		case stage.Resent:
			nResent++
		}
	}
	if b.idle {
		// Idle: close the windows this partition holds open, rather than
		// have the merge tier finish them without it.
		t.st.Seal()
	}
	due := t.st.Due()
	for _, w := range due {
		body, err := w.Partial.MarshalBinary()
		if err != nil {
			// A stage that cannot encode its own state is a bug; the
			// window is lost and the error says whose.
			t.c.o.Logger.Error("encoding a window's partial failed; the window is left out", "stage", t.c.o.Stages[w.Stage].Name(), "err", err)
			continue
		}
		pr := stage.PartialRecord{Kind: stage.KindPartial, Source: t.p, WM: t.st.Watermark(), Stage: t.c.o.Stages[w.Stage].Name(), Start: w.Start, End: w.End, Body: body}
		out = append(out, &kgo.Record{Topic: t.c.o.PartialsTopic, Key: []byte(pr.Stage), Value: pr.AppendTo(nil)})
	}
	nPartials := len(due)
	if err := t.send(out); err != nil {
		t.traceConsume(start, len(b.recs), nPartials, past+future, err)
		return err
	}
	// The marker goes alone, after every partial it closes is acknowledged:
	// a batch of several records is not atomic, and a marker read before a
	// partial it closes would finish the window without it.
	marked := false
	if wm := t.st.Watermark(); wm > t.lastMarker || b.idle != t.markedIdle {
		if err := t.send([]*kgo.Record{{Topic: t.c.o.PartialsTopic, Value: (&stage.PartialRecord{Kind: stage.KindMarker, Source: t.p, WM: wm, Idle: b.idle}).AppendTo(nil)}}); err != nil {
			return err
		}
		t.lastMarker, t.markedIdle, marked = wm, b.idle, true
	}
	next := t.next.Load()
	if n := len(b.recs); n > 0 {
		next = b.recs[n-1].Offset + 1
	}
	if next >= 0 {
		if err := t.position(next); err != nil {
			return err
		}
		t.next.Store(next)
	}
	t.c.processed.Add(int64(len(b.recs)))
	m.decoded.Add(decoded)
	m.decodeErrors.Add(bad)
	m.latePast.Add(past)
	m.lateFuture.Add(future)
	m.resent.Add(nResent)
	m.partials.Add(int64(nPartials))
	m.deadLetters.Add(bad)
	if t.c.o.LateToDeadLetter {
		m.deadLetters.Add(past + future)
	}
	for i, n := range t.stageIn {
		if n > 0 {
			m.stageIn[i].Add(n)
			t.stageIn[i] = 0
		}
	}
	if marked {
		m.markers.Inc()
	}
	m.batch.Observe(time.Since(start).Seconds())
	t.traceConsume(start, len(b.recs), nPartials, past+future, nil)
	return nil
}

// position sets the partition's commit position once every record before
// next is processed: the first record of its oldest open window, with the
// watermark state just before it (Checkpoint), or, when open windows reach
// back and a state is due (Options.StateInterval), next itself with the
// open windows' state written to the checkpoint topic. Between states the
// last state's position is kept, unless nothing reaches back. It returns an
// error only when the task is stopped while the state is written.
func (t *task) position(next int64) error {
	off, ck := t.st.Checkpoint(next)
	meta := ck.String()
	restored := t.st.Restored()
	interval := t.c.o.StateInterval
	switch {
	case !restored && (interval < 0 || off == next):
		// Nothing to restore: the records from off rebuild it all.
	case interval >= 0 && time.Since(t.lastState) >= interval:
		b, err := t.st.MarshalOpen(next)
		if err == nil && len(b) > maxPartialBytes-64<<10 {
			err = fmt.Errorf("%d bytes, more than the checkpoint topic takes", len(b))
		}
		if err != nil {
			t.lastState = time.Now() // not again before the next interval
			t.c.o.Logger.Error("encoding a partition's open windows failed; its position stays at its oldest open window", "partition", t.p, "err", err)
			if restored {
				return nil // the restored windows' position stays committed
			}
			break
		}
		rec := &kgo.Record{Topic: t.c.o.CheckpointTopic, Key: []byte("partition/" + t.c.o.Topic + "/" + strconv.Itoa(int(t.p))), Value: b}
		if err := t.send([]*kgo.Record{rec}); err != nil {
			return err
		}
		t.c.m.states.Inc()
		t.lastState, t.hasState = time.Now(), true
		off, meta = next, stage.StateMeta(rec.Offset, off, ck)
	case t.hasState || restored:
		return nil // the last state's position stays committed
	}
	t.mu.Lock()
	t.commitOff, t.commitMeta, t.dirty = off, meta, true
	t.mu.Unlock()
	return nil
}

// send produces the batch's dead letters, partials and marker, retrying
// with backoff until Kafka takes them or the task stops.
func (t *task) send(out []*kgo.Record) error {
	if len(out) == 0 {
		return nil
	}
	_, err := backoff.Retry(t.ctx, func() (struct{}, error) {
		var retry []*kgo.Record
		var err error
		for _, r := range t.c.cl.ProduceSync(t.ctx, out...) {
			switch {
			case r.Err == nil:
			case errors.Is(r.Err, kerr.MessageTooLarge):
				// No retry can send it: count it and go on without it.
				t.c.m.tooLarge.Inc()
				t.c.o.Logger.Error("a record for the merge tier or the dead-letter topic is larger than Kafka takes; it is left out",
					"partition", t.p, "topic", r.Record.Topic, "bytes", len(r.Record.Value), "err", r.Err)
			default:
				retry, err = append(retry, r.Record), r.Err
			}
		}
		if err != nil && t.ctx.Err() == nil {
			t.c.o.Logger.Warn("sending window states to the merge tier failed; retrying", "partition", t.p, "err", err)
		}
		out = retry
		return struct{}{}, err
	}, backoff.WithBackOff(backoff.NewExponentialBackOff()), backoff.WithMaxElapsedTime(0))
	return err
}

// deadLetter is r for the dead-letter topic, with why and where it came
// from in headers.
func (t *task) deadLetter(r *kgo.Record, err error) *kgo.Record {
	hs := append([]kgo.RecordHeader(nil), r.Headers...)
	hs = append(hs,
		kgo.RecordHeader{Key: "sluice-error", Value: []byte(err.Error())},
		kgo.RecordHeader{Key: "sluice-topic", Value: []byte(r.Topic)},
		kgo.RecordHeader{Key: "sluice-partition", Value: strconv.AppendInt(nil, int64(r.Partition), 10)},
		kgo.RecordHeader{Key: "sluice-offset", Value: strconv.AppendInt(nil, r.Offset, 10)},
		kgo.RecordHeader{Key: "sluice-timestamp", Value: strconv.AppendInt(nil, r.Timestamp.UnixMilli(), 10)},
	)
	return &kgo.Record{Topic: t.c.o.DeadLetterTopic, Key: r.Key, Value: r.Value, Headers: hs}
}

// toCommit returns the commit position if it moved since the last commit.
func (t *task) toCommit() (int64, string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.commitOff, t.commitMeta, t.dirty && t.commitOff >= 0
}

func (t *task) committed(off int64) {
	t.mu.Lock()
	if t.commitOff == off {
		t.dirty = false
	}
	t.mu.Unlock()
}
