// Package aggregator splits global quotas across regions by demand: from the
// decision stream it computes, per global rule and heavy key, each region's
// share of the limit (see Shares), which enforcers apply to their buckets.
//
// # Usage
//
//	s, err := aggregator.New(aggregator.Options{Regions: regions, Rules: set.Rules})
//	for _, d := range records { s.Observe(d) }
//	out := s.Advance(watermark) // out.Shares: changed shares, versioned
package aggregator
