package analytics

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/pipeline"
)

// BenchmarkSinkFlush measures the sink's write path for batches of 10 000
// decision records: decoding the Kafka records, building the rows and one
// INSERT acknowledged by the package's clickhouse-server (on loopback).
func BenchmarkSinkFlush(b *testing.B) {
	const batchRows = 10_000
	conn, _ := migrated(b, shared(b))
	recs := make([]*kgo.Record, batchRows)
	var d decisionpb.Decision
	for i, r := range generated(batchRows) {
		decision.ToProto(&r, &d)
		v, err := proto.Marshal(&d)
		if err != nil {
			b.Fatal(err)
		}
		recs[i] = &kgo.Record{Topic: pipeline.DefaultTopic, Partition: int32(i % 4), Offset: int64(i), Value: v}
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		var bt batch
		for _, r := range recs {
			bt.add(r, pipeline.DefaultTopic)
		}
		if err := insert(ctx, conn, insertDecisions, bt.decisions); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*batchRows)/b.Elapsed().Seconds(), "rows/s")
}
