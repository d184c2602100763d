package pipeline

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"
)

// partialResult is what the merge tier did with one partial record.
type partialResult uint8

const (
	partialMerged    partialResult = iota // kept for its window
	partialDuplicate                      // its window already has this partition's partial
	partialFinished                       // its window was already finished
	partialBad                            // undecodable, or for an unknown stage
	numPartialResults
)

var partialResultNames = [numPartialResults]string{"merged", "duplicate", "finished", "bad"}

// mergeState is the I/O-free core of the merge tier. It collects every
// source partition's partial of each window, follows each source
// partition's watermark from the partials and markers, and finishes a
// window once every source partition that is not idle has a watermark at or
// past its end: it merges the partials in partition order and calls the
// stage's Finish. Windows finish in order of end, then of stage.
type mergeState struct {
	stages   []Stage
	byName   map[string]int
	sources  int32 // partitions of the decision topic
	wm       map[int32]int64
	idle     map[int32]bool
	pending  map[winKey]map[int32][]byte
	first    map[winKey]int64 // partials-topic offset of a pending window's first partial
	finished int64            // every window ending at or before it has finished
}

type winKey struct {
	stage      int
	start, end int64
}

func newMergeState(stages []Stage, sources int32) *mergeState {
	m := &mergeState{stages: stages, byName: map[string]int{}, sources: sources,
		wm: map[int32]int64{}, idle: map[int32]bool{}, pending: map[winKey]map[int32][]byte{}, first: map[winKey]int64{}, finished: minInt64}
	for i, s := range stages {
		m.byName[s.Name()] = i
	}
	return m
}

// add takes one record of the partials topic, read at offset. The body of a
// kept partial is copied.
func (m *mergeState) add(r *partialRecord, offset int64) partialResult {
	m.idle[r.source] = r.idle
	if r.kind == kindMarker {
		// Only a marker moves a source's watermark: it comes after every
		// partial its watermark closed, whereas a partial may be read
		// before the other partials of its batch.
		if r.wm > m.wm[r.source] || !m.known(r.source) {
			m.wm[r.source] = r.wm
		}
		return partialMerged
	}
	i, ok := m.byName[r.stage]
	if !ok {
		return partialBad
	}
	if r.end <= m.finished {
		return partialFinished
	}
	k := winKey{stage: i, start: r.start, end: r.end}
	parts := m.pending[k]
	if parts == nil {
		parts = map[int32][]byte{}
		m.pending[k] = parts
		m.first[k] = offset
	}
	if _, dup := parts[r.source]; dup {
		return partialDuplicate
	}
	parts[r.source] = slices.Clone(r.body)
	return partialMerged
}

func (m *mergeState) known(p int32) bool {
	_, ok := m.wm[p]
	return ok
}

// watermark is the least watermark over source partitions that are not
// idle; a partition not heard from holds it back. With every partition
// idle it is the greatest of theirs.
func (m *mergeState) watermark() int64 {
	lo, hi, busy := int64(0), int64(minInt64), false
	for p := int32(0); p < m.sources; p++ {
		wm, ok := m.wm[p]
		if !ok {
			return minInt64
		}
		if m.idle[p] {
			hi = max(hi, wm)
			continue
		}
		if !busy || wm < lo {
			lo, busy = wm, true
		}
	}
	if !busy {
		return hi
	}
	return lo
}

// finishedWindow is one window's output and what went wrong merging it.
type finishedWindow struct {
	key  winKey
	out  Output
	errs []error // partials that did not decode or merge, skipped
}

// advance finishes every pending window the watermark has passed.
func (m *mergeState) advance() []finishedWindow {
	wm := m.watermark()
	if wm == minInt64 || wm <= m.finished {
		return nil
	}
	var due []winKey
	for k := range m.pending {
		if k.end <= wm {
			due = append(due, k)
		}
	}
	slices.SortFunc(due, func(a, b winKey) int {
		return cmp.Or(cmp.Compare(a.end, b.end), cmp.Compare(a.stage, b.stage), cmp.Compare(a.start, b.start))
	})
	out := make([]finishedWindow, 0, len(due))
	for _, k := range due {
		parts := m.pending[k]
		delete(m.pending, k)
		delete(m.first, k)
		st := m.stages[k.stage]
		f := finishedWindow{key: k}
		merged := st.NewPartial()
		for _, src := range slices.Sorted(maps.Keys(parts)) {
			p, err := st.DecodePartial(parts[src])
			if err == nil {
				err = merged.Merge(p)
			}
			if err != nil {
				f.errs = append(f.errs, fmt.Errorf("stage %s window %s partition %d: %w", st.Name(), time.UnixMilli(k.start).UTC().Format(time.RFC3339), src, err))
			}
		}
		f.out = st.Finish(Window{Start: time.UnixMilli(k.start), End: time.UnixMilli(k.end)}, merged)
		out = append(out, f)
	}
	m.finished = wm
	return out
}

// commitOffset is the partials-topic offset to resume from once every record
// before next has been taken: the first partial of the oldest pending
// window, so that a merge tier starting there collects it whole, or next.
func (m *mergeState) commitOffset(next int64) int64 {
	for _, off := range m.first {
		next = min(next, off)
	}
	return next
}

// checkpoint returns the state a replay of the partials topic cannot
// rebuild.
func (m *mergeState) checkpoint() (*mergeCheckpoint, error) {
	c := &mergeCheckpoint{finished: m.finished, states: map[string][]byte{}}
	for _, p := range slices.Sorted(maps.Keys(m.wm)) {
		c.sources = append(c.sources, sourceWM{partition: p, wm: m.wm[p], idle: m.idle[p]})
	}
	for _, st := range m.stages {
		if cp, ok := st.(Checkpointer); ok {
			b, err := cp.MarshalState()
			if err != nil {
				return nil, fmt.Errorf("pipeline: stage %s: saving its state: %w", st.Name(), err)
			}
			c.states[st.Name()] = b
		}
	}
	return c, nil
}

// restore loads a checkpoint into a fresh mergeState.
func (m *mergeState) restore(c *mergeCheckpoint) error {
	m.finished = c.finished
	for _, s := range c.sources {
		m.wm[s.partition], m.idle[s.partition] = s.wm, s.idle
	}
	for _, st := range m.stages {
		cp, ok := st.(Checkpointer)
		if !ok {
			continue
		}
		b, ok := c.states[st.Name()]
		if !ok {
			continue // a stage added since: it starts empty
		}
		if err := cp.UnmarshalState(b); err != nil {
			return fmt.Errorf("pipeline: stage %s: restoring its state: %w", st.Name(), err)
		}
	}
	return nil
}
