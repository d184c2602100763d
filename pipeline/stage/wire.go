package stage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/sluice-rl/sluice/decision"
)

// ErrBadPartial is wrapped by every error decoding a record of the partials
// topic or a checkpoint.
var ErrBadPartial = errors.New("bad partial record")

var StageName = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`)

// A record of the partials topic is either a partition's partial state of
// one stage's window, or a watermark marker. All integers are big-endian:
//
//	[0:4]   magic "SKPT"
//	[4]     version 1
//	[5]     kind: 1 partial, 2 marker
//	[6]     flags: bit 0 idle (markers)
//	[7]     reserved, 0
//	[8:12]  source partition, int32
//	[12:20] the source partition's watermark, ms
//	partial only:
//	[20:28] window start, ms
//	[28:36] window end, ms
//	[36]    stage name length n
//	[37:37+n] stage name
//	[37+n:] the stage's encoded Partial
const (
	partialMagic   = "SKPT"
	partialVersion = 1
	KindPartial    = 1
	KindMarker     = 2
	flagIdle       = 1
	markerSize     = 20
)

// PartialRecord is a decoded record of the partials topic.
type PartialRecord struct {
	Kind       byte
	Idle       bool
	Source     int32
	WM         int64
	Stage      string
	Start, End int64
	Body       []byte
}

func (r *PartialRecord) AppendTo(b []byte) []byte {
	b = append(b, partialMagic...)
	flags := byte(0)
	if r.Idle {
		flags |= flagIdle
	}
	b = append(b, partialVersion, r.Kind, flags, 0)
	b = binary.BigEndian.AppendUint32(b, uint32(r.Source))
	b = binary.BigEndian.AppendUint64(b, uint64(r.WM))
	if r.Kind != KindPartial {
		return b
	}
	b = binary.BigEndian.AppendUint64(b, uint64(r.Start))
	b = binary.BigEndian.AppendUint64(b, uint64(r.End))
	b = append(b, byte(len(r.Stage)))
	b = append(b, r.Stage...)
	return append(b, r.Body...)
}

// DecodePartialRecord parses a record of the partials topic; body aliases b.
func DecodePartialRecord(b []byte) (PartialRecord, error) {
	var r PartialRecord
	if len(b) < markerSize {
		return r, fmt.Errorf("%w: %d bytes, a record needs at least %d", ErrBadPartial, len(b), markerSize)
	}
	if string(b[:4]) != partialMagic {
		return r, fmt.Errorf("%w: magic %q, want %q: not written by a sluice consumer", ErrBadPartial, b[:4], partialMagic)
	}
	if b[4] != partialVersion {
		return r, fmt.Errorf("%w: version %d, this build reads %d", ErrBadPartial, b[4], partialVersion)
	}
	r.Kind, r.Idle = b[5], b[6]&flagIdle != 0
	if b[6]&^flagIdle != 0 || b[7] != 0 {
		return r, fmt.Errorf("%w: unknown flags", ErrBadPartial)
	}
	r.Source = int32(binary.BigEndian.Uint32(b[8:]))
	r.WM = int64(binary.BigEndian.Uint64(b[12:]))
	if r.Source < 0 {
		return r, fmt.Errorf("%w: source partition %d", ErrBadPartial, r.Source)
	}
	switch r.Kind {
	case KindMarker:
		if len(b) != markerSize {
			return r, fmt.Errorf("%w: marker of %d bytes, want %d", ErrBadPartial, len(b), markerSize)
		}
		return r, nil
	case KindPartial:
	default:
		return r, fmt.Errorf("%w: kind %d", ErrBadPartial, r.Kind)
	}
	if len(b) < markerSize+17 {
		return r, fmt.Errorf("%w: partial header truncated", ErrBadPartial)
	}
	r.Start = int64(binary.BigEndian.Uint64(b[20:]))
	r.End = int64(binary.BigEndian.Uint64(b[28:]))
	n := int(b[36])
	if len(b) < 37+n {
		return r, fmt.Errorf("%w: stage name truncated", ErrBadPartial)
	}
	r.Stage = string(b[37 : 37+n])
	if !StageName.MatchString(r.Stage) {
		return r, fmt.Errorf("%w: stage name %q", ErrBadPartial, r.Stage)
	}
	if r.End <= r.Start {
		return r, fmt.Errorf("%w: window [%d, %d) is empty", ErrBadPartial, r.Start, r.End)
	}
	r.Body = b[37+n:]
	return r, nil
}

// PartitionCheckpoint is what a partition's committed offset carries in its
// commit metadata, so that whoever consumes the partition next resumes with
// the same watermark, and so emits the same partials, as if nothing had
// moved: the newest on-time event time and the punctuation floor as they
// were just before the committed offset, and the watermark up to which
// windows were already sent.
type PartitionCheckpoint struct {
	maxT, floor, sent int64
}

const partMetaPrefix = "sluice/p1 "

func (c PartitionCheckpoint) String() string {
	return partMetaPrefix + strconv.FormatInt(c.maxT, 10) + " " + strconv.FormatInt(c.floor, 10) + " " + strconv.FormatInt(c.sent, 10)
}

// ParsePartitionCheckpoint reads commit metadata; ok is false for metadata some
// other consumer wrote, or none.
func ParsePartitionCheckpoint(s string) (c PartitionCheckpoint, ok bool) {
	rest, found := strings.CutPrefix(s, partMetaPrefix)
	if !found {
		return c, false
	}
	f := strings.Fields(rest)
	if len(f) != 3 {
		return c, false
	}
	var v [3]int64
	for i, x := range f {
		n, err := strconv.ParseInt(x, 10, 64)
		if err != nil {
			return c, false
		}
		v[i] = n
	}
	return PartitionCheckpoint{maxT: v[0], floor: v[1], sent: v[2]}, true
}

// A merge checkpoint is the merge tier's state that replaying the partials
// topic cannot rebuild: the newest finished watermark, every source
// partition's watermark and each stage's cross-window state. Big-endian:
//
//	[0:4] magic "SKCK", [4] version 1, [5:8] reserved
//	[8:16] finished, ms
//	[16:20] number of sources s, then s × (partition int32, wm int64, idle byte)
//	[..4] number of stages t, then t × (name length byte, name, state length uint32, state)
const (
	ckptMagic   = "SKCK"
	ckptVersion = 1
	maxSources  = 1 << 16
)

type MergeCheckpoint struct {
	finished int64
	sources  []sourceWM
	states   map[string][]byte
}

type sourceWM struct {
	partition int32
	wm        int64
	idle      bool
}

func (c *MergeCheckpoint) Marshal() []byte {
	b := append([]byte(ckptMagic), ckptVersion, 0, 0, 0)
	b = binary.BigEndian.AppendUint64(b, uint64(c.finished))
	b = binary.BigEndian.AppendUint32(b, uint32(len(c.sources)))
	for _, s := range c.sources {
		b = binary.BigEndian.AppendUint32(b, uint32(s.partition))
		b = binary.BigEndian.AppendUint64(b, uint64(s.wm))
		idle := byte(0)
		if s.idle {
			idle = 1
		}
		b = append(b, idle)
	}
	names := slices.Sorted(maps.Keys(c.states))
	b = binary.BigEndian.AppendUint32(b, uint32(len(names)))
	for _, n := range names {
		b = append(b, byte(len(n)))
		b = append(b, n...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(c.states[n])))
		b = append(b, c.states[n]...)
	}
	return b
}

func UnmarshalMergeCheckpoint(b []byte) (*MergeCheckpoint, error) {
	bad := func(what string) (*MergeCheckpoint, error) {
		return nil, fmt.Errorf("%w: merge checkpoint: %s", ErrBadPartial, what)
	}
	if len(b) < 20 || string(b[:4]) != ckptMagic {
		return bad("not a checkpoint")
	}
	if b[4] != ckptVersion {
		return bad(fmt.Sprintf("version %d, this build reads %d", b[4], ckptVersion))
	}
	c := &MergeCheckpoint{finished: int64(binary.BigEndian.Uint64(b[8:])), states: map[string][]byte{}}
	n := binary.BigEndian.Uint32(b[16:])
	b = b[20:]
	if n > maxSources || uint64(len(b)) < uint64(n)*13 {
		return bad("source list truncated")
	}
	for range n {
		c.sources = append(c.sources, sourceWM{partition: int32(binary.BigEndian.Uint32(b)), wm: int64(binary.BigEndian.Uint64(b[4:])), idle: b[12] == 1})
		b = b[13:]
	}
	if len(b) < 4 {
		return bad("stage count truncated")
	}
	t := binary.BigEndian.Uint32(b)
	b = b[4:]
	for range t {
		if len(b) < 1 || len(b) < 1+int(b[0])+4 {
			return bad("stage truncated")
		}
		name := string(b[1 : 1+b[0]])
		b = b[1+int(b[0]):]
		size := binary.BigEndian.Uint32(b)
		b = b[4:]
		if uint64(len(b)) < uint64(size) {
			return bad("stage state truncated")
		}
		c.states[name] = b[:size:size]
		b = b[size:]
	}
	if len(b) != 0 {
		return bad("trailing bytes")
	}
	return c, nil
}

const mergeMetaPrefix = "sluice/m1 checkpoint@"

// MergeMeta is the merge tier's commit metadata: where its checkpoint is.
func MergeMeta(offset int64) string { return mergeMetaPrefix + strconv.FormatInt(offset, 10) }

func ParseMergeMeta(s string) (int64, bool) {
	rest, ok := strings.CutPrefix(s, mergeMetaPrefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(rest, 10, 64)
	return n, err == nil && n >= 0
}

// PunctuationHeader is the Kafka record header that makes a record of the
// decision topic a punctuation: its value is an event time in Unix
// milliseconds (decimal text), and no record of that partition at or before
// it is still to come. The record's value is ignored. A replay, or any
// producer that knows its input has ended, punctuates every partition so
// that the last windows close (see Punctuate).
const PunctuationHeader = "sluice-watermark"

func ParsePunctuation(v []byte) (int64, error) {
	t, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil || t <= 0 || t >= decision.MaxEventTimeMs {
		return 0, fmt.Errorf("%w: punctuation %q is not a Unix time in milliseconds between 1970 and the year 9000", decision.ErrBadRecord, v)
	}
	return t, nil
}

// minInt64 marks "no event time yet".
const minInt64 = math.MinInt64
