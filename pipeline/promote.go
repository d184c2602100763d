package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/pipeline/decisionpb"
	"github.com/sluice-rl/sluice/rules"
)

// MaxTallied bounds the rule ids a ShadowTally counts; decisions for rules
// past it are counted in Untallied only.
const MaxTallied = 10_000

// ShadowTally counts, from decision records, what each rule did: the
// decisions that matched it, and those it would have denied in shadow mode
// (the record's shadow_rule). It is the evidence a PromotionPolicy judges
// dynamic rules by. A record names one shadow rule (the first that would
// have denied), so when several shadow rules would have denied one request
// only that one is counted: the tally can only under-count would-be
// denials, which errs on the side of not promoting.
//
// It is a Stage (it produces no output) and safe for concurrent use. The
// zero value is not usable: use NewShadowTally.
type ShadowTally struct {
	mu        sync.Mutex
	m         map[string]*rules.ShadowStats
	untallied int64
}

// NewShadowTally returns an empty tally.
func NewShadowTally() *ShadowTally {
	return &ShadowTally{m: map[string]*rules.ShadowStats{}}
}

// Observe counts one decision record.
func (t *ShadowTally) Observe(d *decisionpb.Decision) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, id := range d.GetMatchedRules() {
		s := t.m[id]
		if s == nil {
			if len(t.m) >= MaxTallied {
				t.untallied++
				continue
			}
			s = new(rules.ShadowStats)
			t.m[id] = s
		}
		s.Matched++
		if id == d.GetShadowRule() {
			s.WouldDeny++
		}
	}
}

// Advance implements Stage: a tally closes no windows (its counts run from
// the first record it saw).
func (t *ShadowTally) Advance(time.Time) Output { return Output{} }

// Stats returns the rule's counts so far.
func (t *ShadowTally) Stats(id string) rules.ShadowStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.m[id]; s != nil {
		return *s
	}
	return rules.ShadowStats{}
}

// Untallied returns the decisions left uncounted because MaxTallied rule ids
// were already tallied.
func (t *ShadowTally) Untallied() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.untallied
}

// Promoter applies a PromotionPolicy to the dynamic rules of every region:
// the shadow rules whose tallied evidence satisfies it are switched to
// enforce with rules.Store.Promote, which keeps the shadow version so that
// `sluice rules rollback --rule ID` undoes the promotion in one step (and the
// policy never promotes a rolled-back rule again).
type Promoter struct {
	Policy rules.PromotionPolicy
	Tally  *ShadowTally
	Stores map[string]*rules.Store // by region
	Logger *slog.Logger            // default slog.Default()
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
