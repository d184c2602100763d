package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/syncbuf"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

var listening = regexp.MustCompile(`grpc=(127\.0\.0\.1:\d+) http=(127\.0\.0\.1:\d+)`)

// serve runs `sluice serve args...` until the test ends and returns its
// gRPC and HTTP addresses.
func serve(t *testing.T, args ...string) (grpcAddr, httpAddr string, log *syncbuf.Buffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	log = new(syncbuf.Buffer)
	root := newRoot()
	// A budget that a loaded test machine's healthy Redis always meets: the
	// test checks the wiring, not the deadline.
	root.SetArgs(append([]string{"serve", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--admin-http", "127.0.0.1:0", "--budget", "1s"}, args...))
	root.SetErr(log)
	root.SetOut(io.Discard)
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("serve did not stop within 15 s of its context's end")
		}
		if !strings.Contains(log.String(), "sluice sidecar stopped") {
			t.Errorf("no clean stop in the log:\n%s", log)
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if m := listening.FindStringSubmatch(log.String()); m != nil {
			return m[1], m[2], log
		}
		select {
		case err := <-done:
			t.Fatalf("serve exited: %v\n%s", err, log)
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("serve did not listen within 10 s:\n%s", log)
	return "", "", nil
}

func TestServe(t *testing.T) {
	for name, args := range map[string][]string{
		"embedded":     nil,
		"redis-server": {"--redis", redistest.Addr(t), "--rules", "../../testdata/rules/per-ip-60.yaml", "--refresh", "50ms"},
	} {
		t.Run(name, func(t *testing.T) {
			grpcAddr, httpAddr, log := serve(t, args...)
			if name == "embedded" && !strings.Contains(log.String(), "in-process Redis") {
				t.Errorf("embedded mode without its warning:\n%s", log)
			}
			conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			domain := "sluice"
			if name != "embedded" {
				domain = "replay"
			}
			resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
				Domain: domain,
				Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
					{Key: "remote_address", Value: "192.0.2.1"}}}},
			})
			if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCurrentLimit().GetName() != "per-ip" {
				t.Fatalf("gRPC check: %v %v", resp, err)
			}
			r, err := http.Post("http://"+httpAddr+"/v1/check", "application/json",
				strings.NewReader(`{"domain":"`+domain+`","descriptors":[{"entries":[{"key":"remote_address","value":"192.0.2.1"}]}]}`))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(r.Body)
			r.Body.Close()
			if r.StatusCode != http.StatusOK || r.Header.Get("RateLimit") == "" {
				t.Errorf("HTTP check: %d %v %s", r.StatusCode, r.Header, body)
			}
			for path, want := range map[string]string{"/readyz": "ready", "/metrics": "process_cpu_seconds_total"} {
				r, err := http.Get("http://" + httpAddr + path)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(r.Body)
				r.Body.Close()
				if r.StatusCode != http.StatusOK || !strings.Contains(string(b), want) {
					t.Errorf("%s: %d, want 200 with %q", path, r.StatusCode, want)
				}
			}
		})
	}
}

// TestServePinned runs `sluice serve --region a --home b=...` with a pinned
// rule: a key whose home is b is counted in b's redis-server, not a's.
func TestServePinned(t *testing.T) {
	t.Run("no credentials", func(t *testing.T) {
		ra, rb := redistest.Server(t), redistest.Server(t)
		testServePinned(t, ra, rb, nil, "--redis", ra.Options().Addr, "--home", "b="+rb.Options().Addr, "--drain-delay", "0s")
	})
	// Issue 32: this region's password from the environment, the home
	// region's own in its --home URL.
	t.Run("credentials", func(t *testing.T) {
		clearRedisEnv(t)
		pa, pb := redistest.Password(t), redistest.Password(t)
		ra := redis.NewClient(&redis.Options{Addr: redistest.RequirePass(t, pa), Password: pa})
		rb := redis.NewClient(&redis.Options{Addr: redistest.RequirePass(t, pb), Password: pb})
		t.Cleanup(func() { ra.Close(); rb.Close() })
		t.Setenv("REDIS_PASSWORD", pa)
		scan := newSecretScan(t, pa, pb)
		testServePinned(t, ra, rb, scan, "--redis", ra.Options().Addr, "--home", "b=redis://:"+pb+"@"+rb.Options().Addr, "--drain-delay", "0s")
	})
}

// testServePinned runs `sluice serve --region a` with a pinned rule and
// args naming region a's Redis and region b's (--home): a key homed in b is
// counted in b's Redis alone.
func testServePinned(t *testing.T, ra, rb *redis.Client, scan *secretScan, args ...string) {
	t.Helper()
	dir := t.TempDir()
	path := dir + "/pinned.yaml"
	if err := os.WriteFile(path, []byte("domain: p\nrules:\n  - {id: paid, match: [{key: api_key}], limit: 2, period: 1h, global: true, pinned: true}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, httpAddr, log := serve(t, append(args, "--region", "a", "--rules", path)...)
	if scan != nil {
		scan.add("serve's log", log)
	}
	set, err := rules.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	var key string
	var d rules.Descriptors
	for i := 0; key == ""; i++ {
		d[rules.KeyAPIKey] = fmt.Sprintf("k-%d", i)
		if h, _ := rules.HomeRegion(rules.EntityTag(set.Rule("paid"), &d), []string{"a", "b"}); h == "b" {
			key = d[rules.KeyAPIKey]
		}
	}
	var codes []int
	for range 3 {
		r, err := http.Post("http://"+httpAddr+"/v1/check", "application/json",
			strings.NewReader(`{"domain":"p","descriptors":[{"entries":[{"key":"api_key","value":"`+key+`"}]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		codes = append(codes, r.StatusCode)
	}
	if fmt.Sprint(codes) != "[200 200 429]" {
		t.Errorf("statuses %v, want two allowed then 429", codes)
	}
	k := "sl:{" + rules.EntityTag(set.Rule("paid"), &d) + "}:paid:0"
	if rb.Exists(context.Background(), k).Val() != 1 || ra.Exists(context.Background(), k).Val() != 0 {
		t.Errorf("the pinned counter is not in b's Redis alone")
	}
}

func TestServeFlags(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--fail-closed-status", "500"},
		{"serve", "--rules", "no-such-file.yaml", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"},
		{"serve", "extra-arg"},
		{"serve", "--budget", "-1s"},
		{"serve", "--budget", "0s"},
		{"serve", "--refresh", "-1s"},
		{"serve", "--drain-timeout", "-1s"},
		{"serve", "--instances", "-1"},
		{"serve", "--remembered-keys", "0"},
		{"serve", "--regions", "0"},
		{"serve", "--redis", "no-port", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"},
		{"serve", "--redis", "127.0.0.1:notaport", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"},
		{"serve", "--redis-cluster", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"},
		{"serve", "--home", "eu west=127.0.0.1:1"},
		{"serve", "--home", "eu=no-port"},
		{"serve", "--home-budget", "0s"},
		{"serve", "--home", "eu=127.0.0.1:1", "--regions", "5", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"},
		// Found by a fresh user: a region named twice, a region name with a
		// space, a home that is this region's own Redis.
		{"serve", "--home", "eu=127.0.0.1:1", "--home", "eu=127.0.0.1:2"},
		{"serve", "--home", "eu=127.0.0.1:1,eu=127.0.0.1:2"},
		{"serve", "--region", "bad region!"},
		{"serve", "--redis", "127.0.0.1:7", "--home", "eu=127.0.0.1:7"},
		{"serve", "--home", "no-equals-sign"},
		{"serve", "--budget", "1h"},
		{"serve", "--refresh", "1ms"},
	} {
		root := newRoot()
		root.SetArgs(args)
		root.SetErr(io.Discard)
		root.SetOut(io.Discard)
		if err := root.ExecuteContext(context.Background()); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}
