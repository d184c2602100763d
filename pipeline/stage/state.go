package stage

import (
	"encoding/binary"
	"errors"
	"math"
)

// AppendBytes appends x to b prefixed by its length as a uvarint: the
// field stages build their Partial and Checkpointer encodings from, read
// back with StateReader.
func AppendBytes(b, x []byte) []byte {
	return append(binary.AppendUvarint(b, uint64(len(x))), x...)
}

// AppendString appends s as AppendBytes does.
func AppendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// AppendFloat appends f's IEEE 754 bits, little-endian.
func AppendFloat(b []byte, f float64) []byte {
	return binary.LittleEndian.AppendUint64(b, math.Float64bits(f))
}

// ErrStateTruncated is returned by StateReader.Done for an encoding that
// ends early or has bytes left over.
var ErrStateTruncated = errors.New("pipeline: stage state is truncated or has trailing bytes")

// StateReader reads, in order, fields written with binary.AppendUvarint,
// binary.AppendVarint, AppendBytes, AppendString and AppendFloat. After the
// first short read every read returns a zero value and Done reports the
// error: decode everything, then check Done once. It never panics on bytes
// it did not write. The zero value reads nothing; use NewStateReader.
type StateReader struct {
	b   []byte
	err error
}

// NewStateReader reads b.
func NewStateReader(b []byte) *StateReader { return &StateReader{b: b} }

// Uvarint reads an unsigned varint.
func (r *StateReader) Uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 || r.err != nil {
		r.fail()
		return 0
	}
	r.b = r.b[n:]
	return v
}

// Varint reads a signed varint.
func (r *StateReader) Varint() int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 || r.err != nil {
		r.fail()
		return 0
	}
	r.b = r.b[n:]
	return v
}

// Bytes reads a length-prefixed field; the result aliases the input.
func (r *StateReader) Bytes() []byte {
	n := r.Uvarint()
	if r.err != nil || n > uint64(len(r.b)) {
		r.fail()
		return nil
	}
	x := r.b[:n:n]
	r.b = r.b[n:]
	return x
}

// String reads a length-prefixed string.
func (r *StateReader) String() string { return string(r.Bytes()) }

// Float reads 8 bytes of IEEE 754 bits.
func (r *StateReader) Float() float64 {
	if len(r.b) < 8 || r.err != nil {
		r.fail()
		return 0
	}
	v := math.Float64frombits(binary.LittleEndian.Uint64(r.b))
	r.b = r.b[8:]
	return v
}

// Count reads a uvarint that counts entries of at least min bytes each,
// and fails if the rest of the input cannot hold them: a corrupt count
// cannot make a decoder allocate more than its input.
func (r *StateReader) Count(min int) int {
	n := r.Uvarint()
	if r.err != nil || n > uint64(len(r.b)/max(1, min)) {
		r.fail()
		return 0
	}
	return int(n)
}

// More reports whether bytes are left to read (and no read failed): a
// decoder of a format that gained a trailing field reads it only then.
func (r *StateReader) More() bool { return r.err == nil && len(r.b) > 0 }

// Done returns ErrStateTruncated if a read ran short or bytes are left.
func (r *StateReader) Done() error {
	if r.err == nil && len(r.b) != 0 {
		r.fail()
	}
	return r.err
}

func (r *StateReader) fail() {
	r.err, r.b = ErrStateTruncated, nil
}
