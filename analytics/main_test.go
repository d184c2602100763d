package analytics

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/internal/clickhousetest"
	"github.com/sluice-rl/sluice/pipeline"
)

// The package's clickhouse-server, started by the first test that needs
// it (a fuzzing run needs none); each test migrates a database of its own
// on it.
var (
	sharedOnce sync.Once
	sharedSrv  *clickhousetest.Server
	sharedErr  error
)

// shared returns the package's server, failing t when it cannot start.
func shared(t testing.TB) *clickhousetest.Server {
	t.Helper()
	sharedOnce.Do(func() { sharedSrv, sharedErr = clickhousetest.Start() })
	if sharedErr != nil {
		t.Fatal("these tests need a real clickhouse-server: ", sharedErr)
	}
	return sharedSrv
}

func TestMain(m *testing.M) {
	code := m.Run()
	if sharedSrv != nil {
		sharedSrv.Close()
	}
	os.Exit(code)
}

// migrated creates a database on srv, migrates it and returns a
// connection to it, closed at cleanup.
func migrated(t testing.TB, srv *clickhousetest.Server) (driver.Conn, ConnOptions) {
	t.Helper()
	o := ConnOptions{Addr: srv.Addr(), Database: srv.Database(t)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := Migrate(ctx, o); err != nil {
		t.Fatal(err)
	}
	conn, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, o
}

// newKafka starts an in-process broker on loopback TCP with the decision
// topic (4 partitions) and the output topic.
func newKafka(t *testing.T) []string {
	t.Helper()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, pipeline.DefaultTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	brokers := kc.ListenAddrs()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pipeline.EnsureOutputTopic(ctx, brokers, pipeline.DefaultOutputTopic); err != nil {
		t.Fatal(err)
	}
	return brokers
}

// runSink starts a sink in group on brokers, writing through conn, and
// stops it at cleanup.
func runSink(t *testing.T, brokers []string, group string, conn driver.Conn, mod func(*SinkOptions)) *Sink {
	t.Helper()
	o := SinkOptions{Brokers: brokers, Group: group, Conn: conn, FlushInterval: 100 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
		Registerer: prometheus.NewRegistry()}
	if mod != nil {
		mod(&o)
	}
	s, err := NewSink(o)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(context.Background()) }()
	t.Cleanup(func() { s.Close(); <-done })
	return s
}

// produce logs recs through a pipeline.Producer, as an enforcer does, and
// waits until Kafka has them all.
func produce(t *testing.T, brokers []string, recs []decision.Record) {
	t.Helper()
	p, err := pipeline.NewProducer(pipeline.ProducerOptions{Brokers: brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, r := range recs {
		p.Log(r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Produced != int64(len(recs)) {
		t.Fatalf("producer stats %+v: want all %d produced", st, len(recs))
	}
}

// waitFor polls cond until it holds, failing t with cond's last message
// after limit. It waits for an outcome; it asserts nothing about time.
func waitFor(t *testing.T, limit time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		ok, msg := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not reached within %v: %s", limit, msg)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// count runs a query returning one UInt64.
func count(t *testing.T, conn driver.Conn, q string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var n uint64
	if err := conn.QueryRow(ctx, q).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// strs runs a query returning one String column.
func strs(t *testing.T, conn driver.Conn, q string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := conn.Query(ctx, q)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func table(t *testing.T, tb *Table) string {
	t.Helper()
	var b strings.Builder
	if err := tb.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}
