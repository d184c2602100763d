package pipeline

import (
	"slices"
	"time"
)

// Windows keeps the per-window state S of tumbling event-time windows of one
// size, and closes them as the watermark passes their end. Windows are
// aligned to the Unix epoch, so every consumer cuts the same windows.
//
// The zero value is not usable: build one with NewWindows. Not safe for
// concurrent use: a stage owns its Windows.
type Windows[S any] struct {
	size   int64 // ms
	fresh  func() S
	open   map[int64]S
	closed int64 // end (ms) of the newest closed window; records before it are late
}

// NewWindows returns tumbling windows of the given size (>= 1 ms), whose
// state fresh creates.
func NewWindows[S any](size time.Duration, fresh func() S) *Windows[S] {
	return &Windows[S]{size: max(1, size.Milliseconds()), fresh: fresh, open: map[int64]S{}}
}

// Size is the window length.
func (w *Windows[S]) Size() time.Duration { return time.Duration(w.size) * time.Millisecond }

// For returns the state of the window holding event time t (ms), creating it.
// ok is false when that window has already closed: the record is late.
func (w *Windows[S]) For(t int64) (s S, ok bool) {
	start := w.floor(t)
	if start+w.size <= w.closed {
		return s, false
	}
	s, ok = w.open[start]
	if !ok {
		s = w.fresh()
		w.open[start] = s
	}
	return s, true
}

// Close closes, oldest first, every open window that ends at or before the
// watermark wm (ms), calling fn for each.
func (w *Windows[S]) Close(wm int64, fn func(start, end time.Time, s S)) {
	var due []int64
	for start := range w.open {
		if start+w.size <= wm {
			due = append(due, start)
		}
	}
	slices.Sort(due)
	for _, start := range due {
		s := w.open[start]
		delete(w.open, start)
		fn(time.UnixMilli(start), time.UnixMilli(start+w.size), s)
	}
	if end := w.floor(wm); end > w.closed {
		w.closed = end
	}
}

// floor returns the start of the window holding t (ms), for negative t too.
func (w *Windows[S]) floor(t int64) int64 {
	return t - ((t%w.size)+w.size)%w.size
}
