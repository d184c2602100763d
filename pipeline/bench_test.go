package pipeline_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-rl/sluice/aggregator"
	"github.com/sluice-rl/sluice/detector"
	"github.com/sluice-rl/sluice/pipeline"
	"github.com/sluice-rl/sluice/pipeline/decisionpb"
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

func benchStages(b *testing.B) []pipeline.Stage {
	global := &rules.Rule{ID: "per-key", Match: []rules.Match{{Key: rules.KeyAPIKey}}, Limit: 100, Period: time.Second, Burst: 100, Global: true}
	sh, err := aggregator.New(aggregator.Options{Regions: []string{"us-east", "eu-west", "ap-south"}, Rules: []*rules.Rule{global}})
	if err != nil {
		b.Fatal(err)
	}
	return []pipeline.Stage{detector.NewHeavyHitters(detector.HeavyHitterOptions{}), sh, pipeline.NewShadowTally()}
}

// Decode plus every detector and aggregator sketch update, per record, on
// one goroutine: the partition tier's work.
func BenchmarkDecodeAndSketches(b *testing.B) {
	recs := benchRecords(1 << 14)
	stages := benchStages(b)
	parts := make([]pipeline.Partial, len(stages))
	for i, s := range stages {
		parts[i] = s.NewPartial()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		d, err := pipeline.Decode(recs[i&(len(recs)-1)])
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
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(8, pipeline.DefaultTopic))
	if err != nil {
		b.Fatal(err)
	}
	defer kc.Close()
	brokers := kc.ListenAddrs()
	ctx := context.Background()
	o := pipeline.Options{Brokers: brokers, Stages: benchStages(b), Writer: discard{}}
	if err := pipeline.EnsureTopics(ctx, o, 0); err != nil {
		b.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(pipeline.DefaultTopic), kgo.MaxBufferedRecords(1<<20))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	recs := benchRecords(1 << 14)
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

type discard struct{}

func (discard) Write(context.Context, pipeline.Output) error { return nil }
