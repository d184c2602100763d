package sidecar

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluice-rl/sluice/decision"
)

// StatusJoin adds the response status to the decision records of Envoy's
// checks. A rate-limit check happens before the upstream answers, so its
// record cannot know the status, which the detector's scan (404 share) and
// new-identity (failed-login share) signals read. Envoy's access log knows
// it: with an HTTP gRPC access logger pointing at the sidecar
// (envoy.service.accesslog.v3.AccessLogService, which StatusJoin serves)
// and the request id sent in the check as a descriptor entry (request_id or
// x-request-id, a request_headers action on x-request-id), the join holds
// each record that has a request id until the access log reports that
// request's status, then logs it with the status.
//
// A record whose status does not come within Wait is logged without one
// (counted as expired), as is the oldest record when MaxPending are held
// (counted as evicted); records without a request id pass at once. Access
// log entries for requests with no record held are counted as unmatched.
// Every outcome is in sluice_sidecar_status_join_total{outcome}. Close logs
// what is still held.
//
// A held record's time becomes the time it is logged at, up to Wait after
// the decision (about a second with Envoy's default flush interval): the
// pipeline judges lateness by each partition's newest record, so a record
// logged seconds after records decided after it would be dropped as late by
// a watermark that trails by less (sluice pipeline's is 1 s). Logged in the
// order they are released and stamped so, records stay in time order; the
// detector's and aggregator's windows see them up to Wait later.
//
// StatusJoin is an decision.Sink, safe for concurrent use. Build it with
// NewStatusJoin.
type StatusJoin struct {
	next    decision.Sink
	observe func(now time.Time, status int, latency time.Duration)
	wait    time.Duration
	max     int
	now     func() time.Time

	stopped chan struct{} // closed by Close: access-log streams end
	mu      sync.Mutex
	pending map[string]*held
	order   []queued // by deadline, oldest first, from head
	head    int
	closed  bool

	passed, joined, expired, evicted, unmatched, overflow prometheus.Counter
}

// held is the records of one request id (usually one; Envoy checks once
// per rate-limit filter).
type held struct {
	first    decision.Record
	more     []decision.Record
	deadline time.Time // of its queue entry: an older entry of a reused id is not its
}

type queued struct {
	id       string
	deadline time.Time
}

// StatusJoinOptions configure NewStatusJoin.
type StatusJoinOptions struct {
	// Wait is how long a record waits for its status. Default 5 s: Envoy's
	// gRPC access logger flushes its buffer every second by default.
	Wait time.Duration
	// MaxPending is the most request ids held at once. Default 100 000.
	MaxPending int
	// Registerer takes the join's counters; nil registers nothing.
	Registerer prometheus.Registerer
	// Observe, when set, is given every access-log entry's response status
	// and duration (time to the last byte sent downstream; 0 if absent),
	// matched or not, at the time it is read: enforcer.Limiter's
	// ObserveResponse, for adaptive rules.
	Observe func(now time.Time, status int, latency time.Duration)
}

// NewStatusJoin returns a join that logs to next. It errors on a negative
// Wait or MaxPending, or counters already registered.
func NewStatusJoin(next decision.Sink, o StatusJoinOptions) (*StatusJoin, error) {
	if o.Wait < 0 || o.MaxPending < 0 {
		return nil, errors.New("sidecar: status join: wait and max pending must not be negative")
	}
	if o.Wait == 0 {
		o.Wait = 5 * time.Second
	}
	if o.MaxPending == 0 {
		o.MaxPending = 100_000
	}
	outcomes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_sidecar_status_join_total",
		Help: "Decision records and access-log entries by what the status join did with them: passed (no request id), joined (logged with the access log's status), expired (logged without a status after the wait), evicted (logged without a status because too many were held), unmatched (an access-log entry with no record held), overflow (a request's records past the first 8, logged at once).",
	}, []string{"outcome"})
	if o.Registerer != nil {
		if err := o.Registerer.Register(outcomes); err != nil {
			return nil, err
		}
	}
	return &StatusJoin{
		next: next, observe: o.Observe, wait: o.Wait, max: o.MaxPending, now: time.Now,
		pending: map[string]*held{}, stopped: make(chan struct{}),
		passed: outcomes.WithLabelValues("passed"), joined: outcomes.WithLabelValues("joined"),
		expired: outcomes.WithLabelValues("expired"), evicted: outcomes.WithLabelValues("evicted"),
		unmatched: outcomes.WithLabelValues("unmatched"), overflow: outcomes.WithLabelValues("overflow"),
	}, nil
}

// maxPerRequest bounds the records held for one request id.
const maxPerRequest = 8

// Log holds rec until its status arrives, or passes it on at once when it
// has no request id or the join is closed.
func (j *StatusJoin) Log(rec decision.Record) {
	if rec.RequestID == "" {
		j.passed.Inc()
		j.next.Log(rec)
		return
	}
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		j.passed.Inc()
		j.next.Log(rec)
		return
	}
	if h, ok := j.pending[rec.RequestID]; ok {
		if len(h.more)+1 >= maxPerRequest {
			j.mu.Unlock()
			j.overflow.Inc()
			j.next.Log(rec)
			return
		}
		h.more = append(h.more, rec)
		j.mu.Unlock()
		return
	}
	var out []*held
	for len(j.pending) >= j.max {
		if h := j.popOldest(); h != nil {
			out = append(out, h)
		}
	}
	deadline := j.now().Add(j.wait)
	j.pending[rec.RequestID] = &held{first: rec, deadline: deadline}
	j.order = append(j.order, queued{id: rec.RequestID, deadline: deadline})
	j.mu.Unlock()
	for _, h := range out {
		j.evicted.Add(float64(1 + len(h.more)))
		j.emit(h, 0, j.now())
	}
}

// popOldest removes the oldest held request, if still held; j.mu is held.
func (j *StatusJoin) popOldest() *held {
	q := j.order[j.head]
	j.order[j.head] = queued{}
	j.head++
	if j.head > len(j.order)/2 && j.head > 1024 {
		j.order = append(j.order[:0], j.order[j.head:]...)
		j.head = 0
	}
	if j.head == len(j.order) {
		j.order, j.head = j.order[:0], 0
	}
	h, ok := j.pending[q.id]
	if !ok || !h.deadline.Equal(q.deadline) {
		return nil // joined already, or the entry of an earlier use of the id
	}
	delete(j.pending, q.id)
	return h
}

// Status reports request id's response status: its held records are
// logged with it. An id with no record held is counted as unmatched.
func (j *StatusJoin) Status(id string, status uint32) {
	j.mu.Lock()
	h, ok := j.pending[id]
	if ok {
		delete(j.pending, id) // its queue entry is skipped when it comes up
	}
	j.mu.Unlock()
	if !ok {
		j.unmatched.Inc()
		return
	}
	j.joined.Add(float64(1 + len(h.more)))
	j.emit(h, status, j.now())
}

// emit logs h's records with status, stamped with the time they are
// logged at (see StatusJoin).
func (j *StatusJoin) emit(h *held, status uint32, now time.Time) {
	stamp := func(r *decision.Record) {
		r.Status = status
		if r.Time.Before(now) {
			r.Time = now
		}
	}
	stamp(&h.first)
	j.next.Log(h.first)
	for _, r := range h.more {
		stamp(&r)
		j.next.Log(r)
	}
}

// expire logs without a status the records whose wait ended by now.
func (j *StatusJoin) expire(now time.Time) { j.flush(now, false) }

// flush logs without a status the records whose wait ended by now, or all
// of them and closes the join.
func (j *StatusJoin) flush(now time.Time, closing bool) {
	var out []*held
	j.mu.Lock()
	if closing && !j.closed {
		close(j.stopped)
	}
	j.closed = j.closed || closing
	for j.head < len(j.order) && (closing || !j.order[j.head].deadline.After(now)) {
		if h := j.popOldest(); h != nil {
			out = append(out, h)
		}
	}
	j.mu.Unlock()
	for _, h := range out {
		j.expired.Add(float64(1 + len(h.more)))
		j.emit(h, 0, now)
	}
}

// Run expires held records until ctx ends; it then keeps taking statuses
// for a grace of min(Wait, 2 s), for the checks that were answered just
// before the shutdown, and closes the join.
func (j *StatusJoin) Run(ctx context.Context) {
	t := time.NewTicker(max(j.wait/10, 10*time.Millisecond))
	defer t.Stop()
	var grace <-chan time.Time
	done := ctx.Done()
	for {
		select {
		case <-done:
			done, grace = nil, time.After(min(j.wait, 2*time.Second))
		case <-grace:
			j.Close()
			return
		case <-t.C:
			j.expire(j.now())
		}
	}
}

// Close logs every held record without a status and ends the access-log
// streams; records logged after it pass at once.
func (j *StatusJoin) Close() { j.flush(j.now(), true) }

// StreamAccessLogs serves Envoy's gRPC access log service
// (envoy.service.accesslog.v3): each HTTP entry's request id and response
// code go to Status. TCP entries are ignored. The stream ends when Envoy
// closes it or the join closes (the sidecar is stopping: Envoy reconnects).
func (j *StatusJoin) StreamAccessLogs(stream alsv3.AccessLogService_StreamAccessLogsServer) error {
	errc := make(chan error, 1)
	go func() { errc <- j.readAccessLogs(stream) }()
	select {
	case err := <-errc:
		return err
	case <-j.stopped:
		return nil
	}
}

func (j *StatusJoin) readAccessLogs(stream alsv3.AccessLogService_StreamAccessLogsServer) error {
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return stream.SendAndClose(&alsv3.StreamAccessLogsResponse{})
		}
		if err != nil {
			return err
		}
		for _, e := range m.GetHttpLogs().GetLogEntry() {
			if j.observe != nil {
				j.observe(j.now(), int(e.GetResponse().GetResponseCode().GetValue()), e.GetCommonProperties().GetTimeToLastDownstreamTxByte().AsDuration())
			}
			id := e.GetRequest().GetRequestId()
			if id == "" {
				j.unmatched.Inc()
				continue
			}
			j.Status(id, e.GetResponse().GetResponseCode().GetValue())
		}
	}
}
