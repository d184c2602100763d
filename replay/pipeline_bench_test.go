package replay_test

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-rl/sluice/aggregator"
	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/detector"
	"github.com/sluice-rl/sluice/pipeline"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
)

// benchRecords are n encoded decision records over 20 000 client IPs, 1 000
// API keys and 3 regions.
func benchRecords(n int) [][]byte {
	out := make([][]byte, n)
	regions := []string{"us-east", "eu-west", "ap-south"}
	for i := range out {
		b, err := proto.Marshal(&decisionpb.Decision{Version: 1, EventTimeMs: 1_700_000_000_000 + int64(i), Region: regions[i%3],
			Outcome: decisionpb.Outcome_OUTCOME_ALLOWED, MatchedRules: []string{"per-ip", "per-key"},
			Descriptors: &decisionpb.Descriptors{ClientIp: fmt.Sprintf("10.%d.%d.%d", i%7, (i/7)%50, i%57), ApiKey: fmt.Sprintf("key-%d", i%1000), Route: "/v1/items"}})
		if err != nil {
			panic(err)
		}
		out[i] = b
	}
	return out
}

func benchStages(b *testing.B) []stage.Stage {
	global := &rules.Rule{ID: "per-key", Match: []rules.Match{{Key: rules.KeyAPIKey}}, Limit: 100, Period: time.Second, Burst: 100, Global: true}
	sh, err := aggregator.New(aggregator.Options{Regions: []string{"us-east", "eu-west", "ap-south"}, Rules: []*rules.Rule{global},
		Interval: 10 * time.Second}) // as when the figures in docs/benchmarks.md were taken
	if err != nil {
		b.Fatal(err)
	}
	hh, err := detector.NewHeavyHitters(detector.HeavyHitterOptions{})
	if err != nil {
		b.Fatal(err)
	}
	return []stage.Stage{hh, sh, detector.NewShadowTally()}
}

// Decode plus every detector and aggregator sketch update, per record, on
// one goroutine: the partition tier's work.
func BenchmarkDecodeAndSketches(b *testing.B) {
	recs := benchRecords(1 << 14)
	stages := benchStages(b)
	parts := make([]stage.Partial, len(stages))
	for i, s := range stages {
		parts[i] = s.NewPartial()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		d, err := decision.Decode(recs[i&(len(recs)-1)])
		if err != nil {
			b.Fatal(err)
		}
		for _, p := range parts {
			p.Observe(d)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

// End to end from an in-process broker over loopback TCP: b.N records on 8
// partitions, through both tiers with the detector, the aggregator and the
// shadow tally, timed from the first poll to the last record processed.
func BenchmarkEndToEndKfake(b *testing.B) {
	endToEndKfake(b, benchStages(b), benchRecords(1<<14))
}

// endToEndKfake produces b.N of recs (cycling) to an in-process broker and
// times the pipeline with stages from the first poll to the last record
// processed.
func endToEndKfake(b *testing.B, stages []stage.Stage, recs [][]byte) {
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(8, pipeline.DefaultTopic))
	if err != nil {
		b.Fatal(err)
	}
	defer kc.Close()
	brokers := kc.ListenAddrs()
	ctx := context.Background()
	o := pipeline.Options{Brokers: brokers, Stages: stages, Writer: discard{}}
	if err := pipeline.EnsureTopics(ctx, o, 0); err != nil {
		b.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(pipeline.DefaultTopic), kgo.MaxBufferedRecords(1<<20))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	for i := range b.N {
		cl.Produce(ctx, &kgo.Record{Key: recs[i&(len(recs)-1)][:8], Value: recs[i&(len(recs)-1)]}, nil)
	}
	if err := cl.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	pl, err := pipeline.New(o)
	if err != nil {
		b.Fatal(err)
	}
	defer pl.Close()
	b.ResetTimer()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pl.Start(rctx)
	for pl.Consumer.Processed() < int64(b.N) {
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

// sigRecords are n encoded decision records of a web site's traffic over
// 20 000 client IPs, with paths, user agents and statuses: 60% pages, 25%
// assets, 5% plain queries, 6% refused plain paths (missing pages, a
// scraper's guesses), and 4% that carry what a CRS rule looks for (an
// encoded query, a traversal, a dotfile; 1% of all an exploit payload).
// Unique paths (a page id, a query value) keep the verdict cache from
// hiding the checks' cost.
func sigRecords(n int) [][]byte {
	out := make([][]byte, n)
	uas := []string{
		"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Safari/537.36",
		"Mozilla/5.0 (iPhone; CPU iPhone OS 17_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.1 Mobile/15E148 Safari/604.1",
		"Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Gecko/20100101 Firefox/120.0", "okhttp/4.12.0", "python-requests/2.31.0",
	}
	for i := range out {
		path, status := fmt.Sprintf("/products/%d", i%50_000), uint32(200)
		switch p := i % 100; {
		case p < 25:
			path = fmt.Sprintf("/static/img/%d.png", i%2000)
		case p < 30:
			path = fmt.Sprintf("/search?q=shoes&page=%d", i%50)
		case p < 36:
			path, status = fmt.Sprintf("/old/page-%d", i), 404
		case p < 37:
			path, status = fmt.Sprintf("/items?id=%d%%27%%20or%%201=1--", i), 404
		case p < 38:
			path, status = fmt.Sprintf("/download?file=../../%d/etc/passwd", i), 400
		case p < 39:
			path, status = fmt.Sprintf("/app%d/.env", i), 404
		case p < 40:
			path = fmt.Sprintf("/search?q=red%%20shoes%%20%d", i)
		}
		b, err := proto.Marshal(&decisionpb.Decision{Version: 1, EventTimeMs: 1_700_000_000_000 + int64(i), Region: "eu-west",
			Outcome: decisionpb.Outcome_OUTCOME_ALLOWED, Status: status, UserAgent: uas[i%len(uas)],
			Descriptors: &decisionpb.Descriptors{ClientIp: fmt.Sprintf("10.%d.%d.%d", i%7, (i/7)%50, i%57), Method: "GET", Path: path}})
		if err != nil {
			panic(err)
		}
		out[i] = b
	}
	return out
}

// sigStages are benchStages and the content signal's stages (its four
// windows) with a Signatures of their own, whose counters are returned.
func sigStages(b *testing.B) ([]stage.Stage, *detector.Signatures) {
	sigs, err := detector.NewSignatures(nil, 0)
	if err != nil {
		b.Fatal(err)
	}
	ct, err := detector.NewContent(detector.ContentOptions{Signatures: sigs})
	if err != nil {
		b.Fatal(err)
	}
	st := benchStages(b)
	for _, c := range ct {
		st = append(st, c)
	}
	return st, sigs
}

// reportChecks reports the share of records whose target needed a CRS
// check (the prefilter's pass) and the CRS evaluations run per record
// (cache misses, and one per new user agent). The content signal's
// windows share each record's check.
func reportChecks(b *testing.B, sigs *detector.Signatures) {
	st := sigs.Stats()
	if st.Seen > 0 {
		b.ReportMetric(100*float64(st.Needed)/float64(st.Seen), "%checked")
		b.ReportMetric(float64(st.Checks)/float64(st.Seen), "crs-evals/record")
	}
}

// Decode plus every sketch update with the content signal and its CRS
// checks on a web site's traffic (sigRecords), on one goroutine.
func BenchmarkDecodeAndSketchesSignatures(b *testing.B) {
	recs := sigRecords(1 << 16)
	stages, sigs := sigStages(b)
	parts := make([]stage.Partial, len(stages))
	for i, s := range stages {
		parts[i] = s.NewPartial()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		d, err := decision.Decode(recs[i&(len(recs)-1)])
		if err != nil {
			b.Fatal(err)
		}
		for _, p := range parts {
			p.Observe(d)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
	reportChecks(b, sigs)
}

// End to end from kfake, as BenchmarkEndToEndKfake, with the content
// signal and its CRS checks on a web site's traffic (sigRecords).
func BenchmarkEndToEndKfakeSignatures(b *testing.B) {
	stages, sigs := sigStages(b)
	endToEndKfake(b, stages, sigRecords(1<<16))
	reportChecks(b, sigs)
}

type discard struct{}

func (discard) Write(context.Context, stage.Output) error { return nil }

// keyExplosion feeds n records, each from a distinct client IP and API key,
// within one minute of event time, through a stage.Local of 8 partitions
// with the detector, aggregator and shadow-tally stages, closing windows as
// it goes, and also into one partial per stage that sees every record. It
// returns the peak heap in use (sampled every 100 000 records) and the
// encoded size of those partials.
func keyExplosion(b *testing.B, n int) (peakHeap uint64, partialBytes int) {
	stages := benchStages(b)
	l := stage.NewLocal(stages, 8, 10*time.Second)
	whole := make([]stage.Partial, len(stages))
	for i, s := range stages {
		whole[i] = s.NewPartial()
	}
	t0 := int64(1_700_000_000_000)
	var ms runtime.MemStats
	d := &decisionpb.Decision{Version: 1, Region: "eu-west", Outcome: decisionpb.Outcome_OUTCOME_ALLOWED, MatchedRules: []string{"per-ip"},
		Descriptors: &decisionpb.Descriptors{}}
	var ip [16]byte
	ip[0] = 0x20
	for i := range n {
		binary.BigEndian.PutUint64(ip[8:], uint64(i))
		d.EventTimeMs = t0 + int64(i)*60_000/int64(n)
		d.Descriptors.ClientIp = netip.AddrFrom16(ip).String()
		d.Descriptors.ApiKey = d.Descriptors.ClientIp
		l.Observe(i, d)
		for _, p := range whole {
			p.Observe(d)
		}
		if i%100_000 == 0 {
			l.Advance(time.UnixMilli(d.EventTimeMs - 10_000))
			runtime.ReadMemStats(&ms)
			peakHeap = max(peakHeap, ms.HeapInuse)
		}
	}
	for _, p := range whole {
		x, err := p.MarshalBinary()
		if err != nil {
			b.Fatal(err)
		}
		partialBytes += len(x)
	}
	return peakHeap, partialBytes
}

// Key explosion: 10 million distinct client IPs (and API keys) within one
// minute. The figures are the peak heap, which must stay under 512 MiB, and
// the size of one window's state over every record, which must not grow
// with the number of distinct keys (compare with -keys 100000).
func BenchmarkKeyExplosion(b *testing.B) {
	for range b.N {
		runtime.GC()
		peak, size := keyExplosion(b, *explosionKeys)
		b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
		b.ReportMetric(float64(size)/1024, "window-state-KiB")
	}
}

var explosionKeys = flag.Int("keys", 10_000_000, "distinct client IPs for BenchmarkKeyExplosion")
