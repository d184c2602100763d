package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/sluice-rl/sluice/rules"
)

// Tally gives a rule's shadow-mode evidence: how many requests it matched and
// how many it would have denied (detector.ShadowTally, fed by the pipeline).
type Tally interface {
	Stats(id string) rules.ShadowStats
}

// Promoter applies a PromotionPolicy to the dynamic rules of every region:
// the shadow rules whose tallied evidence satisfies it are switched to
// enforce with Store.Promote, which keeps the shadow version so that
// `sluice rules rollback --rule ID` undoes the promotion in one step (and the
// policy never promotes a rolled-back rule again).
type Promoter struct {
	Policy rules.PromotionPolicy
	Tally  Tally
	Stores map[string]*Store // by region
	Logger *slog.Logger      // default slog.Default()
}

// Promote judges every region's dynamic rules at now and promotes those the
// policy accepts. It returns the verdicts of each region (for logs and
// tests) and the errors of the regions it could not read or write, joined.
func (p *Promoter) Promote(ctx context.Context, now time.Time) (map[string][]rules.Verdict, error) {
	log := p.Logger
	if log == nil {
		log = slog.Default()
	}
	out := map[string][]rules.Verdict{}
	var errs []error
	for region, st := range p.Stores {
		ds, err := st.Dynamic(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("region %s: %w", region, err))
			continue
		}
		cs := make([]rules.Candidate, len(ds))
		for i, d := range ds {
			cs[i] = rules.Candidate{Rule: d, Stats: p.Tally.Stats(d.ID)}
		}
		vs := p.Policy.Decide(now, cs)
		for _, v := range vs {
			if !v.Promote {
				continue
			}
			if _, err := st.Promote(ctx, v.ID); err != nil {
				errs = append(errs, fmt.Errorf("region %s: promoting %s: %w", region, v.ID, err))
				continue
			}
			log.Info("promoted a dynamic rule from shadow to enforce", "region", region, "rule", v.ID, "why", v.Reason)
		}
		out[region] = vs
	}
	return out, errors.Join(errs...)
}
