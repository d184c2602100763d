package stage

import (
	"cmp"
	"slices"
	"time"

	"github.com/sluice-rl/sluice/decision/decisionpb"
)

// Lateness of a record against its partition's watermark.
type Lateness uint8

const (
	OnTime     Lateness = iota
	LatePast            // behind the partition's watermark: its window has closed
	LateFuture          // event time too far past the record's Kafka timestamp
	Resent              // on time, but its window was sent before a restart
)

// Partition is the I/O-free core of one partition of the decision topic: it
// takes records in offset order and keeps each stage's open windows, with
// the partition's watermark. Everything it decides (whether a record is
// late, which window it joins, when a window closes) depends only on the
// partition's records, so whoever consumes the partition decides the same.
//
// The watermark is max(newest on-time event time - lateness, punctuation
// floor). A record is late when its event time is below the watermark, or
// when it is more than maxFuture past its Kafka timestamp (a producer with a
// wrong clock must not drag the watermark, and every window, forward). A
// window closes, and its partial is sent, once the watermark reaches its end.
type Partition struct {
	stages    []Stage
	size      []int64 // per stage, window length in ms
	lateness  int64
	maxFuture int64
	maxT      int64 // newest on-time event time, minInt64 before any
	floor     int64 // punctuation floor
	sent      int64 // windows ending at or before were sent before a restart
	open      []map[int64]*openWindow
}

type openWindow struct {
	p     Partial
	first int64               // offset of its first record
	snap  PartitionCheckpoint // the partition's state just before that record
	// resent: the window ended at or before the restored sent watermark, so
	// it was sent before the restart and is not sent again.
	resent bool
	// restored: decoded from an open-window state (RestorePartition), not
	// rebuilt from records: first and snap are the state's position.
	restored bool
}

func NewPartition(stages []Stage, lateness, maxFuture int64, ck PartitionCheckpoint) *Partition {
	s := &Partition{stages: stages, lateness: lateness, maxFuture: maxFuture, maxT: ck.maxT, floor: ck.floor, sent: ck.sent}
	for _, st := range stages {
		s.size = append(s.size, max(1, st.Window().Milliseconds()))
		s.open = append(s.open, map[int64]*openWindow{})
	}
	return s
}

// MaxFutureMs is Options.MaxFuture in ms; negative turns the check off.
func MaxFutureMs(d time.Duration) int64 {
	if d < 0 {
		return -1
	}
	return d.Milliseconds()
}

// Stages returns how many stages the partition keeps windows for: the
// length of Observe's stageIn.
func (s *Partition) Stages() int { return len(s.stages) }

// FreshCheckpoint is the state of a partition no one has consumed.
var FreshCheckpoint = PartitionCheckpoint{maxT: minInt64, floor: minInt64, sent: minInt64}

func (s *Partition) Watermark() int64 {
	if s.maxT == minInt64 {
		return s.floor
	}
	return max(s.maxT-s.lateness, s.floor)
}

func (s *Partition) Snapshot() PartitionCheckpoint {
	return PartitionCheckpoint{maxT: s.maxT, floor: s.floor, sent: s.sent}
}

// Observe feeds record d at offset, with Kafka timestamp ts (ms, 0 if
// unknown), to every stage; stageIn counts, per stage, the records
// observed.
func (s *Partition) Observe(d *decisionpb.Decision, offset, ts int64, stageIn []int64) Lateness {
	t := d.EventTimeMs
	if ts > 0 && s.maxFuture >= 0 && t > ts+s.maxFuture {
		return LateFuture
	}
	if t < s.Watermark() {
		return LatePast
	}
	snap := s.Snapshot()
	s.maxT = max(s.maxT, t)
	res := OnTime
	for i, st := range s.stages {
		start := FloorDiv(t, s.size[i])
		w := s.open[i][start]
		if w == nil {
			w = &openWindow{p: st.NewPartial(), first: offset, snap: snap, resent: start+s.size[i] <= s.sent}
			s.open[i][start] = w
		}
		if w.resent {
			res = Resent
			continue
		}
		w.p.Observe(d)
		stageIn[i]++
	}
	return res
}

// Punctuate raises the watermark floor to t: no record at or before t is
// still to come on this partition.
func (s *Partition) Punctuate(t int64) { s.floor = max(s.floor, t) }

// Seal raises the watermark to the end of every open window, so that due
// closes them all: the partition has gone idle, and a window it holds open
// would otherwise wait for its next record. A record that comes later for
// a sealed window is late.
func (s *Partition) Seal() {
	for i, m := range s.open {
		for start := range m {
			s.floor = max(s.floor, start+s.size[i])
		}
	}
}

// ClosedWindow is a window whose partial is ready to send.
type ClosedWindow struct {
	Stage      int
	Start, End int64
	Partial    Partial
}

// Due removes and returns, ordered by end then stage, the open windows the
// watermark has passed, leaving out those sent before a restart.
func (s *Partition) Due() []ClosedWindow {
	wm := s.Watermark()
	var out []ClosedWindow
	for i, m := range s.open {
		for start, w := range m {
			if end := start + s.size[i]; end <= wm {
				delete(m, start)
				if !w.resent {
					out = append(out, ClosedWindow{Stage: i, Start: start, End: end, Partial: w.p})
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b ClosedWindow) int {
		return cmp.Or(cmp.Compare(a.End, b.End), cmp.Compare(a.Stage, b.Stage))
	})
	s.sent = max(s.sent, wm)
	return out
}

// Checkpoint returns the offset to commit once everything before next has
// been processed and due's partials sent, and the state to commit with it:
// the first record of the oldest open window, with the partition's state
// just before it, so that a consumer starting there rebuilds that window
// whole; or next, with the current state, when no window is open.
func (s *Partition) Checkpoint(next int64) (int64, PartitionCheckpoint) {
	off, ck := next, s.Snapshot()
	for _, m := range s.open {
		for _, w := range m {
			if w.first < off {
				off, ck = w.first, w.snap
			}
		}
	}
	ck.sent = s.sent
	return off, ck
}

// FloorDiv returns the start of the window of size that holds t, for
// negative t too.
func FloorDiv(t, size int64) int64 {
	return t - ((t%size)+size)%size
}
