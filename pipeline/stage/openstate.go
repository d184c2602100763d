package stage

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// A partition's committed offset is the first record of its oldest open
// window (Checkpoint), so that whoever consumes the partition next rebuilds
// that window whole. With an hour's window (the content detector's, a
// heavy hitter's long scale) that is up to an hour of records to read again
// after a crash or a rebalance. An open-window state cuts that short: the
// open windows' partials, encoded, with the partition's watermark state,
// written where the next owner can read them (the pipeline's checkpoint
// topic); the offset committed is then the next record to read, and the
// next owner restores the windows and reads on from there. Each partial is
// restored with its stage's DecodePartial, so a stage's encoding must keep
// everything its Partial would go on to observe and send (the stages of
// sluice do: TestRestoreOpenSendsTheSamePartials checks it for a test
// stage, and cmd/sluice TestPipelineKilledMidStream for the real ones).

// ErrBadOpenState is returned for bytes MarshalOpen did not write, or that
// name other stages than the partition's.
var ErrBadOpenState = errors.New("pipeline: bad open-window state")

// openStateMagic starts an open-window state; the byte after it is its
// format version.
const (
	openStateMagic   = "SKOW"
	openStateVersion = 1
)

// MarshalOpen encodes the partition's open windows as they are once every
// record before offset next has been observed: next, the watermark state
// (newest on-time event time, punctuation floor, sent watermark), then per
// stage its name and its open windows (start ms, whether it was sent before
// a restart, and its partial's encoding), in start order. Varints
// throughout; fields from AppendBytes and AppendString.
func (s *Partition) MarshalOpen(next int64) ([]byte, error) {
	b := append([]byte(openStateMagic), openStateVersion)
	b = binary.AppendVarint(b, next)
	b = binary.AppendVarint(b, s.maxT)
	b = binary.AppendVarint(b, s.floor)
	b = binary.AppendVarint(b, s.sent)
	b = binary.AppendUvarint(b, uint64(len(s.stages)))
	for i, st := range s.stages {
		b = AppendString(b, st.Name())
		starts := make([]int64, 0, len(s.open[i]))
		for start := range s.open[i] {
			starts = append(starts, start)
		}
		slices.Sort(starts)
		b = binary.AppendUvarint(b, uint64(len(starts)))
		for _, start := range starts {
			w := s.open[i][start]
			body, err := w.p.MarshalBinary()
			if err != nil {
				return nil, fmt.Errorf("pipeline: encoding stage %s's open window at %d: %w", st.Name(), start, err)
			}
			resent := uint64(0)
			if w.resent {
				resent = 1
			}
			b = binary.AppendVarint(b, start)
			b = binary.AppendUvarint(b, resent)
			b = AppendBytes(b, body)
		}
	}
	return b, nil
}

// RestorePartition is the partition MarshalOpen encoded, with its open
// windows decoded by their stages, and the offset to read on from. The
// stages must be the ones that wrote it, in the same order; otherwise, or
// for bytes MarshalOpen did not write, it returns an error wrapping
// ErrBadOpenState (or the stage's decoding error), and never panics.
func RestorePartition(stages []Stage, lateness, maxFuture int64, b []byte) (*Partition, int64, error) {
	if len(b) < len(openStateMagic)+1 || string(b[:len(openStateMagic)]) != openStateMagic {
		return nil, 0, fmt.Errorf("%w: no %s magic", ErrBadOpenState, openStateMagic)
	}
	if v := b[len(openStateMagic)]; v != openStateVersion {
		return nil, 0, fmt.Errorf("%w: format version %d, this build reads %d", ErrBadOpenState, v, openStateVersion)
	}
	r := NewStateReader(b[len(openStateMagic)+1:])
	next := r.Varint()
	ck := PartitionCheckpoint{maxT: r.Varint(), floor: r.Varint(), sent: r.Varint()}
	if n := r.Count(1); r.err == nil && n != len(stages) {
		return nil, 0, fmt.Errorf("%w: %d stages, the pipeline runs %d", ErrBadOpenState, n, len(stages))
	}
	s := NewPartition(stages, lateness, maxFuture, ck)
	for i, st := range stages {
		if name := r.String(); r.err == nil && name != st.Name() {
			return nil, 0, fmt.Errorf("%w: stage %d is %q, the pipeline's is %q", ErrBadOpenState, i, name, st.Name())
		}
		for range r.Count(3) { // a start, a flag and a length at least
			start, resent, body := r.Varint(), r.Uvarint(), r.Bytes()
			if r.err != nil {
				break
			}
			p, err := st.DecodePartial(body)
			if err != nil {
				return nil, 0, fmt.Errorf("%w: stage %s's window at %d: %w", ErrBadOpenState, st.Name(), start, err)
			}
			s.open[i][start] = &openWindow{p: p, first: next, snap: ck, resent: resent == 1, restored: true}
		}
	}
	if err := r.Done(); err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrBadOpenState, err)
	}
	return s, next, nil
}

// Restored reports whether some open window was restored from a state
// (RestorePartition): reading again from Checkpoint's offset cannot rebuild
// it, so the partition's position must be kept with a state.
func (s *Partition) Restored() bool {
	for _, m := range s.open {
		for _, w := range m {
			if w.restored {
				return true
			}
		}
	}
	return false
}

// Commit metadata of a partition whose position is an open-window state:
// the state's offset in the checkpoint topic, then the rewind point (the
// offset and watermark state Checkpoint gave when the state was written) to
// fall back to if the state cannot be read.
const stateMetaPrefix = "sluice/s1 "

// StateMeta is the commit metadata for a position kept with the state at
// offset stateOff of the checkpoint topic; rewind and ck are what to read
// again from (with which watermark state) if the state cannot be read.
func StateMeta(stateOff, rewind int64, ck PartitionCheckpoint) string {
	return stateMetaPrefix + strconv.FormatInt(stateOff, 10) + " " + strconv.FormatInt(rewind, 10) + " " +
		strings.TrimPrefix(ck.String(), partMetaPrefix)
}

// ParseStateMeta reads what StateMeta wrote; ok is false for other
// metadata.
func ParseStateMeta(s string) (stateOff, rewind int64, ck PartitionCheckpoint, ok bool) {
	rest, found := strings.CutPrefix(s, stateMetaPrefix)
	if !found {
		return 0, 0, ck, false
	}
	f := strings.SplitN(rest, " ", 3)
	if len(f) != 3 {
		return 0, 0, ck, false
	}
	var err1, err2 error
	stateOff, err1 = strconv.ParseInt(f[0], 10, 64)
	rewind, err2 = strconv.ParseInt(f[1], 10, 64)
	ck, ok = ParsePartitionCheckpoint(partMetaPrefix + f[2])
	return stateOff, rewind, ck, ok && cmp.Or(err1, err2) == nil && stateOff >= 0 && rewind >= 0
}
