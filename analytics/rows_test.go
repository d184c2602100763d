package analytics

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/pipeline"
)

// FuzzBatchAdd: any Kafka record of either topic becomes exactly one row
// or one counted skip, without a panic.
func FuzzBatchAdd(f *testing.F) {
	var d decisionpb.Decision
	r := generated(1)[0]
	decision.ToProto(&r, &d)
	v, err := proto.Marshal(&d)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(true, []byte("api_key=key-00"), v)
	f.Add(true, []byte(nil), []byte("not protobuf"))
	f.Add(false, []byte("share/per-key//eu"), []byte(`{"format":1,"kind":"share","version":5,"share":{"rule":"per-key","region":"eu","f":0.5,"v":5,"at":"2026-11-02T10:00:00Z"}}`))
	f.Add(false, []byte("rule/r"), []byte(`{"format":1,"kind":"rule","version":0,"rule":{"ID":"r","ExpiresAt":"9999-12-31T23:59:59Z"}}`))
	f.Fuzz(func(t *testing.T, decision bool, key, value []byte) {
		topic := pipeline.DefaultOutputTopic
		if decision {
			topic = pipeline.DefaultTopic
		}
		var b batch
		b.add(&kgo.Record{Topic: topic, Key: key, Value: value, Timestamp: time.Unix(1_800_000_000, 0)}, pipeline.DefaultTopic)
		skipped := 0
		for _, n := range b.skipped {
			skipped += n
		}
		if rows := len(b.decisions) + len(b.rules) + len(b.shares); rows+skipped != 1 {
			t.Fatalf("%d rows and %d skips for one record", rows, skipped)
		}
		for _, row := range b.decisions {
			if len(row) != 34 {
				t.Fatalf("a decision row of %d columns", len(row))
			}
			if et := row[0].(time.Time); et.After(maxDateTime) || et.Before(time.Unix(0, 0)) {
				t.Fatalf("event time %v outside DateTime", et)
			}
		}
		for _, row := range b.rules {
			for _, i := range []int{0, 1, 13} { // version_time, published_at, expires_at
				if tm := row[i].(time.Time); tm.After(maxDateTime) || tm.Before(time.Unix(0, 0)) {
					t.Fatalf("rule column %d: %v outside DateTime", i, tm)
				}
			}
		}
	})
}
