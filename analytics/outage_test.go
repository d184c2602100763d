package analytics

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/internal/clickhousetest"
	"github.com/sluice-rl/sluice/internal/stagetest"
	"github.com/sluice-rl/sluice/pipeline"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
)

// outage is how long TestClickHouseDown keeps ClickHouse stopped.
const outage = 30 * time.Second

// TestClickHouseDown kills ClickHouse (SIGKILL) for 30 s while an enforcer's
// producer logs about 100 decisions a second to Kafka, read by the sink and
// by the pipeline (a counting stage, its own consumer group). While
// ClickHouse is down the pipeline goes on reading every record logged, and
// the sink retries; once ClickHouse is back the sink catches up,
// and every record logged is in ClickHouse exactly once (after FINAL).
func TestClickHouseDown(t *testing.T) {
	srv := clickhousetest.New(t)
	conn, _ := migrated(t, srv)
	brokers := newKafka(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// The other consumer: the pipeline, with a stage that counts records
	// (analytics may not import the detector; any stage reads every record).
	po := pipeline.Options{Brokers: brokers, Stages: []stage.Stage{&stagetest.CountStage{ID: "count", Size: 10 * time.Second}}, Writer: discard{}, Registerer: prometheus.NewRegistry()}
	if err := pipeline.EnsureTopics(ctx, po, 0); err != nil {
		t.Fatal(err)
	}
	pl, err := pipeline.New(po)
	if err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithCancel(ctx)
	pl.Start(pctx)
	defer func() { pcancel(); pl.Close() }()

	sink := runSink(t, brokers, "sink-outage", conn, func(o *SinkOptions) { o.RetryMax = time.Second })

	// The enforcer's side: about 100 records a second until stopped.
	prod, err := pipeline.NewProducer(pipeline.ProducerOptions{Brokers: brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	var logged atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			var d rules.Descriptors
			d[rules.KeyClientIP] = fmt.Sprintf("198.51.100.%d", i%250)
			prod.Log(decision.Record{Time: time.Now(), Region: "eu", Instance: "gw", RequestID: fmt.Sprintf("o-%06d", i),
				Domain: "sluice", Descriptors: d, Matched: []string{"per-ip"}, Outcome: decision.Allowed, Path: decision.PathRedis, Cost: 1})
			logged.Add(1)
		}
	}()
	stopProducing := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopProducing()

	// Before: rows flow.
	waitFor(t, time.Minute, func() (bool, string) {
		return sink.Stats().Rows[TableDecisions] >= 200, fmt.Sprintf("sink stats %+v", sink.Stats())
	})

	srv.Kill()
	down := time.Now()
	writtenAtKill := sink.Stats().Rows[TableDecisions]
	// During: the pipeline reads every record logged so far while the sink
	// fails and falls behind.
	time.Sleep(5 * time.Second) // let records pile up behind the dead ClickHouse
	target := logged.Load()
	waitFor(t, outage-5*time.Second, func() (bool, string) {
		return pl.Consumer.Processed() >= target, fmt.Sprintf("the pipeline processed %d of the %d records logged", pl.Consumer.Processed(), target)
	})
	st := sink.Stats()
	if st.InsertFailures == 0 {
		t.Errorf("sink stats %+v with ClickHouse down: want failed inserts", st)
	}
	if st.Rows[TableDecisions] > writtenAtKill+int64(sink.o.BatchRows) {
		t.Errorf("the sink wrote %d rows with ClickHouse down (%d before)", st.Rows[TableDecisions], writtenAtKill)
	}
	if lag := sink.Lag(); lag == 0 {
		t.Error("no sink lag with ClickHouse down")
	}
	time.Sleep(time.Until(down.Add(outage)))
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	t.Logf("ClickHouse down for %v; the pipeline had processed %d records meanwhile; the sink %d failed inserts",
		time.Since(down).Round(time.Second), target, st.InsertFailures)

	// After: a few more seconds of traffic, then everything in ClickHouse.
	time.Sleep(2 * time.Second)
	stopProducing()
	fctx, fcancel := context.WithTimeout(ctx, 30*time.Second)
	defer fcancel()
	if err := prod.Flush(fctx); err != nil {
		t.Fatal(err)
	}
	total := logged.Load()
	if ps := prod.Stats(); ps.Produced != total {
		t.Fatalf("producer %+v: want all %d produced", ps, total)
	}
	waitFor(t, time.Minute, func() (bool, string) {
		n := count(t, conn, "SELECT count() FROM decisions FINAL")
		return n == uint64(total) && sink.Lag() == 0, fmt.Sprintf("%d of %d records in ClickHouse, sink lag %d", n, total, sink.Lag())
	})
	ids := strs(t, conn, "SELECT DISTINCT request_id FROM decisions ORDER BY request_id")
	want := make([]string, total)
	for i := range want {
		want[i] = fmt.Sprintf("o-%06d", i)
	}
	if !slices.Equal(ids, want) {
		t.Errorf("%d distinct request ids in ClickHouse: want o-000000 to o-%06d", len(ids), total-1)
	}
	waitFor(t, time.Minute, func() (bool, string) {
		return pl.Consumer.Processed() >= total, fmt.Sprintf("the pipeline processed %d of %d", pl.Consumer.Processed(), total)
	})
}

type discard struct{}

func (discard) Write(context.Context, stage.Output) error { return nil }
