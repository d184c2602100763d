package pipeline

import (
	"context"
	"errors"
	"fmt"

	"github.com/sluice-rl/sluice/rules"
)

// RegionWriter writes stage output to each region's Redis: dynamic rules to
// every region, each share only to the region it belongs to. It is safe for
// concurrent use.
type RegionWriter struct {
	stores map[string]*rules.Store
}

// NewRegionWriter returns a writer over one store per region name.
func NewRegionWriter(stores map[string]*rules.Store) *RegionWriter {
	return &RegionWriter{stores: stores}
}

// Write delivers o; it tries every region and returns the errors joined.
func (w *RegionWriter) Write(ctx context.Context, o Output) error {
	byRegion := map[string][]rules.Share{}
	var errs []error
	for _, s := range o.Shares {
		if _, ok := w.stores[s.Region]; !ok {
			errs = append(errs, fmt.Errorf("share for unknown region %q", s.Region))
			continue
		}
		byRegion[s.Region] = append(byRegion[s.Region], s)
	}
	for region, st := range w.stores {
		if err := st.PutRules(ctx, o.Rules); err != nil {
			errs = append(errs, fmt.Errorf("region %s: %w", region, err))
		}
		if err := st.PutShares(ctx, byRegion[region]); err != nil {
			errs = append(errs, fmt.Errorf("region %s: %w", region, err))
		}
	}
	return errors.Join(errs...)
}
