package stage

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"
)

// PartialResult is what the merge tier did with one partial record.
type PartialResult uint8

const (
	PartialMerged    PartialResult = iota // kept for its window
	PartialDuplicate                      // its window already has this partition's partial
	PartialFinished                       // its window was already finished
	PartialBad                            // undecodable, or for an unknown stage
	NumPartialResults
)

var PartialResultNames = [NumPartialResults]string{"merged", "duplicate", "finished", "bad"}

// Merge is the I/O-free core of the merge tier. It collects every
// source partition's partial of each window, follows each source
// partition's watermark from the partials and markers, and finishes a
// window once every source partition that is not idle has a watermark at or
// past its end: it merges the partials in partition order and calls the
// stage's Finish. Windows finish in order of end, then of stage.
type Merge struct {
	stages   []Stage
	byName   map[string]int
	Sources  int32 // partitions of the decision topic
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

func NewMerge(stages []Stage, sources int32) *Merge {
	m := &Merge{stages: stages, byName: map[string]int{}, Sources: sources,
		wm: map[int32]int64{}, idle: map[int32]bool{}, pending: map[winKey]map[int32][]byte{}, first: map[winKey]int64{}, finished: minInt64}
	for i, s := range stages {
		m.byName[s.Name()] = i
	}
	return m
}

// Add takes one record of the partials topic, read at offset. The body of a
// kept partial is copied.
func (m *Merge) Add(r *PartialRecord, offset int64) PartialResult {
	m.idle[r.Source] = r.Idle
	if r.Kind == KindMarker {
		// Only a marker moves a source's watermark: it comes after every
		// partial its watermark closed, whereas a partial may be read
		// before the other partials of its batch.
		if r.WM > m.wm[r.Source] || !m.Known(r.Source) {
			m.wm[r.Source] = r.WM
		}
		return PartialMerged
	}
	i, ok := m.byName[r.Stage]
	if !ok {
		return PartialBad
	}
	if r.End <= m.finished {
		return PartialFinished
	}
	k := winKey{stage: i, start: r.Start, end: r.End}
	parts := m.pending[k]
	if parts == nil {
		parts = map[int32][]byte{}
		m.pending[k] = parts
		m.first[k] = offset
	}
	if _, dup := parts[r.Source]; dup {
		return PartialDuplicate
	}
	parts[r.Source] = slices.Clone(r.Body)
	return PartialMerged
}

func (m *Merge) Known(p int32) bool {
	_, ok := m.wm[p]
	return ok
}

// Watermark is the least Watermark over source partitions that are not
// idle; a partition not heard from holds it back. With every partition
// idle it is the greatest of theirs.
func (m *Merge) Watermark() int64 {
	lo, hi, busy := int64(0), int64(minInt64), false
	for p := int32(0); p < m.Sources; p++ {
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

// FinishedWindow is one window's output and what went wrong merging it.
type FinishedWindow struct {
	key  winKey
	Out  Output
	Errs []error // partials that did not decode or merge, skipped

	Stage    string    // the stage's name
	Window   Window    // the window, in event time
	Partials int       // source partitions whose partials were merged
	Began    time.Time // wall time the merge of its partials began
	Took     time.Duration
}

// Advance finishes every pending window the watermark has passed.
func (m *Merge) Advance() []FinishedWindow {
	wm := m.Watermark()
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
	out := make([]FinishedWindow, 0, len(due))
	for _, k := range due {
		parts := m.pending[k]
		delete(m.pending, k)
		delete(m.first, k)
		st := m.stages[k.stage]
		w := Window{Start: time.UnixMilli(k.start), End: time.UnixMilli(k.end)}
		f := FinishedWindow{key: k, Stage: st.Name(), Window: w, Partials: len(parts), Began: time.Now()}
		merged := st.NewPartial()
		for _, src := range slices.Sorted(maps.Keys(parts)) {
			p, err := st.DecodePartial(parts[src])
			if err == nil {
				err = merged.Merge(p)
			}
			if err != nil {
				f.Errs = append(f.Errs, fmt.Errorf("stage %s window %s partition %d: %w", st.Name(), time.UnixMilli(k.start).UTC().Format(time.RFC3339), src, err))
			}
		}
		f.Out = st.Finish(w, merged)
		f.Took = time.Since(f.Began)
		out = append(out, f)
	}
	m.finished = wm
	return out
}

// CommitOffset is the partials-topic offset to resume from once every record
// before next has been taken: the first partial of the oldest pending
// window, so that a merge tier starting there collects it whole, or next.
func (m *Merge) CommitOffset(next int64) int64 {
	for _, off := range m.first {
		next = min(next, off)
	}
	return next
}

// Checkpoint returns the state a replay of the partials topic cannot
// rebuild.
func (m *Merge) Checkpoint() (*MergeCheckpoint, error) {
	c := &MergeCheckpoint{finished: m.finished, states: map[string][]byte{}}
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

// Restore loads a checkpoint into a fresh mergeState.
func (m *Merge) Restore(c *MergeCheckpoint) error {
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
