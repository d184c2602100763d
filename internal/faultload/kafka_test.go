package faultload_test

import (
	"context"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/internal/faultload"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/pipeline"
)

// TestFaultLoadKafka (enforcer.TestFaultLoad's Kafka case, here because
// enforcer's tests may not import pipeline): the sidecar (the limiter's
// HTTP middleware) under an open-loop load of -fault.rate requests per
// second (2 000; on a machine that cannot carry that twice over now, the
// highest half, quarter, ... that it can, at least minRate: faultload.
// Sustained); the decision records go to Kafka (kfake) through a proxy
// that blackholes it for twice -fault.duration (60 s). The same request
// sequence goes at the same instants to a control sidecar whose Kafka stays
// up: decisions must be the same, request by request; the producer counts
// what it drops; the heap stays bounded; records reach Kafka again after it
// is back.
//
// The sidecar with Kafka down is judged against the control, which takes
// the same requests at the same instants on the same machine: where the
// control answers every request in time (the machine keeps up with the
// load), so must it; where the control piles up or answers late (a loaded
// machine), it may not do much worse (faultload.CheckAgainstControl). A run whose
// control fell behind is void and runs again at half the rate, down to
// 250 requests/s (faultload.Controlled). Decisions are compared one
// by one where Redis decided both; those a late Redis answer degraded (the
// machine: the budget is 1 s) are compared by count. A request path held
// up by the down Kafka fails either way.
//
// It runs about 2.5 times -fault.duration and offers its load twice, to
// the sidecar under test and to the control: run it alone on the machine,
// as TestFaultLoad. -short skips it.
func TestFaultLoadKafka(t *testing.T) {
	faultload.SkipShort(t)
	// The rate this machine carries now, at most -fault.rate, found with
	// two throwaway sidecars like the run's.
	calA, _ := faultload.NewLimiter(t, redistest.Server(t), faultload.NewRecorder(time.Time{}, 0, nil), time.Second)
	calB, _ := faultload.NewLimiter(t, redistest.Server(t), faultload.NewRecorder(time.Time{}, 0, nil), time.Second)
	rate := faultload.Sustained(t, faultload.Rate(), faultload.MinRate, faultload.HTTPSidecar(t, calA), faultload.HTTPSidecar(t, calB))
	// A run whose control did not keep up (the machine got busier after
	// the calibration) says nothing of Kafka: it is void, and the case runs
	// again at half the rate, down to faultload.MinRate, where it is judged
	// against its control whatever the load.
	faultload.Controlled(t, &rate, func(t *testing.T, rate int) ([]faultload.Shot, func()) {
		r := runKafkaCase(t, rate)
		return r.ctl, func() { r.judge(t) }
	})
}

// kafkaRun is one run of the Kafka case: what both sidecars answered and
// recorded, and the faulted one's producer and footprint.
type kafkaRun struct {
	rate                int
	downAt, upAt, total time.Duration
	fault, ctl          []faultload.Shot
	recFault, recCtl    *faultload.Recorder
	// The producer's counts once Kafka is blackholed, at the end of the
	// outage, once the load ends and after the final flush.
	statsAtDown, statsDown, statsUp, end pipeline.ProducerStats
	fp0, fp1, fp2                        faultload.Footprint
	flushErr                             error
	consumedAfter                        bool
	firstUp                              int
}

// runKafkaCase runs the case at rate requests per second; it fails t only
// when it cannot set the run up.
func runKafkaCase(t *testing.T, rate int) *kafkaRun {
	d := faultload.Duration()
	r := &kafkaRun{rate: rate, downAt: d / 5, upAt: d/5 + 2*d}
	r.total = r.upAt + d/3
	proxy := redistest.NewProxy(t, "")
	kFault, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, pipeline.DefaultTopic),
		kfake.ListenFn(func(network, addr string) (net.Listener, error) {
			ln, err := net.Listen(network, addr)
			if err != nil {
				return nil, err
			}
			proxy.SetUpstream(ln.Addr().String())
			return advertised{Listener: ln, addr: proxyAddr(proxy.Addr())}, nil // clients reach the broker through the proxy
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kFault.Close)
	kCtl, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, pipeline.DefaultTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kCtl.Close)
	prodFault, err := pipeline.NewProducer(pipeline.ProducerOptions{Brokers: []string{proxy.Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prodFault.Close)
	prodCtl, err := pipeline.NewProducer(pipeline.ProducerOptions{Brokers: kCtl.ListenAddrs()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prodCtl.Close)

	n := int(int64(rate) * int64(r.total) / int64(time.Second))
	r.recFault, r.recCtl = faultload.NewRecorder(time.Time{}, n, prodFault), faultload.NewRecorder(time.Time{}, n, prodCtl)
	// A budget that a healthy Redis never misses, even on a loaded machine:
	// this case is about Kafka, and a decision degraded by a late Redis
	// answer in one run and not the other would differ for that reason.
	lFault, _ := faultload.NewLimiter(t, redistest.Server(t), r.recFault, time.Second)
	lCtl, _ := faultload.NewLimiter(t, redistest.Server(t), r.recCtl, time.Second)
	targetFault, targetCtl := faultload.HTTPSidecar(t, lFault), faultload.HTTPSidecar(t, lCtl)
	faultload.Warm(t, targetFault)
	faultload.Warm(t, targetCtl)
	for _, p := range []*pipeline.Producer{prodFault, prodCtl} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := p.Flush(ctx); err != nil {
			t.Fatalf("kafka before the fault: %v", err)
		}
		cancel()
	}

	var wg sync.WaitGroup
	start := faultload.Start()
	r.recFault.Start, r.recCtl.Start = start, start
	// One goroutine for the fault's steps, so that they keep their order
	// however late a loaded machine wakes it: the end-of-outage figures are
	// taken before Kafka is back.
	wg.Add(1)
	go func() {
		defer wg.Done()
		until := func(d time.Duration) { time.Sleep(time.Until(start.Add(d))) }
		until(r.downAt)
		r.fp0 = faultload.Measure()
		proxy.Inject(redistest.Blackhole, 0)
		r.statsAtDown = prodFault.Stats()
		until(r.downAt + (r.upAt-r.downAt)/2)
		r.fp1 = faultload.Measure()
		until(r.upAt - 100*time.Millisecond)
		r.fp2 = faultload.Measure()
		r.statsDown = prodFault.Stats()
		until(r.upAt)
		proxy.Inject(redistest.Pass, 0)
	}()
	// Every request at a fixed instant of the caller's clock, so that both
	// sidecars see the same times.
	base := time.UnixMilli(1_800_000_000_000)
	mk := func(i int) faultload.Request {
		q := faultload.MakeRequest(i)
		q.Now = base.Add(time.Duration(int64(i) * int64(time.Second) / int64(rate)))
		return q
	}
	out := faultload.OfferUnchecked(start, rate, r.total, mk, targetFault, targetCtl)
	wg.Wait()
	r.statsUp = prodFault.Stats()
	r.fault, r.ctl = out[0], out[1]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r.flushErr = prodFault.Flush(ctx)
	r.end = prodFault.Stats()
	// Logging resumes: records of requests made after Kafka came back reach it.
	r.firstUp = int(int64(r.upAt+time.Second) * int64(rate) / int64(time.Second))
	r.consumedAfter = consumed(t, proxy.Addr(), r.firstUp)
	return r
}

// judge checks a run: answers against the control's, decisions one by
// one, the producer's counts, the heap, and logging after the outage.
func (r *kafkaRun) judge(t *testing.T) {
	t.Helper()
	t.Logf("offered %d requests/s to each sidecar", r.rate)
	faultload.CheckAgainstControl(t, "kafka down", r.fault, r.ctl, faultload.Phase{})
	diff, both, degraded := 0, 0, 0
	for i := range r.fault {
		f, c := &r.fault[i], &r.ctl[i]
		if !f.Done || !c.Done || f.Err != nil || c.Err != nil {
			continue // judged by checkAgainstControl
		}
		rf, rc := r.recFault.Recs[i], r.recCtl.Recs[i]
		if rf.Path == decision.PathFallback || rc.Path == decision.PathFallback {
			degraded++ // a late Redis answer (the machine): judged below
			continue
		}
		both++
		if f.Resp != c.Resp || rf.Outcome != rc.Outcome {
			if diff++; diff <= 3 {
				t.Errorf("request %d (%s): %d %v with Kafka down, %d %v in the control run", i, faultload.MakeRequest(i).Route,
					f.Resp.Status, rf.Outcome, c.Resp.Status, rc.Outcome)
			}
		}
	}
	if diff > 0 {
		t.Errorf("%d of %d decisions differ from the control run's", diff, both)
	}
	if both < len(r.fault)/2 {
		t.Errorf("only %d of %d requests were decided by Redis for both sidecars (%d degraded in either)", both, len(r.fault), degraded)
	}
	if degraded > 0 {
		df, dc := 0, 0
		for i := range r.fault {
			if r.recFault.Recs[i].Path == decision.PathFallback {
				df++
			}
			if r.recCtl.Recs[i].Path == decision.PathFallback {
				dc++
			}
		}
		t.Logf("decisions degraded by late Redis answers: %d with Kafka down, %d in the control", df, dc)
		if df > 2*dc+len(r.fault)/100 {
			t.Errorf("%d decisions degraded with Kafka down against %d in the control: Kafka's outage held decisions up", df, dc)
		}
	}
	lost := r.statsDown.Dropped + r.statsDown.Failed
	t.Logf("kafka down: producer %+v as it went down, %+v at the end of the outage, %+v after", r.statsAtDown, r.statsDown, r.statsUp)
	// Nothing logged once Kafka was blackholed reached it while it was:
	// else the fault was not one, and the rest says nothing.
	if r.statsDown.Produced > r.statsAtDown.Logged {
		t.Errorf("%d records produced during the outage, but only %d were logged before it began: Kafka was not down", r.statsDown.Produced, r.statsAtDown.Logged)
	}
	// Records wait for Kafka in the producer's two buffers of 65 536
	// (pipeline.ProducerOptions.Buffer): what the outage holds is bounded by
	// them, and more is dropped and counted. Within them, a record franz-go
	// has not yet sent fails at the delivery timeout (30 s), counted, but
	// one in a request Kafka never answered waits for the answer: franz-go's
	// idempotent producer fails a batch only where that leaves no gap in
	// its sequence numbers (kgo.RecordDeliveryTimeout). Which happens to a
	// record of an outage longer than the timeout depends on where the
	// outage caught its partition (on a loaded machine, a request is
	// usually in flight), so both are right; a shorter outage loses none.
	const buffers = 2 * 65536
	if held := r.statsDown.Logged - r.statsDown.Produced - lost; held > buffers {
		t.Errorf("%d records held at the end of the outage, more than the producer's buffers (%d): %+v", held, buffers, r.statsDown)
	}
	if r.upAt-r.downAt <= 30*time.Second && int64(r.rate)*int64(r.upAt-r.downAt)/int64(time.Second) <= 65536 && lost > 0 {
		t.Errorf("%d records lost to an outage of %v, shorter than the delivery timeout: %+v", lost, r.upAt-r.downAt, r.statsDown)
	}
	if r.flushErr != nil {
		t.Errorf("flushing after the outage: %v", r.flushErr)
	}
	if s := r.end; s.Logged != s.Produced+s.Dropped+s.Failed {
		t.Errorf("producer after the outage: %+v, want every record produced, dropped or failed", s)
	}
	// The producer's buffers (65 536 records each) bound the heap: it
	// grows while they fill, then stays flat.
	t.Logf("heap and goroutines: at the outage %v, half-way %v, at its end %v", r.fp0, r.fp1, r.fp2)
	if r.fp2.Heap > r.fp0.Heap+256<<20 {
		t.Errorf("heap grew from %v to %v while Kafka was down", r.fp0, r.fp2)
	}
	faultload.CheckFlat(t, "second half of the outage", r.fp1, r.fp2)
	if !r.consumedAfter {
		t.Errorf("no record of a request after Kafka came back (request %d on) reached Kafka; producer %+v", r.firstUp, r.end)
	}
	ph := []faultload.Phase{
		{Name: "kafka up", From: 0, To: r.downAt},
		{Name: "kafka down", From: r.downAt, To: r.upAt},
		{Name: "kafka back", From: r.upAt, To: r.total},
	}
	faultload.Latencies(t, "with kafka down", r.fault, ph)
	faultload.Latencies(t, "control", r.ctl, ph)
}

// consumed reports whether the decisions topic at broker holds a record of
// request from or later, within 30 s.
func consumed(t *testing.T, broker string, from int) bool {
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.ConsumeTopics(pipeline.DefaultTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		found := false
		fs.EachRecord(func(r *kgo.Record) {
			if d, err := decision.Decode(r.Value); err == nil {
				if i, err := strconv.Atoi(d.GetRequestId()); err == nil && i >= from {
					found = true
				}
			}
		})
		if found {
			return true
		}
	}
	return false
}

// advertised is a listener that gives another address as its own: kfake
// tells clients to connect to its listener's address, here the proxy's.
type advertised struct {
	net.Listener
	addr net.Addr
}

func (a advertised) Addr() net.Addr { return a.addr }

type proxyAddr string

func (a proxyAddr) Network() string { return "tcp" }
func (a proxyAddr) String() string  { return string(a) }
