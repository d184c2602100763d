package sketch

import "errors"

// ErrIncompatible is returned, wrapped, when two sketches cannot be combined
// or an encoding cannot be loaded into this build: the dimensions or precision
// differ, or the encoding has a format version this build does not know
// (usually a sketch written by a newer sluice during a rolling upgrade).
// Match it with errors.Is.
var ErrIncompatible = errors.New("sketch: incompatible sketches")

// ErrCorrupt is returned, wrapped, by UnmarshalBinary when the input is
// truncated, has trailing bytes, or describes a state no sketch can be in.
// The likely cause is a truncated or mis-framed record on the wire or in
// storage. Match it with errors.Is.
var ErrCorrupt = errors.New("sketch: corrupt encoding")
