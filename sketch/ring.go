package sketch

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"
)

// maxRingSlots caps the number of intervals of a windowed sketch.
const maxRingSlots = 1 << 16

// epochRing is the epoch rotation shared by the windowed sketches: slots[i]
// holds the events of the epochs e with e mod len(slots) == i, where epoch
// e covers event times [e*interval, (e+1)*interval). Only the newest
// len(slots) epochs, head-len(slots)+1 .. head, are live; a slot is Reset
// when its epoch leaves the window, so every slot is always either live or
// empty and a read sums all of them.
type epochRing[S interface{ Reset() }] struct {
	interval int64 // nanoseconds, > 0
	slots    []S
	head     int64 // newest epoch; meaningful once started
	started  bool
	// headStart is head*interval, the first nanosecond of the newest epoch,
	// so that an event in it is placed without a division.
	headStart int64
	headIdx   int // index(head)
}

// reset clears every slot and forgets the window's position.
func (r *epochRing[S]) reset() {
	for _, s := range r.slots {
		s.Reset()
	}
	r.started, r.head, r.headStart, r.headIdx = false, 0, 0, 0
}

func checkRing(slots int, interval time.Duration) error {
	if slots < 1 || slots > maxRingSlots {
		return fmt.Errorf("sketch: ring of %d intervals out of [1, %d]", slots, maxRingSlots)
	}
	if interval <= 0 {
		return fmt.Errorf("sketch: ring interval %v is not positive", interval)
	}
	return nil
}

// epoch returns the epoch of event time t, rounding towards minus infinity.
func (r *epochRing[S]) epoch(t time.Time) int64 {
	ns := t.UnixNano()
	e := ns / r.interval
	if ns%r.interval < 0 {
		e--
	}
	return e
}

func (r *epochRing[S]) index(e int64) int {
	n := int64(len(r.slots))
	i := e % n
	if i < 0 {
		i += n
	}
	return int(i)
}

// advanceTo makes e the newest epoch if it is newer than head, resetting the
// slots of the epochs that leave the window.
func (r *epochRing[S]) advanceTo(e int64) {
	if !r.started {
		r.started, r.head, r.headStart, r.headIdx = true, e, e*r.interval, r.index(e)
		return
	}
	if e <= r.head {
		return
	}
	d := min(e-r.head, int64(len(r.slots)))
	for j := int64(1); j <= d; j++ {
		r.slots[r.index(r.head+j)].Reset()
	}
	r.head, r.headStart, r.headIdx = e, e*r.interval, r.index(e)
}

// slot returns the slot for an event at time t, advancing the window if t is
// in a newer epoch, and false if t is older than the window.
func (r *epochRing[S]) slot(t time.Time) (S, bool) {
	if ns := t.UnixNano(); r.started && ns >= r.headStart && ns-r.headStart < r.interval {
		return r.slots[r.headIdx], true
	}
	e := r.epoch(t)
	r.advanceTo(e)
	if e <= r.head-int64(len(r.slots)) {
		var zero S
		return zero, false
	}
	return r.slots[r.index(e)], true
}

// live reports whether epoch e is in the window.
func (r *epochRing[S]) live(e int64) bool {
	return r.started && e <= r.head && e > r.head-int64(len(r.slots))
}

// mergeFrom aligns r and o on the newer head and merges each of o's live
// epochs that is still live in r with f(r's slot, o's slot).
func (r *epochRing[S]) mergeFrom(o *epochRing[S], f func(dst, src S) error) error {
	if !o.started {
		return nil
	}
	r.advanceTo(o.head)
	n := int64(len(o.slots))
	for e := o.head - n + 1; e <= o.head; e++ {
		if r.live(e) {
			if err := f(r.slots[r.index(e)], o.slots[o.index(e)]); err != nil {
				return err
			}
		}
	}
	return nil
}

// Ring header, shared by the ring encodings, after the 8-byte magic,
// version and reserved bytes:
//
//	[8:12]  number of slots, uint32
//	[12]    1 if started, else 0
//	[13:16] reserved, zero
//	[16:24] interval in nanoseconds, int64
//	[24:32] head epoch, int64 (0 unless started)
const ringHeaderSize = 32

func (r *epochRing[S]) appendHeader(b []byte) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(r.slots)))
	if r.started {
		b = append(b, 1, 0, 0, 0)
	} else {
		b = append(b, 0, 0, 0, 0)
	}
	b = binary.LittleEndian.AppendUint64(b, uint64(r.interval))
	head := r.head
	if !r.started {
		head = 0
	}
	return binary.LittleEndian.AppendUint64(b, uint64(head))
}

// readRingHeader checks the magic, version and ring fields of b, returning
// the slot count, interval, head and started flag.
func readRingHeader(b []byte, magic string, version byte, what string) (slots int, interval, head int64, started bool, err error) {
	if len(b) < ringHeaderSize {
		return 0, 0, 0, false, fmt.Errorf("%w: %s header needs %d bytes, have %d", ErrCorrupt, what, ringHeaderSize, len(b))
	}
	if string(b[:4]) != magic {
		return 0, 0, 0, false, fmt.Errorf("%w: %s magic %q, want %q; the bytes are not a %s", ErrCorrupt, what, b[:4], magic, what)
	}
	if b[4] != version {
		return 0, 0, 0, false, fmt.Errorf("%w: %s format version %d, this build reads %d", ErrIncompatible, what, b[4], version)
	}
	if b[5]|b[6]|b[7]|b[13]|b[14]|b[15] != 0 || b[12] > 1 {
		return 0, 0, 0, false, fmt.Errorf("%w: %s reserved header bytes are not zero", ErrCorrupt, what)
	}
	n := binary.LittleEndian.Uint32(b[8:])
	interval = int64(binary.LittleEndian.Uint64(b[16:]))
	head = int64(binary.LittleEndian.Uint64(b[24:]))
	started = b[12] == 1
	if n < 1 || n > maxRingSlots || interval <= 0 {
		return 0, 0, 0, false, fmt.Errorf("%w: %s of %d slots of %d ns out of range", ErrCorrupt, what, n, interval)
	}
	if head > math.MaxInt64/interval || head < math.MinInt64/interval {
		return 0, 0, 0, false, fmt.Errorf("%w: %s head epoch %d beyond the range of time.Time's UnixNano", ErrCorrupt, what, head)
	}
	if !started && head != 0 {
		return 0, 0, 0, false, fmt.Errorf("%w: %s not started but has head epoch %d", ErrCorrupt, what, head)
	}
	return int(n), interval, head, started, nil
}
