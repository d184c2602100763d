package sidecar_test

import (
	"context"
	"sync"
	"testing"
	"time"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/enforcer/sidecar"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

type recorder struct {
	mu   sync.Mutex
	recs []decision.Record
}

func (r *recorder) Log(rec decision.Record) { r.mu.Lock(); r.recs = append(r.recs, rec); r.mu.Unlock() }

func (r *recorder) get() []decision.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]decision.Record(nil), r.recs...)
}

func httpLog(entries ...*accesslogv3.HTTPAccessLogEntry) *alsv3.StreamAccessLogsMessage {
	return &alsv3.StreamAccessLogsMessage{LogEntries: &alsv3.StreamAccessLogsMessage_HttpLogs{
		HttpLogs: &alsv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: entries}}}
}

func entry(id string, code uint32) *accesslogv3.HTTPAccessLogEntry {
	return &accesslogv3.HTTPAccessLogEntry{
		Request:  &accesslogv3.HTTPRequestProperties{RequestId: id},
		Response: &accesslogv3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(code)},
	}
}

// Envoy's check carries the request id as a descriptor entry; its access
// log later reports that request's status over the sidecar's gRPC port,
// and the decision record is logged then, with the status. A check with
// no request id is logged at once, without one.
func TestStatusFromEnvoyAccessLog(t *testing.T) {
	set, err := rules.Parse("t.yaml", []byte(testRules))
	if err != nil {
		t.Fatal(err)
	}
	out := &recorder{}
	reg := prometheus.NewRegistry()
	join, err := sidecar.NewStatusJoin(out, sidecar.StatusJoinOptions{Wait: time.Hour, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	lim, err := enforcer.New(redistest.Server(t), set, enforcer.Options{Budget: time.Second, Sink: join})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := sidecar.New(lim, sidecar.Options{Registry: reg, StatusJoin: join})
	if err != nil {
		t.Fatal(err)
	}
	conn := serveGRPC(t, srv)
	e := &env{rls: rlsv3.NewRateLimitServiceClient(conn)}
	e.check(t, rlReq("t", desc("user", "u1", "request_id", "req-1", "user_agent", "curl/8.4.0")))
	e.check(t, rlReq("t", desc("user", "u2", "x-request-id", "req-2")))
	e.check(t, rlReq("t", desc("user", "u3")))
	if recs := out.get(); len(recs) != 1 || recs[0].Descriptors[rules.KeyUser] != "u3" || recs[0].Status != 0 {
		t.Fatalf("before the access log: %+v, want only u3's record, without a status", recs)
	}

	stream, err := alsv3.NewAccessLogServiceClient(conn).StreamAccessLogs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(httpLog(entry("req-2", 404), entry("req-9", 200))); err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(httpLog(entry("req-1", 401))); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	got := map[string]decision.Record{}
	for _, r := range out.get() {
		got[r.Descriptors[rules.KeyUser]] = r
	}
	if len(got) != 3 || got["u1"].Status != 401 || got["u1"].RequestID != "req-1" || got["u1"].UserAgent != "curl/8.4.0" ||
		got["u2"].Status != 404 || got["u2"].RequestID != "req-2" {
		t.Fatalf("after the access log: %+v", got)
	}
	u1, u2 := got["u1"], got["u2"]
	if u1.Descriptors.Custom("request_id") != "" || u2.Descriptors.Custom("x-request-id") != "" {
		t.Fatal("the request id entry was taken as a descriptor")
	}
	for outcome, n := range map[string]float64{"passed": 1, "joined": 2, "unmatched": 1, "expired": 0} {
		if c := counter(t, reg, "sluice_sidecar_status_join_total", "outcome", outcome); c != n {
			t.Errorf("status join %s: %v, want %v", outcome, c, n)
		}
	}
}

// At shutdown the join still takes statuses for a grace period, for checks
// answered just before it, then logs what it holds and ends the access-log
// streams, so that a graceful stop of the gRPC server does not wait for
// Envoy to close them.
func TestStatusJoinDrains(t *testing.T) {
	set, err := rules.Parse("t.yaml", []byte(testRules))
	if err != nil {
		t.Fatal(err)
	}
	out := &recorder{}
	join, err := sidecar.NewStatusJoin(out, sidecar.StatusJoinOptions{Wait: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	lim, err := enforcer.New(redistest.Server(t), set, enforcer.Options{Budget: time.Second, Sink: join})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := sidecar.New(lim, sidecar.Options{StatusJoin: join})
	if err != nil {
		t.Fatal(err)
	}
	conn := serveGRPC(t, srv)
	e := &env{rls: rlsv3.NewRateLimitServiceClient(conn)}
	e.check(t, rlReq("t", desc("user", "u1", "request_id", "late-1")))
	e.check(t, rlReq("t", desc("user", "u2", "request_id", "never")))
	stream, err := alsv3.NewAccessLogServiceClient(conn).StreamAccessLogs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { join.Run(ctx); close(ran) }()
	cancel() // the sidecar stops; the status comes just after
	if err := stream.Send(httpLog(entry("late-1", 503))); err != nil {
		t.Fatal(err)
	}
	<-ran
	// The server ended the stream: a send soon fails (io.EOF).
	deadline := time.Now().Add(10 * time.Second)
	for stream.Send(httpLog(entry("after", 200))) == nil {
		if time.Now().After(deadline) {
			t.Fatal("the access-log stream stayed open after the join closed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	got := map[string]uint32{}
	for _, r := range out.get() {
		got[r.RequestID] = r.Status
	}
	if len(got) != 2 || got["late-1"] != 503 || got["never"] != 0 {
		t.Fatalf("records after the drain: %v, want late-1 with 503 and never without a status", got)
	}
}
