package sidecar_test

import (
	"context"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-rl/sluice/enforcer/sidecar"
	"github.com/sluice-rl/sluice/internal/redistest"
)

// rawCodec sends a request's bytes as they are, so that 64 concurrent
// callers of one 3.9 MB request share its single buffer: the heap the test
// watches is the server's.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	return proto.Unmarshal(data, v.(proto.Message))
}
func (rawCodec) Name() string { return "proto" }

func bigRequest(t *testing.T, domain, key, value string, entries int) []byte {
	t.Helper()
	d := &ratelimitv3.RateLimitDescriptor{}
	for range entries {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: key, Value: value})
	}
	b, err := proto.Marshal(&rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestOversizeInputs (issue 20, item 9): every oversize input is refused
// with a clear code, and 64 concurrent 3.9 MB requests leave the server's
// heap bounded. A message over 64 KiB (Options.MaxBody) is refused unread
// (ResourceExhausted); within it, a domain or entry key past its documented
// limit, or too many entries, is InvalidArgument (HTTP 400) naming it. Before:
// all accepted, and the 64 requests took the heap past 1 GB. A long value
// within the bound is counted (issue 35: TestLongValueCounted).
func TestOversizeInputs(t *testing.T) {
	e := newEnv(t, redistest.Server(t), testRules, sidecar.Options{})
	mb := strings.Repeat("v", 1<<20)
	for _, c := range []struct {
		name string
		req  []byte
		code codes.Code
		msg  string
	}{
		{"3.9 MB message", bigRequest(t, "t", "user", strings.Repeat("v", 3_900_000), 1), codes.ResourceExhausted, "larger than max"},
		{"1 MB value", bigRequest(t, "t", "user", mb, 1), codes.ResourceExhausted, "larger than max"},
		{"1 MB domain", bigRequest(t, mb, "user", "u", 1), codes.ResourceExhausted, "larger than max"},
		{"1 MB key", bigRequest(t, "t", mb, "u", 1), codes.ResourceExhausted, "larger than max"},
		{"1 KiB domain", bigRequest(t, strings.Repeat("d", 1<<10), "user", "u", 1), codes.InvalidArgument,
			"domain of 1024 bytes, more than 256 (sidecar.MaxDomain)"},
		{"1 KiB key", bigRequest(t, "t", strings.Repeat("k", 1<<10), "u", 1), codes.InvalidArgument,
			"descriptor 1, entry 1 (key \"kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk\"...): key of 1024 bytes, more than 256 (sidecar.MaxEntryKey)"},
		{"100 entries", bigRequest(t, "t", "user", "u", 100), codes.InvalidArgument,
			"descriptor 1: 100 entries, more than 64 (sidecar.MaxEntries)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out rlsv3.RateLimitResponse
			err := e.conn.Invoke(context.Background(), rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, &c.req, &out, grpc.ForceCodec(rawCodec{}))
			if st := status.Convert(err); st.Code() != c.code || !strings.Contains(st.Message(), c.msg) {
				t.Errorf("%v, want %v with %q", err, c.code, c.msg)
			}
		})
	}
	t.Run("heap", func(t *testing.T) {
		big := bigRequest(t, "t", "user", strings.Repeat("v", 3_900_000), 1)
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		base := ms.HeapInuse
		var peak atomic.Uint64
		stop := make(chan struct{})
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			var ms runtime.MemStats
			for {
				runtime.ReadMemStats(&ms)
				if ms.HeapInuse > peak.Load() {
					peak.Store(ms.HeapInuse)
				}
				select {
				case <-stop:
					return
				case <-time.After(2 * time.Millisecond):
				}
			}
		}()
		var wg sync.WaitGroup
		var refused atomic.Int64
		for range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var out rlsv3.RateLimitResponse
				err := e.conn.Invoke(context.Background(), rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, &big, &out, grpc.ForceCodec(rawCodec{}))
				if status.Code(err) == codes.ResourceExhausted {
					refused.Add(1)
				}
			}()
		}
		wg.Wait()
		close(stop)
		<-sampled
		grew := int64(peak.Load()) - int64(base)
		t.Logf("64 concurrent 3.9 MB requests: %d refused; the heap grew by %d MiB at most", refused.Load(), grew>>20)
		if refused.Load() != 64 {
			t.Errorf("%d of 64 refused with ResourceExhausted", refused.Load())
		}
		if grew > 64<<20 {
			t.Errorf("the heap grew by %d MiB while 64 requests of 3.9 MB were refused, want at most 64 MiB", grew>>20)
		}
	})
}

// TestSilentConnectionsAreCut (issue 20, item 9): a connection that never
// completes its HTTP/2 handshake is closed after sidecar.HandshakeTimeout,
// as the HTTP listener cuts a client that sends no request header. Before,
// 500 such connections were held for as long as they liked.
func TestSilentConnectionsAreCut(t *testing.T) {
	e := newEnv(t, redistest.Server(t), testRules, sidecar.Options{})
	addr := e.conn.Target()
	const n = 20
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns[i] = c
	}
	start := time.Now()
	for i, c := range conns {
		_ = c.SetReadDeadline(start.Add(sidecar.HandshakeTimeout + 5*time.Second))
		buf := make([]byte, 4096)
		var err error
		for err == nil {
			_, err = c.Read(buf) // the server's SETTINGS frame, then EOF
		}
		if err != io.EOF && !strings.Contains(err.Error(), "reset") {
			t.Fatalf("connection %d: %v after %v, want closed by the server", i, err, time.Since(start))
		}
	}
	if took := time.Since(start); took < sidecar.HandshakeTimeout-time.Second {
		t.Errorf("closed after %v, before the handshake timeout", took)
	}
}
