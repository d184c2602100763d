// Package aggregator splits global quotas across regions by demand: from the
// decision stream it computes, per global rule and heavy key, each region's
// share of the limit (see Shares), which enforcers apply to their buckets.
//
// # Usage
//
//	s, err := aggregator.New(aggregator.Options{Regions: regions, Rules: set.Rules})
//	// In the pipeline (pipeline.Options.Stages), or in one process:
//	l := stage.NewLocal([]stage.Stage{s}, 4, 10*time.Second)
//	for i, d := range records { l.Observe(i, d) }
//	out := l.Advance(watermark) // out.Shares: changed shares, versioned
package aggregator
