package aggregator

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
)

// benchRules are four global rules of the kinds a deployment splits across
// regions: per API key, per account, per organisation and route, and per
// tenant. benchRecords are decision records over 5 regions, 10 000 API keys
// (Zipf, so that a few are heavy), 2 000 accounts, 200 organisations, 8
// routes and 50 tenants, each with a client IP, ASN and JA4 as enforcers
// log them.
func benchRules() []*rules.Rule {
	mk := func(id string, keys ...rules.Key) *rules.Rule {
		r := &rules.Rule{ID: id, Limit: 1000, Period: time.Second, Burst: 1000, Global: true}
		for _, k := range keys {
			r.Match = append(r.Match, rules.Match{Key: k})
		}
		return r
	}
	return []*rules.Rule{
		mk("per-key", rules.KeyAPIKey),
		mk("per-account", rules.KeyAccount),
		mk("per-org-route", rules.KeyOrg, rules.KeyRoute),
		mk("per-tenant", rules.KeyTenant),
	}
}

var benchRegions = []string{"us-east", "us-west", "eu-west", "ap-south", "sa-east"}

func benchRecords(n int) []*decisionpb.Decision {
	rng := rand.New(rand.NewPCG(1, 2))
	zipf := rand.NewZipf(rng, 1.2, 1, 9_999)
	routes := []string{"/v1/items", "/v1/items/{id}", "/v1/orders", "/v1/orders/{id}", "/v1/search", "/v1/users/{id}", "/v1/login", "/v1/export"}
	out := make([]*decisionpb.Decision, n)
	for i := range out {
		k := zipf.Uint64()
		out[i] = &decisionpb.Decision{Version: 1, EventTimeMs: 1_700_000_000_000 + int64(i), Region: benchRegions[rng.IntN(len(benchRegions))],
			Outcome: decisionpb.Outcome_OUTCOME_ALLOWED, Cost: 1, MatchedRules: []string{"per-key", "per-account", "per-org-route", "per-tenant"},
			Descriptors: &decisionpb.Descriptors{
				ApiKey: fmt.Sprintf("key-%05d", k), Account: fmt.Sprintf("acct-%04d", k%2000), Org: fmt.Sprintf("org-%03d", k%200),
				Tenant: fmt.Sprintf("tenant-%02d", k%50), Route: routes[rng.IntN(len(routes))], Method: "GET",
				ClientIp: fmt.Sprintf("198.51.%d.%d", rng.IntN(256), rng.IntN(256)), Asn: 64500 + uint32(rng.IntN(100)),
				Ja4: "t13d1516h2_8daaf6152771_02713d6af862",
			}}
	}
	return out
}

// BenchmarkObserve is the aggregator's partition-tier work: one decision
// record folded into an interval's demand (four global rules, each matched:
// entity tag, top-k, count-min), on one goroutine. records/s is per core.
func BenchmarkObserve(b *testing.B) {
	s, err := New(Options{Regions: benchRegions, Rules: benchRules()})
	if err != nil {
		b.Fatal(err)
	}
	recs := benchRecords(1 << 14)
	p := s.NewPartial()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		p.Observe(recs[i&(len(recs)-1)])
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

// BenchmarkMergeInterval is the merge tier's work for one 250 ms interval:
// decode 16 partitions' partials (500 records each, four global rules),
// merge them and compute the shares. ms/interval must stay well below the
// interval for the merge tier to keep up.
func BenchmarkMergeInterval(b *testing.B) {
	const partitions = 16
	s, err := New(Options{Regions: benchRegions, Rules: benchRules()})
	if err != nil {
		b.Fatal(err)
	}
	recs := benchRecords(partitions * 500)
	bodies := make([][]byte, partitions)
	for p := range bodies {
		part := s.NewPartial()
		for _, r := range recs[p*500 : (p+1)*500] {
			part.Observe(r)
		}
		if bodies[p], err = part.MarshalBinary(); err != nil {
			b.Fatal(err)
		}
	}
	end := time.UnixMilli(1_700_000_000_000)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		var merged stage.Partial
		for _, body := range bodies {
			p, err := s.DecodePartial(body)
			if err != nil {
				b.Fatal(err)
			}
			if merged == nil {
				merged = p
			} else if err := merged.Merge(p); err != nil {
				b.Fatal(err)
			}
		}
		end = end.Add(s.o.Interval)
		s.Finish(stage.Window{Start: end.Add(-s.o.Interval), End: end}, merged)
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/interval")
}
