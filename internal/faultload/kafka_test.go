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
// machine), it may not do much worse (checkAgainstControl). A request path
// held up by the down Kafka fails either way.
//
// It runs about 2.5 times -fault.duration and offers its load twice, to
// the sidecar under test and to the control: run it alone on the machine,
// as TestFaultLoad. -short skips it.
func TestFaultLoadKafka(t *testing.T) {
	const minRate = 250
	faultload.SkipShort(t)
	d := faultload.Duration()
	downAt, upAt := d/5, d/5+2*d
	total := upAt + d/3
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

	// The rate this machine carries now, at most -fault.rate, found with
	// two throwaway sidecars like the run's.
	calA, _ := faultload.NewLimiter(t, redistest.Server(t), faultload.NewRecorder(time.Time{}, 0, nil), time.Second)
	calB, _ := faultload.NewLimiter(t, redistest.Server(t), faultload.NewRecorder(time.Time{}, 0, nil), time.Second)
	rate := faultload.Sustained(t, faultload.Rate(), minRate, faultload.HTTPSidecar(t, calA), faultload.HTTPSidecar(t, calB))
	n := int(int64(rate) * int64(total) / int64(time.Second))
	recFault, recCtl := faultload.NewRecorder(time.Time{}, n, prodFault), faultload.NewRecorder(time.Time{}, n, prodCtl)
	// A budget that a healthy Redis never misses, even on a loaded machine:
	// this case is about Kafka, and a decision degraded by a late Redis
	// answer in one run and not the other would differ for that reason.
	lFault, _ := faultload.NewLimiter(t, redistest.Server(t), recFault, time.Second)
	lCtl, _ := faultload.NewLimiter(t, redistest.Server(t), recCtl, time.Second)
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
	recFault.Start, recCtl.Start = start, start
	var fp0, fp1, fp2 faultload.Footprint
	var statsDown, statsUp pipeline.ProducerStats
	faultload.RunAt(&wg, start, downAt, func() { fp0 = faultload.Measure(); proxy.Inject(redistest.Blackhole, 0) })
	faultload.RunAt(&wg, start, downAt+(upAt-downAt)/2, func() { fp1 = faultload.Measure() })
	faultload.RunAt(&wg, start, upAt-100*time.Millisecond, func() { fp2 = faultload.Measure(); statsDown = prodFault.Stats() })
	faultload.RunAt(&wg, start, upAt, func() { proxy.Inject(redistest.Pass, 0) })
	// Every request at a fixed instant of the caller's clock, so that both
	// sidecars see the same times.
	base := time.UnixMilli(1_800_000_000_000)
	mk := func(i int) faultload.Request {
		r := faultload.MakeRequest(i)
		r.Now = base.Add(time.Duration(int64(i) * int64(time.Second) / int64(rate)))
		return r
	}
	out := faultload.OfferUnchecked(start, rate, total, mk, targetFault, targetCtl)
	wg.Wait()
	statsUp = prodFault.Stats()
	fault, ctl := out[0], out[1]

	checkAgainstControl(t, fault, ctl)
	diff, both := 0, 0
	for i := range fault {
		f, c := &fault[i], &ctl[i]
		if !f.Done || !c.Done || f.Err != nil || c.Err != nil {
			continue // judged by checkAgainstControl
		}
		both++
		if f.Resp != c.Resp || recFault.Recs[i].Outcome != recCtl.Recs[i].Outcome {
			if diff++; diff <= 3 {
				t.Errorf("request %d (%s): %d %v with Kafka down, %d %v in the control run", i, faultload.MakeRequest(i).Route,
					f.Resp.Status, recFault.Recs[i].Outcome, c.Resp.Status, recCtl.Recs[i].Outcome)
			}
		}
	}
	if diff > 0 {
		t.Errorf("%d of %d decisions differ from the control run's", diff, both)
	}
	if both < len(fault)/2 {
		t.Errorf("only %d of %d requests were answered by both sidecars", both, len(fault))
	}
	lost := statsDown.Dropped + statsDown.Failed
	t.Logf("kafka down: producer %+v at the end of the outage, %+v after", statsDown, statsUp)
	// Records wait for Kafka up to the producer's delivery timeout (30 s)
	// in buffers of 65 536: a longer outage, or more records, loses some,
	// counted; a shorter one delivers them all late.
	if upAt-downAt > 30*time.Second || int64(rate)*int64(upAt-downAt)/int64(time.Second) > 65536 {
		if lost == 0 {
			t.Errorf("no record counted as dropped or failed while Kafka was down %v: %+v", upAt-downAt, statsDown)
		}
	} else if lost > 0 {
		t.Errorf("%d records lost to an outage of %v, shorter than the delivery timeout: %+v", lost, upAt-downAt, statsDown)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := prodFault.Flush(ctx); err != nil {
		t.Errorf("flushing after the outage: %v", err)
	}
	if s := prodFault.Stats(); s.Logged != s.Produced+s.Dropped+s.Failed {
		t.Errorf("producer after the outage: %+v, want every record produced, dropped or failed", s)
	}
	// The producer's buffers (65 536 records each) bound the heap: it
	// grows while they fill, then stays flat.
	t.Logf("heap and goroutines: at the outage %v, half-way %v, at its end %v", fp0, fp1, fp2)
	if fp2.Heap > fp0.Heap+256<<20 {
		t.Errorf("heap grew from %v to %v while Kafka was down", fp0, fp2)
	}
	faultload.CheckFlat(t, "second half of the outage", fp1, fp2)
	// Logging resumes: records of requests made after Kafka came back reach it.
	firstUp := int(int64(upAt+time.Second) * int64(rate) / int64(time.Second))
	if !consumed(t, proxy.Addr(), firstUp) {
		t.Errorf("no record of a request after Kafka came back (request %d on) reached Kafka; producer %+v", firstUp, prodFault.Stats())
	}
	ph := []faultload.Phase{
		{Name: "kafka up", From: 0, To: downAt},
		{Name: "kafka down", From: downAt, To: upAt},
		{Name: "kafka back", From: upAt, To: total},
	}
	faultload.Latencies(t, "with kafka down", fault, ph)
	faultload.Latencies(t, "control", ctl, ph)
}

// checkAgainstControl fails t if the sidecar with Kafka down (fault)
// answered worse than the control (ctl): any transport error, 5xx or
// answer later than faultload.Ceiling, or a pile-up (requests not sent to
// either), where the control had none; where the control had some (the
// machine could not keep up with the load), more than twice the control's
// plus 1% of the requests. The pile-ups are the run's, not one sidecar's:
// they are counted, and the rest is judged.
func checkAgainstControl(t *testing.T, fault, ctl []faultload.Shot) {
	t.Helper()
	af, ac := faultload.Tally(fault), faultload.Tally(ctl)
	badF := af.Errors + af.FiveXX + af.Slow
	badC := ac.Errors + ac.FiveXX + ac.Slow
	piled := faultload.NotSent(fault)
	t.Logf("%d requests not sent (a pile-up); kafka down: %+v; control: %+v", piled, af, ac)
	if badC == 0 {
		faultload.CheckAnswers(t, fault)
		if piled > 0 {
			t.Errorf("%d requests not sent for a pile-up, while the control answered every request in time", piled)
		}
		return
	}
	t.Logf("the control run had %d requests failed or later than %v: the machine did not keep up with the load; judged against it", badC, faultload.Ceiling)
	if limit := 2*badC + len(fault)/100; badF > limit {
		t.Errorf("with Kafka down %d requests not sent, failed or later than %v, the control %d: want at most %d", badF, faultload.Ceiling, badC, limit)
	}
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
