package enforcer_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/enforcer/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// BenchmarkCheck measures one decision against a local redis-server: one
// EVALSHA round trip whatever the number of rules.
func BenchmarkCheck(b *testing.B) {
	for _, n := range []int{1, 4} {
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			y := "domain: b\nrules:\n"
			keys := []string{"user", "client_ip", "tenant", "api_key"}
			for i := 0; i < n; i++ {
				y += fmt.Sprintf("  - {id: r%d, match: [{key: %s}], limit: 1000000, period: 1s}\n", i, keys[i])
			}
			set, err := rules.Parse("b.yaml", []byte(y))
			if err != nil {
				b.Fatal(err)
			}
			l, err := enforcer.New(redistest.Server(b), set, enforcer.Options{})
			if err != nil {
				b.Fatal(err)
			}
			var req enforcer.Request
			req.Descriptors = rules.Descriptors{rules.KeyUser: "u", rules.KeyClientIP: "192.0.2.1", rules.KeyTenant: "t", rules.KeyAPIKey: "k"}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if d, _ := l.Check(ctx, &req); d.Err != nil {
					b.Fatal(d.Err)
				}
			}
		})
	}
}
