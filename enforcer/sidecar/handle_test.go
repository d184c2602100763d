package sidecar

import (
	"context"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	protobuf "google.golang.org/protobuf/proto"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// BenchmarkHandle measures the server's side of one gRPC check of 4
// descriptors against 4 rules on a local redis-server, without the
// transport: "decoded" hands the handler an already decoded request (what
// sluice itself allocates, plus go-redis's 6 and the circuit breaker's 1),
// "wire" decodes it from its protobuf bytes as gRPC does; both marshal the
// answer with the server's codec, which recycles it.
func BenchmarkHandle(b *testing.B) {
	set, err := rules.Parse("bench.yaml", []byte(`
domain: b
rules:
  - {id: r0, match: [{key: user}], limit: 1000000000, period: 1s}
  - {id: r1, match: [{key: client_ip}], limit: 1000000000, period: 1s}
  - {id: r2, match: [{key: tenant}], limit: 1000000000, period: 1s}
  - {id: r3, match: [{key: api_key}], limit: 1000000000, period: 1s}
`))
	if err != nil {
		b.Fatal(err)
	}
	// HotKeys.Table -1: every check goes to Redis, as the figures in
	// docs/benchmarks.md are (one key checked back to back would be served
	// from leases).
	lim, err := enforcer.New(redistest.Server(b), set, enforcer.Options{Budget: time.Second, HotKeys: enforcer.HotKeyOptions{Table: -1}})
	if err != nil {
		b.Fatal(err)
	}
	s, err := New(lim, Options{})
	if err != nil {
		b.Fatal(err)
	}
	d := func(k, v string) *ratelimitv3.RateLimitDescriptor {
		return &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: k, Value: v}}}
	}
	req := &rlsv3.RateLimitRequest{Domain: "b", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		d("user_id", "u"), d("remote_address", "192.0.2.1"), d("tenant_id", "t"), d("x-api-key", "k")}}
	wire, err := protobuf.Marshal(req)
	if err != nil {
		b.Fatal(err)
	}
	c := codec{s: s, base: encoding.GetCodecV2(proto.Name)}
	ctx := context.Background()
	for name, dec := range map[string]func(any) error{
		"decoded": func(v any) error {
			in := v.(*rlsv3.RateLimitRequest)
			in.Domain, in.Descriptors = req.Domain, req.Descriptors
			return nil
		},
		"wire": func(v any) error { return protobuf.Unmarshal(wire, v.(*rlsv3.RateLimitRequest)) },
	} {
		b.Run(name, func(b *testing.B) {
			one := func() {
				out, err := s.handle(ctx, dec, nil)
				if err != nil {
					b.Fatal(err)
				}
				if out.(*reply).OverallCode != rlsv3.RateLimitResponse_OK {
					b.Fatal(out)
				}
				buf, err := c.Marshal(out)
				if err != nil {
					b.Fatal(err)
				}
				buf.Free()
			}
			one()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				one()
			}
		})
	}
}
