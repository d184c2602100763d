package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/sluice-rl/sluice/rules"
)

// RegionWriter writes stage output to each region's Redis: dynamic rules to
// every region, each share only to the region it belongs to. It is safe for
// concurrent use.
type RegionWriter struct {
	stores  map[string]*rules.Store
	refused atomic.Int64
	// Logger, if set, reports rules refused at a region's cap.
	Logger *slog.Logger
}

// Refused counts the writes in which a region's dynamic-rule cap refused
// some rules (rules.ErrCapReached); they are not retried.
func (w *RegionWriter) Refused() int64 { return w.refused.Load() }

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
		if err := st.PutRules(ctx, o.Rules); errors.Is(err, rules.ErrCapReached) {
			// Retrying cannot help: the rules past the cap are refused, and
			// counted; the others are written.
			w.refused.Add(1)
			if w.Logger != nil {
				w.Logger.Warn("dynamic rules refused: the region's cap is reached", "region", region, "err", err)
			}
		} else if err != nil {
			errs = append(errs, fmt.Errorf("region %s: %w", region, err))
		}
		if err := st.PutShares(ctx, byRegion[region]); err != nil {
			errs = append(errs, fmt.Errorf("region %s: %w", region, err))
		}
	}
	return errors.Join(errs...)
}
