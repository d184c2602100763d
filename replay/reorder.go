package replay

import (
	"container/heap"
	"errors"
	"io"
	"time"

	"github.com/sluice-rl/sluice/replay/accesslog"
)

// Reorder returns a Source that yields src's requests sorted by event time
// (ties by line), as far as a horizon allows: it holds requests in a heap
// until one newer by at least horizon has been read. Access logs are written
// when responses finish, not when requests start, and some are merged from
// several servers, so their lines run out of order (the Elastic sample by up
// to 59 s). A request later than the horizon passes through late. Memory is
// bounded by the requests within one horizon. Malformed lines are returned
// as soon as they are read.
func Reorder(src Source, horizon time.Duration) Source {
	return &reorder{src: src, horizon: horizon}
}

type reorder struct {
	src     Source
	horizon time.Duration
	h       reqHeap
	newest  time.Time
	eof     bool
}

func (r *reorder) Name() string           { return r.src.Name() }
func (r *reorder) Stats() accesslog.Stats { return r.src.Stats() }

func (r *reorder) Next() (Request, error) {
	for !r.eof && (len(r.h) == 0 || r.newest.Sub(r.h[0].Time) < r.horizon) {
		q, err := r.src.Next()
		if errors.Is(err, io.EOF) {
			r.eof = true
			break
		}
		if err != nil {
			return Request{}, err
		}
		if q.Time.After(r.newest) {
			r.newest = q.Time
		}
		heap.Push(&r.h, q)
	}
	if len(r.h) == 0 {
		return Request{}, io.EOF
	}
	return heap.Pop(&r.h).(Request), nil
}

type reqHeap []Request

func (h reqHeap) Len() int { return len(h) }
func (h reqHeap) Less(i, j int) bool {
	if c := h[i].Time.Compare(h[j].Time); c != 0 {
		return c < 0
	}
	return h[i].Line < h[j].Line
}
func (h reqHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *reqHeap) Push(x any)   { *h = append(*h, x.(Request)) }
func (h *reqHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
