package replay

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluice-rl/sluice/aggregator"
	"github.com/sluice-rl/sluice/analytics"
	"github.com/sluice-rl/sluice/detector"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/pipeline"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/replay/accesslog"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
	"github.com/sluice-rl/sluice/sketch"
)

//go:embed default-rules.yaml
var defaultRules []byte

// DefaultRules returns the rule set replays use when none is given.
func DefaultRules() *rules.Set {
	s, err := rules.Parse("default-rules.yaml", defaultRules)
	if err != nil {
		panic(err) // the embedded file is tested
	}
	return s
}

// DefaultRegions are the regions replays simulate when none are given.
var DefaultRegions = []string{"us-east", "eu-west", "ap-south"}

// Options configure Run. Zero fields take the defaults named on each.
type Options struct {
	Regions []string   // default DefaultRegions
	Rules   *rules.Set // default DefaultRules()
	// RedisAddr is a redis-server to use, one database per region from
	// RedisDB (default 0) on; Run flushes those databases first. Empty: an
	// in-process Redis per region.
	RedisAddr string
	RedisDB   int
	// RedisAuth, when set, sets each region's client's credentials and
	// TLS (Username, Password or CredentialsProviderContext, TLSConfig)
	// before it connects to RedisAddr.
	RedisAuth func(*redis.Options)
	// Brokers of a Kafka cluster. Empty: an in-process kfake broker on
	// loopback TCP. Each run has topics and consumer groups of its own,
	// named sluice-replay-<unix ns> (the decision topic, with 4
	// partitions; its dead-letter, partials and checkpoint topics), so that
	// a replay never reads another's records, offsets or watermarks; it
	// deletes its topics when it ends.
	Brokers []string
	// DataDir is the shared data folder for ASN and JA4 enrichment; empty
	// skips both.
	DataDir string
	// Barrier is the event-time step at which the replay waits for the
	// pipeline to consume everything logged so far and the enforcers reload
	// dynamic rules and shares: "within seconds" in event time, so a replay
	// gives the same result however fast it runs. Default 10 s, the
	// aggregator's interval.
	Barrier time.Duration
	// Stall bounds how long a barrier waits for the pipeline while it
	// makes no progress (no record consumed, no partial merged), and how
	// long a decision and a reload wait for Redis (the enforcers' Budget):
	// a replay waits as long as its parts work, however slow the machine,
	// so that its results depend on event time alone, and stops with an
	// error only when one is stuck. Default 30 s.
	Stall time.Duration
	// Lateness of the pipeline's watermark. Default 10 s.
	Lateness time.Duration
	// Reorder is the horizon within which each source's requests are put
	// in event-time order (see Reorder). Default 2 min.
	Reorder time.Duration
	// Detector holds the signals' options (detector.Signals); zero: the
	// defaults.
	Detector detector.Options
	// Aggregator: Regions and Rules are filled in, and Interval defaults
	// to Barrier.
	Aggregator aggregator.Options
	Logger     *slog.Logger // default: discard
	// Progress, when set, is called from Run's goroutine with the requests
	// decided so far, every ProgressEvery of them and once at the end of
	// the input: for a progress bar.
	Progress func(requests int)
	// ClickHouse, when set, also writes the run's decision records, dynamic
	// rules and shares to that ClickHouse (its database migrated first)
	// through an analytics.Sink in a consumer group of its own; the
	// pipeline publishes its output to the run's output topic
	// (sluice-replay-<ns>.output) for it. Nothing waits for the sink until
	// the end, when Run waits up to ClickHouseWait for it to have written
	// everything (a problem in the report otherwise).
	ClickHouse *analytics.ConnOptions
	// ClickHouseWait bounds that wait. Default 5 min.
	ClickHouseWait time.Duration
	// Output, when set, also receives the pipeline's output (dynamic rules
	// and shares) once the regions' Redis took it: e.g. a CrowdSec alert
	// pusher (crowdsec.AlertPusher). An error it returns is the pipeline's
	// write error, retried.
	Output stage.Writer
	// Backend, when set, answers every allowed request with a status drawn
	// from its model of the backend's health and reports it to the
	// enforcers, for adaptive rules and load shedding; the report's
	// Adaptive series follows. Nil: no responses are reported.
	Backend *Backend
}

// ProgressEvery is how many requests go between two Options.Progress calls.
const ProgressEvery = 1000

// Run replays sources through one enforcer per region, Kafka, the detector
// and the aggregator, and returns the report. Requests from several sources
// are merged by event time. A malformed line is counted and reported, never
// fatal.
func Run(ctx context.Context, o Options, sources ...Source) (*Report, error) {
	if len(o.Regions) == 0 {
		o.Regions = DefaultRegions
	}
	if o.Rules == nil {
		o.Rules = DefaultRules()
	}
	if o.Barrier <= 0 {
		o.Barrier = 10 * time.Second
	}
	if o.Stall <= 0 {
		o.Stall = 30 * time.Second
	}
	if o.Lateness <= 0 {
		o.Lateness = 10 * time.Second
	}
	if o.Reorder <= 0 {
		o.Reorder = 2 * time.Minute
	}
	if o.Aggregator.Interval <= 0 {
		// The barrier's step: a replay reloads shares once per barrier, and
		// a day of 250 ms intervals (the live default) would only add
		// partials.
		o.Aggregator.Interval = o.Barrier
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if err := validRegions(o.Regions); err != nil {
		return nil, err
	}
	if o.Backend != nil {
		if err := o.Backend.check(); err != nil {
			return nil, err
		}
	}
	if o.RedisDB < 0 {
		return nil, fmt.Errorf("replay: --redis-db %d: a Redis database number is >= 0", o.RedisDB)
	}
	if o.RedisDB > 0 && o.RedisAddr == "" {
		return nil, fmt.Errorf("replay: --redis-db %d without --redis (or REDIS_ADDR): the in-process Redis has no databases to choose", o.RedisDB)
	}
	start := time.Now()
	rep := &Report{Regions: o.Regions, Rules: o.Rules, byRule: map[string]*RuleCounts{}, denied: map[string]*sketch.TopK{}}

	// Redis, one per region. No retries: a script call that timed out may
	// have run, and running it again would charge the request twice.
	clients := make([]redis.UniversalClient, len(o.Regions))
	var minis []*miniredis.Miniredis
	stores := map[string]*store.Store{}
	for i, region := range o.Regions {
		ro := &redis.Options{Addr: o.RedisAddr, DB: o.RedisDB + i, MaxRetries: -1, ContextTimeoutEnabled: true, DialerRetries: 1,
			// A slow answer is waited for as a slow pipeline is (Stall): a
			// read cut short by a busy machine degraded a decision or kept
			// a barrier's old rules, and two replays of one input differed.
			DialTimeout: time.Second, ReadTimeout: o.Stall, WriteTimeout: o.Stall}
		if o.RedisAddr == "" {
			m := miniredis.NewMiniRedis()
			if err := m.Start(); err != nil {
				return nil, fmt.Errorf("replay: in-process redis: %w", err)
			}
			defer m.Close()
			minis = append(minis, m)
			ro.Addr, ro.DB = m.Addr(), 0
		} else if o.RedisAuth != nil {
			o.RedisAuth(ro)
		}
		c := redis.NewClient(ro)
		defer c.Close()
		// Selecting the database on connect checks that it exists.
		if err := c.Ping(ctx).Err(); err != nil {
			var hint string
			var op *net.OpError
			switch {
			case strings.Contains(err.Error(), "DB index is out of range"):
				hint = " (each region takes a database from --redis-db on: lower --redis-db, or raise the server's `databases` setting)"
			case errors.As(err, &op):
				hint = " (is a redis-server running there? Without --redis and REDIS_ADDR the replay runs an in-process Redis)"
			}
			addr := ro.Addr
			if i := strings.LastIndex(addr, "@"); i >= 0 { // never echo a password
				addr = "..." + addr[i:]
			}
			return nil, fmt.Errorf("replay: redis %s database %d (region %s): %w%s", addr, ro.DB, region, err, hint)
		}
		clients[i] = c
		stores[region] = store.NewStore(c)
	}
	if o.RedisAddr != "" { // every database answered: only now flush them
		for i, c := range clients {
			if err := c.FlushDB(ctx).Err(); err != nil {
				return nil, fmt.Errorf("replay: flushing redis %s database %d: %w", o.RedisAddr, o.RedisDB+i, err)
			}
		}
	}
	if o.RedisAddr == "" {
		rep.Redis = "in-process (miniredis), one per region"
	} else {
		rep.Redis = fmt.Sprintf("redis-server at %s, databases %d-%d (flushed)", o.RedisAddr, o.RedisDB, o.RedisDB+len(o.Regions)-1)
	}

	// Kafka.
	run := fmt.Sprintf("sluice-replay-%d", time.Now().UnixNano())
	brokers := o.Brokers
	if len(brokers) == 0 {
		kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, run),
			kfake.BrokerConfigs(map[string]string{"log.segment.bytes": strconv.Itoa(kfakeSegmentBytes)}))
		if err != nil {
			return nil, fmt.Errorf("replay: in-process kafka: %w", err)
		}
		defer kc.Close()
		brokers = kc.ListenAddrs()
		rep.Kafka = fmt.Sprintf("in-process (kfake) at %s, topic %q with 4 partitions", brokers[0], run)
	} else {
		rep.Kafka = fmt.Sprintf("%v, topic %q with 4 partitions (deleted at the end)", brokers, run)
	}
	// A quarter of the sidecar's buffer (16 384 records, 10.5 MiB, where
	// 65 536 took 42 MiB of the heap from the start): one goroutine
	// decides, each decision waits for Redis meanwhile the producer drains,
	// and every barrier flushes. A full buffer would drop records, which
	// the report lists as a problem.
	prod, err := pipeline.NewProducer(pipeline.ProducerOptions{Brokers: brokers, Topic: run, Logger: o.Logger, DeliveryTimeout: 10 * time.Second,
		Buffer: 16384})
	if err != nil {
		return nil, err
	}
	defer prod.Close()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = prod.Ping(pctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("replay: kafka at %v: %w (omit --brokers to use the in-process broker)", brokers, err)
	}

	// The slow loop.
	ag := o.Aggregator
	ag.Regions, ag.Rules = o.Regions, o.Rules.Rules
	shares, err := aggregator.New(ag)
	if err != nil {
		return nil, err
	}
	// The fast loop's enrichment; its ASN data also tells the
	// fake-crawler signal each crawler operator's address space.
	en, note := OpenEnricher(o.DataDir, o.Regions)
	defer en.Close()
	rep.Enrichment = note
	if o.Detector.FakeCrawlers.Holdings == nil && en.ASN != nil {
		o.Detector.FakeCrawlers.Holdings = en.ASN
	}
	signals, err := detector.Signals(o.Detector)
	if err != nil {
		return nil, err
	}
	rec := &recordingWriter{w: pipeline.NewRegionWriter(stores), rep: rep, out: o.Output}
	var sink *analytics.Sink
	if o.ClickHouse != nil {
		var closeSink func()
		sink, closeSink, err = startSink(ctx, o, brokers, run, rec, rep)
		if err != nil {
			return nil, err
		}
		defer closeSink()
	}
	po := pipeline.Options{
		Brokers: brokers, Topic: run, Group: run, Lateness: o.Lateness, Logger: o.Logger, Writer: rec,
		Stages: append(signals, shares),
		// A replay commits often, so that the in-process broker can drop
		// what is consumed (see trimmer); it checkpoints the merge once a
		// second, as each checkpoint holds the whole merge state (hundreds
		// of kilobytes on a big log) and none is read unless it restarts.
		CommitInterval: 100 * time.Millisecond, CheckpointInterval: time.Second,
		// The replay's clock is the log's: no Kafka timestamp bounds it, and
		// it punctuates every partition at each barrier instead of waiting
		// for idle partitions.
		MaxFuture: -1, IdleTimeout: 24 * time.Hour,
	}
	ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = pipeline.EnsureTopics(ectx, po, 4)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	if len(o.Brokers) > 0 {
		defer func() { // after the pipeline has closed (deferred below)
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if err := pipeline.DeleteTopics(dctx, po); err != nil {
				o.Logger.Warn("replay: the run's topics were not deleted", "topic", run, "err", err)
			}
		}()
	}
	var trim *trimmer
	if len(o.Brokers) == 0 {
		if trim, err = newTrimmer(po); err != nil {
			return nil, err
		}
		if sink != nil {
			trim.readers = append(trim.readers, run+"-clickhouse") // startSink's group
		}
		defer trim.Close()
	}
	pl, err := pipeline.New(po)
	if err != nil {
		return nil, err
	}
	cctx, stop := context.WithCancel(ctx)
	pl.Start(cctx)
	defer pl.Close()
	defer stop()

	// The fast loop.
	lims := make([]regionLimiter, len(o.Regions))
	for i, region := range o.Regions {
		l, err := enforcer.New(clients[i], o.Rules, enforcer.Options{
			Region: region, Instance: "replay-0", Regions: len(o.Regions), Sink: prod, Logger: o.Logger,
			Budget:      o.Stall, // as the clients' timeouts: a replay measures decisions, not a deadline
			MaxInFlight: -1,      // nor the sidecar's load: no request is ever shed
			// No remembered-answers table (65 536 entries, 8.5 MiB a
			// region): it serves only the fallback while Redis fails, which
			// a replay does not simulate (a failing Redis is a problem in
			// its report, and its degraded keys start from full local
			// buckets). The hot-key table (deny cache, leases) stays, as
			// in production.
			Fallback: enforcer.FallbackOptions{RememberedKeys: -1},
		})
		if err != nil {
			return nil, err
		}
		// Closed when Run returns, so that nothing of theirs (a timer)
		// keeps them, their tables and the producer they log to reachable.
		defer l.Close()
		lims[i] = l
	}
	if testHookParts != nil {
		testHookParts(prod, lims)
	}

	punct, err := pipeline.NewPunctuator(brokers, run)
	if err != nil {
		return nil, err
	}
	defer punct.Close()
	d := &driver{o: o, rep: rep, prod: prod, pl: pl, punct: punct, lims: lims, en: en, minis: minis, trim: trim}
	if o.Backend != nil {
		d.back = &backendModel{Backend: *o.Backend, rng: rand.New(rand.NewPCG(o.Backend.Seed, 22))}
	}
	err = d.run(ctx, sources)
	if err != nil {
		rep.Problems = append(rep.Problems, "replay stopped early: "+err.Error())
	}
	if sink != nil {
		wait := o.ClickHouseWait
		if wait <= 0 {
			wait = 5 * time.Minute
		}
		wctx, cancel := context.WithTimeout(ctx, wait)
		if err := sink.CatchUp(wctx); err != nil {
			rep.Problems = append(rep.Problems, fmt.Sprintf("ClickHouse: the sink did not write everything within %v: %v", wait, err))
		}
		cancel()
		st := sink.Stats()
		rep.Sink = &st
	}
	rep.Elapsed = time.Since(start)
	rep.Producer, rep.Consumer, rep.Merger, rep.Punctuations = prod.Stats(), pl.Consumer.Stats(), pl.Merger.Stats(), d.puncts
	rec.mu.Lock()
	rec.rep = nil // the pipeline closes after Run returns: record no more
	rec.mu.Unlock()
	rep.finish()
	return rep, err
}

// testHookParts, set by a test, is shown each run's producer and limiters
// (TestRunLetsItsPartsGo).
var testHookParts func(*pipeline.Producer, []regionLimiter)

// regionLimiter is what the replay asks of a region's limiter
// (*enforcer.Limiter is one): decisions, their concurrency slots, the
// backend's responses for adaptive rules, and refreshes at barriers.
type regionLimiter interface {
	Check(ctx context.Context, req *enforcer.Request) (enforcer.Decision, error)
	Release(ctx context.Context, d *enforcer.Decision) error
	ObserveResponse(now time.Time, status int, latency time.Duration)
	AdaptiveFactor() float64
	Refresh(ctx context.Context, now time.Time) error
}

type driver struct {
	o      Options
	rep    *Report
	prod   *pipeline.Producer
	pl     *pipeline.Pipeline
	punct  *pipeline.Punctuator
	puncts int64 // punctuation records written
	lims   []regionLimiter
	en     *Enricher
	since  int // records logged since the last barrier
	// minis are the in-process Redis servers (none with Options.RedisAddr),
	// whose clocks the barriers move on in event time, from clock.
	minis []*miniredis.Miniredis
	clock time.Time
	trim  *trimmer      // nil on a real Kafka cluster
	back  *backendModel // nil without Options.Backend
}

// head is the next request of one source.
type head struct {
	src Source
	req Request
	ok  bool
	sr  *SourceReport
}

func (d *driver) run(ctx context.Context, sources []Source) error {
	heads := make([]*head, len(sources))
	for i, s := range sources {
		sr := &SourceReport{Name: s.Name()}
		d.rep.Sources = append(d.rep.Sources, sr)
		heads[i] = &head{src: Reorder(s, d.o.Reorder), sr: sr}
		if err := d.advance(heads[i]); err != nil {
			return err
		}
	}
	defer func() { // also when the replay stops early
		for _, h := range heads {
			h.sr.Stats = h.src.Stats()
		}
	}()
	var next time.Time // next barrier
	var maxT time.Time
	n := 0
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		// Merge: the source whose next request is earliest.
		var h *head
		for _, x := range heads {
			if x.ok && (h == nil || x.req.Time.Before(h.req.Time)) {
				h = x
			}
		}
		if h == nil {
			break
		}
		t := h.req.Time
		if next.IsZero() {
			next = t.Truncate(d.o.Barrier).Add(d.o.Barrier)
		}
		if !t.Before(next) {
			if err := d.barrier(ctx, t); err != nil {
				return err
			}
			next = t.Truncate(d.o.Barrier).Add(d.o.Barrier)
		}
		if t.After(maxT) {
			maxT = t
		}
		n++
		if l := h.req.Label; l.Scenario != "" {
			if _, ok := d.rep.Labels[l.Scenario]; !ok {
				if d.rep.Labels == nil {
					d.rep.Labels = map[string]Label{}
				}
				d.rep.Labels[l.Scenario] = l
			}
		}
		region, req := d.en.Request(d.o.Rules.Domain, h.req.id(h.sr.Name), &h.req)
		dec, err := d.lims[region].Check(ctx, &req)
		if err != nil {
			h.sr.Rejected++
			if len(d.rep.rejected) < maxMalformedListed {
				d.rep.rejected = append(d.rep.rejected, fmt.Sprintf("%s:%d: %v", h.sr.Name, h.req.Line, err))
			}
		} else {
			d.rep.tally(region, &req, &dec)
			if d.back != nil {
				d.back.respond(d.rep, d.lims, region, t, &dec)
			}
			d.since++
			// A logged request has ended: give back any concurrency slot.
			if err := d.lims[region].Release(ctx, &dec); err != nil {
				d.rep.releaseErrors++
			}
		}
		if err := d.advance(h); err != nil {
			return err
		}
		if d.o.Progress != nil && n%ProgressEvery == 0 {
			d.o.Progress(n)
		}
	}
	if d.o.Progress != nil {
		d.o.Progress(n)
	}
	if err := d.barrier(ctx, maxT); err != nil {
		return err
	}
	// End of input: no earlier record will come, so close every window
	// (an hour is past the longest window plus lateness).
	if maxT.IsZero() {
		return nil // no record: no window to close
	}
	if err := d.closeWindows(ctx, maxT.Add(time.Hour)); err != nil {
		d.problem("closing windows: %v", err)
	}
	return nil
}

// advance reads the next request of h, recording malformed lines.
func (d *driver) advance(h *head) error {
	for {
		r, err := h.src.Next()
		if err == nil {
			h.req, h.ok = r, true
			return nil
		}
		h.ok = false
		if errors.Is(err, io.EOF) {
			return nil
		}
		var pe *accesslog.ParseError
		if !errors.As(err, &pe) {
			return err
		}
		if len(h.sr.Malformed) < maxMalformedListed {
			h.sr.Malformed = append(h.sr.Malformed, pe)
		}
	}
}

// barrier waits until the pipeline has consumed every record logged so far,
// then has every enforcer reload dynamic rules and shares as of event time t.
func (d *driver) barrier(ctx context.Context, t time.Time) error {
	if d.since == 0 {
		return nil
	}
	d.since = 0
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := d.prod.Flush(fctx); err != nil {
		return fmt.Errorf("replay: flushing decision records: %w", err)
	}
	// Records come in event-time order (Reorder sorts within its
	// horizon), so no record before t is still to come: punctuate every
	// partition at t less the lateness, as a partition busy with records
	// would have its own watermark. Partitions with no records in a while
	// then hold no window back.
	n, err := d.punct.Punctuate(fctx, t.Add(-d.o.Lateness))
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	d.puncts += int64(n)
	if err := d.sync(ctx); err != nil {
		return err
	}
	d.tick(t)
	if d.trim != nil { // two offset fetches and a delete on loopback: cheap
		if err := d.trim.trim(fctx); err != nil {
			d.problem("in-process kafka: %v (the replay holds more memory)", err)
		}
	}
	for i, l := range d.lims {
		if err := l.Refresh(ctx, t); err != nil {
			// The enforcer keeps its previous rules and shares; decisions
			// go on (degraded if Redis is gone), and the report says so.
			d.problem("region %s: reloading dynamic rules and shares: %v", d.o.Regions[i], err)
		}
	}
	d.rep.Barriers++
	return nil
}

// tick moves the in-process Redis servers' clocks on to event time t, so
// that keys expire after their TTL in event time, as they would live:
// miniredis expires keys only when told time has passed, and a day's
// limit keys would otherwise all stay.
func (d *driver) tick(t time.Time) {
	if !d.clock.IsZero() && t.After(d.clock) {
		for _, m := range d.minis {
			m.FastForward(t.Sub(d.clock))
		}
	}
	if d.clock.IsZero() || t.After(d.clock) {
		d.clock = t
	}
}

// closeWindows punctuates every partition at t and waits for the pipeline
// to finish the windows that closes: no earlier record will come.
func (d *driver) closeWindows(ctx context.Context, t time.Time) error {
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	n, err := d.punct.Punctuate(fctx, t)
	if err != nil {
		return err
	}
	d.puncts += int64(n)
	return d.sync(ctx)
}

// sync waits for the pipeline to have consumed every record and
// punctuation produced and merged the partials they made, as long as it
// makes progress: it fails after o.Stall without any (a wall-clock cap on
// the whole wait made a replay on a busy machine stop early, and two
// replays of one input differ).
func (d *driver) sync(ctx context.Context) error {
	sctx, cancel := stallContext(ctx, d.o.Stall, func() int64 { return d.pl.Consumer.Processed() + d.pl.Merger.Position() })
	defer cancel()
	if err := d.pl.Sync(sctx, d.prod.Stats().Produced+d.puncts); err != nil {
		if we := d.pl.Merger.Stats().WriteErrs; we > 0 {
			// The merge tier retries its writes until they land: a dead
			// Redis holds it back, and the pipeline with it.
			return fmt.Errorf("replay: the pipeline made no progress for %v: its merge tier failed %d times to write rules and shares to a region's Redis (down or refusing?), and retries until it can: %w", d.o.Stall, we, err)
		}
		return fmt.Errorf("replay: the pipeline made no progress for %v: %w", d.o.Stall, err)
	}
	return nil
}

// stallContext returns a context that ends with ctx, or once progress has
// not changed for stall (checked every stall/20, at most 100 ms).
func stallContext(ctx context.Context, stall time.Duration, progress func() int64) (context.Context, context.CancelFunc) {
	sctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(min(stall/20, 100*time.Millisecond))
		defer tick.Stop()
		last, since := progress(), time.Now()
		for {
			select {
			case <-done:
				return
			case <-sctx.Done():
				return
			case <-tick.C:
			}
			if p := progress(); p != last {
				last, since = p, time.Now()
			} else if time.Since(since) >= stall {
				cancel(fmt.Errorf("no progress for %v", stall))
				return
			}
		}
	}()
	var once sync.Once
	return sctx, func() { once.Do(func() { close(done) }); cancel(nil) }
}

// problem records a non-fatal problem once per distinct message, at most 10.
func (d *driver) problem(format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	if len(d.rep.Problems) < 10 && !slices.Contains(d.rep.Problems, msg) {
		d.rep.Problems = append(d.rep.Problems, msg)
	}
	d.o.Logger.Warn(msg)
}

// validRegions checks region names: distinct, each a rules.ValidID. How
// many the shares allow is the aggregator's to say (see aggregator.Options).
func validRegions(rs []string) error {
	seen := map[string]bool{}
	for _, r := range rs {
		if !rules.ValidID(r) {
			return fmt.Errorf("replay: region %q: want 1-64 characters of [A-Za-z0-9_.-]", r)
		}
		if strings.Trim(r, "0123456789") == "" {
			return fmt.Errorf("replay: region %q: want a region's name (us-east, eu-west, ...), not a count", r)
		}
		if seen[r] {
			return fmt.Errorf("replay: region %q named twice", r)
		}
		seen[r] = true
	}
	return nil
}

// startSink migrates o.ClickHouse, creates the run's output topic, makes
// rec publish to it too, and starts an analytics.Sink on the run's topics.
// The returned func stops the sink and, on a real Kafka cluster, deletes
// the output topic.
func startSink(ctx context.Context, o Options, brokers []string, run string, rec *recordingWriter, rep *Report) (*analytics.Sink, func(), error) {
	co := *o.ClickHouse
	mctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	_, err := analytics.Migrate(mctx, co)
	cancel()
	if err != nil {
		return nil, nil, fmt.Errorf("replay: %w (is a clickhouse-server running there?)", err)
	}
	conn, err := analytics.Open(co)
	if err != nil {
		return nil, nil, err
	}
	output := run + ".output"
	ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = pipeline.EnsureOutputTopic(ectx, brokers, output)
	cancel()
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("replay: %w", err)
	}
	tw, err := pipeline.NewTopicWriter(pipeline.TopicWriterOptions{Brokers: brokers, Topic: output, Logger: o.Logger})
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	rec.also = tw
	sink, err := analytics.NewSink(analytics.SinkOptions{Brokers: brokers, Topic: run, OutputTopic: output,
		Group: run + "-clickhouse", Conn: conn, Logger: o.Logger})
	if err != nil {
		tw.Close()
		conn.Close()
		return nil, nil, err
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = sink.Run(context.WithoutCancel(ctx)) }()
	rep.ClickHouse = fmt.Sprintf("clickhouse-server at %s, database %s (sink group %s-clickhouse)", co.Addr, co.Database, run)
	return sink, func() {
		sink.Close()
		<-done
		tw.Close()
		conn.Close()
		if len(o.Brokers) > 0 {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if err := deleteTopic(dctx, brokers, output); err != nil {
				o.Logger.Warn("replay: the run's output topic was not deleted", "topic", output, "err", err)
			}
		}
	}, nil
}

// deleteTopic deletes one topic.
func deleteTopic(ctx context.Context, brokers []string, topic string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	resps, err := kadm.NewClient(cl).DeleteTopics(ctx, topic)
	if err != nil {
		return err
	}
	return resps.Error()
}

// recordingWriter passes output on (to w, then also and out, when set) and records
// it in the report (Report.addRule, Report.addShare) under mu until rep is
// set to nil. Those touch only the report's rule and share fields, which
// nothing else reads until Run returns.
type recordingWriter struct {
	w    stage.Writer
	also stage.Writer
	out  stage.Writer // Options.Output
	mu   sync.Mutex
	rep  *Report
}

func (r *recordingWriter) Write(ctx context.Context, o stage.Output) error {
	if err := r.w.Write(ctx, o); err != nil {
		return err
	}
	for _, w := range []stage.Writer{r.also, r.out} {
		if w == nil {
			continue
		}
		if err := w.Write(ctx, o); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rep == nil {
		return nil
	}
	for _, x := range o.Rules {
		r.rep.addRule(x)
	}
	for _, s := range o.Shares {
		r.rep.addShare(s)
	}
	return nil
}
