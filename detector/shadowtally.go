package detector

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/pipeline/stage"
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
// It is a Stage (windows of a minute, producing no output) and a
// Checkpointer: its counts run from the first record and survive a change
// of merge tier. Stats and Untallied are safe for concurrent use with the
// pipeline. The zero value is not usable: use NewShadowTally.
type ShadowTally struct {
	mu        sync.Mutex
	m         map[string]*rules.ShadowStats
	untallied int64
}

// NewShadowTally returns an empty tally.
func NewShadowTally() *ShadowTally {
	return &ShadowTally{m: map[string]*rules.ShadowStats{}}
}

// Name is the stage's name in the pipeline.
func (t *ShadowTally) Name() string { return "shadow-tally" }

// Window is how often the counts are merged in: a minute.
func (t *ShadowTally) Window() time.Duration { return time.Minute }

// tallyPartial is one window's counts on one partition.
type tallyPartial struct {
	m         map[string]*rules.ShadowStats
	untallied int64
}

// NewPartial returns empty counts.
func (t *ShadowTally) NewPartial() stage.Partial {
	return &tallyPartial{m: map[string]*rules.ShadowStats{}}
}

// Observe counts one decision record.
func (p *tallyPartial) Observe(d *decisionpb.Decision) {
	for _, id := range d.GetMatchedRules() {
		s := p.m[id]
		if s == nil {
			if len(p.m) >= MaxTallied {
				p.untallied++
				continue
			}
			s = new(rules.ShadowStats)
			p.m[id] = s
		}
		s.Matched++
		if id == d.GetShadowRule() {
			s.WouldDeny++
		}
	}
}

// Merge adds another partition's counts.
func (p *tallyPartial) Merge(o stage.Partial) error {
	x, ok := o.(*tallyPartial)
	if !ok {
		return fmt.Errorf("pipeline: shadow tally cannot merge a %T", o)
	}
	p.untallied += addTally(p.m, x.m)
	p.untallied += x.untallied
	return nil
}

// addTally adds src into dst, at most MaxTallied ids; it returns the
// decisions of ids that did not fit.
func addTally(dst, src map[string]*rules.ShadowStats) int64 {
	var left int64
	for _, id := range slices.Sorted(maps.Keys(src)) {
		s := dst[id]
		if s == nil {
			if len(dst) >= MaxTallied {
				left += src[id].Matched
				continue
			}
			s = new(rules.ShadowStats)
			dst[id] = s
		}
		s.Matched += src[id].Matched
		s.WouldDeny += src[id].WouldDeny
	}
	return left
}

func marshalTally(m map[string]*rules.ShadowStats, untallied int64) []byte {
	b := binary.AppendVarint(nil, untallied)
	b = binary.AppendUvarint(b, uint64(len(m)))
	for _, id := range slices.Sorted(maps.Keys(m)) {
		b = stage.AppendString(b, id)
		b = binary.AppendVarint(b, m[id].Matched)
		b = binary.AppendVarint(b, m[id].WouldDeny)
	}
	return b
}

func unmarshalTally(b []byte) (map[string]*rules.ShadowStats, int64, error) {
	r := stage.NewStateReader(b)
	untallied := r.Varint()
	m := map[string]*rules.ShadowStats{}
	for range r.Count(3) {
		id := r.String()
		m[id] = &rules.ShadowStats{Matched: r.Varint(), WouldDeny: r.Varint()}
	}
	if err := r.Done(); err != nil {
		return nil, 0, fmt.Errorf("pipeline: shadow tally: %w", err)
	}
	return m, untallied, nil
}

// MarshalBinary encodes the counts, sorted by rule id.
func (p *tallyPartial) MarshalBinary() ([]byte, error) { return marshalTally(p.m, p.untallied), nil }

// DecodePartial decodes what a partial's MarshalBinary wrote.
func (t *ShadowTally) DecodePartial(b []byte) (stage.Partial, error) {
	m, u, err := unmarshalTally(b)
	if err != nil {
		return nil, err
	}
	return &tallyPartial{m: m, untallied: u}, nil
}

// Finish adds a window's counts to the running tally.
func (t *ShadowTally) Finish(_ stage.Window, merged stage.Partial) stage.Output {
	p, ok := merged.(*tallyPartial)
	if !ok {
		return stage.Output{}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.untallied += addTally(t.m, p.m) + p.untallied
	return stage.Output{}
}

// MarshalState encodes the running tally.
func (t *ShadowTally) MarshalState() ([]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return marshalTally(t.m, t.untallied), nil
}

// UnmarshalState restores what MarshalState wrote.
func (t *ShadowTally) UnmarshalState(b []byte) error {
	m, u, err := unmarshalTally(b)
	if err != nil {
		return err
	}
	t.mu.Lock()
	t.m, t.untallied = m, u
	t.mu.Unlock()
	return nil
}

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
