package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-rl/sluice/pipeline"
)

// breakingListener is a listener that breaks for good when the test says
// so, as one whose socket is closed under the server does: Accept returns
// errListenerBroken from then on.
type breakingListener struct {
	net.Listener
	broken chan struct{}
}

var errListenerBroken = errors.New("test: the listener broke")

func (l *breakingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		select {
		case <-l.broken:
			return nil, errListenerBroken
		default:
		}
	}
	return c, err
}

func (l *breakingListener) breakNow() {
	close(l.broken)
	l.Listener.Close()
}

// TestServeStopsWhenAListenerFails: the gRPC listener breaks while the
// sidecar runs; the sidecar does not go on serving HTTP alone but drains and
// returns the listener's error, named, so that `sluice serve` exits 1.
func TestServeStopsWhenAListenerFails(t *testing.T) {
	var grpcLn *breakingListener
	listen := func(ctx context.Context, network, addr string) (net.Listener, error) {
		var lc net.ListenConfig
		ln, err := lc.Listen(ctx, network, addr)
		if err != nil || grpcLn != nil {
			return ln, err
		}
		grpcLn = &breakingListener{Listener: ln, broken: make(chan struct{})} // the first opened: gRPC's
		return grpcLn, nil
	}
	a, done := mustServe(t, context.Background(), serveConfig{Listen: listen})
	conn, err := grpc.NewClient(a[0].String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, rlReq("sluice", "tenant_id", "t1")); err != nil {
		t.Fatalf("the check before the listener broke: %v", err)
	}
	grpcLn.breakNow()
	select {
	case err := <-done:
		if !errors.Is(err, errListenerBroken) || !strings.Contains(err.Error(), "gRPC server") {
			t.Fatalf("runServe returned %v; want the broken listener's error, named gRPC server", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the sidecar went on running with its gRPC listener broken")
	}
	// And the HTTP side is gone too: nothing serves half a sidecar.
	if r, err := http.Get("http://" + a[1].String() + "/readyz"); err == nil {
		r.Body.Close()
		t.Fatalf("HTTP still answers (%d) after the sidecar stopped", r.StatusCode)
	}
}

// TestServeUnreadyWhileKafkaIsDown: with --brokers and --ready-needs-kafka,
// the sidecar reports unready while no broker answers and ready again once
// one does, and answers checks all along; without --ready-needs-kafka (the
// default, documented) it stays ready and /readyz says that records fail.
func TestServeUnreadyWhileKafkaIsDown(t *testing.T) {
	t.Parallel() // each case has its own kfake and sidecar, and mostly waits on /readyz
	for _, require := range []bool{true, false} {
		t.Run(map[bool]string{true: "ready-needs-kafka", false: "default"}[require], func(t *testing.T) {
			t.Parallel()
			kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, pipeline.DefaultTopic))
			if err != nil {
				t.Fatal(err)
			}
			broker := kc.ListenAddrs()[0]
			_, port, _ := net.SplitHostPort(broker)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			addrs := make(chan [2]net.Addr, 1)
			done := make(chan error, 1)
			c := serveConfig{
				GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Brokers: []string{broker},
				Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
				Listening: func(g, h net.Addr) { addrs <- [2]net.Addr{g, h} },
			}
			c.Server.RequireRecords = require
			go func() { done <- runServe(ctx, c) }()
			var a [2]net.Addr
			select {
			case a = <-addrs:
			case err := <-done:
				t.Fatalf("runServe: %v", err)
			}
			readyz := func() (int, string) {
				r, err := http.Get("http://" + a[1].String() + "/readyz")
				if err != nil {
					t.Fatal(err)
				}
				defer r.Body.Close()
				b, _ := io.ReadAll(r.Body)
				return r.StatusCode, string(b)
			}
			until := func(what string, ok func(code int, body string) bool) {
				t.Helper()
				var code int
				var body string
				for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
					if code, body = readyz(); ok(code, body) {
						return
					}
				}
				t.Fatalf("not within 15 s: %s; last /readyz %d %q", what, code, body)
			}
			conn, err := grpc.NewClient(a[0].String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			check := func() {
				t.Helper()
				cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
				defer ccancel()
				resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(cctx, rlReq("sluice", "tenant_id", "t1"))
				if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					t.Fatalf("check: %v %v", resp, err)
				}
			}

			until("ready with Kafka up", func(code int, body string) bool {
				return code == http.StatusOK && strings.Contains(body, "decision records: ok")
			})
			check()
			kc.Close()
			want := http.StatusOK
			if require {
				want = http.StatusServiceUnavailable
			}
			until("Kafka down shows", func(code int, body string) bool {
				return code == want && strings.Contains(body, "decision records cannot be delivered")
			})
			check() // decisions go on without Kafka
			kc2, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(atoi(t, port)), kfake.SeedTopics(1, pipeline.DefaultTopic))
			if err != nil {
				t.Fatal(err)
			}
			defer kc2.Close()
			until("ready with Kafka back", func(code int, body string) bool {
				return code == http.StatusOK && strings.Contains(body, "decision records: ok")
			})
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("runServe after its context ended: %v", err)
			}
		})
	}
}

// TestPipelineExitsWhenKafkaRefusesItsGroup: a Kafka that refuses the
// pipeline its consumer group (an ACL: GROUP_AUTHORIZATION_FAILED) stops
// `sluice pipeline` with an error naming it, instead of a process that runs
// on and consumes nothing.
func TestPipelineExitsWhenKafkaRefusesItsGroup(t *testing.T) {
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, pipeline.DefaultTopic))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	kc.ControlKey(kmsg.JoinGroup.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		resp := req.ResponseKind().(*kmsg.JoinGroupResponse)
		resp.ErrorCode = kerr.GroupAuthorizationFailed.Code
		return resp, nil, true
	})
	type result struct {
		stderr string
		err    error
	}
	done := make(chan result, 1)
	go func() {
		_, stderr, err := sluice(t, "pipeline", "--brokers", kc.ListenAddrs()[0], "--region", "eu", "--metrics", "")
		done <- result{stderr, err}
	}()
	select {
	case r := <-done:
		if !errors.Is(r.err, kerr.GroupAuthorizationFailed) {
			t.Fatalf("sluice pipeline returned %v; want GROUP_AUTHORIZATION_FAILED\n%s", r.err, r.stderr)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("sluice pipeline went on running with its group refused")
	}
}

// atoi parses a port.
func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
