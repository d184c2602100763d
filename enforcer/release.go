package enforcer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// Concurrency slots are leases in a sorted set (decide.lua), each freed by
// a ZREM when its request ends (Release) or by its own expiry, the rule's
// lease (30 s by default), when it is never released. A release that fails
// (Redis stalled, refused, timed out) would hold the slot for the rest of
// its lease: with a limit of 3, three failed releases deny the key until
// the leases run out. So a failed release is handed to releaseRetry, which
// retries it in the background until it succeeds or the lease has run out
// anyway: the slot is then held for the stall plus at most one backoff
// interval (maxReleaseInterval), not for the rest of its lease.

const (
	// maxPendingReleases bounds the leases waiting for a retry; past it a
	// failed release is dropped (counted) and its lease runs out by itself.
	maxPendingReleases = 16384
	// firstReleaseInterval and maxReleaseInterval bound the backoff
	// (exponential, ×1.5, ±50% jitter) between retries.
	firstReleaseInterval = 50 * time.Millisecond
	maxReleaseInterval   = time.Second
	// minReleaseTimeout is the least a release attempt waits for Redis
	// (otherwise Options.Budget).
	minReleaseTimeout = 50 * time.Millisecond
)

// pendingLease is a lease whose release failed.
type pendingLease struct {
	Lease
	until time.Time // past it the lease has expired in Redis: nothing to release
}

// releaseRetry retries failed releases of concurrency slots in one
// background goroutine, started at the first failure and ended when none is
// pending, so a Limiter owns no goroutine while Redis answers. Its zero
// value is ready; it is safe for concurrent use.
type releaseRetry struct {
	mu      sync.Mutex
	pending []pendingLease
	running bool
	closed  bool          // by close: no retry starts, the running one ends
	quit    chan struct{} // closed by close while running
	done    chan struct{} // closed when the running goroutine ends

	// Counts of sluice_enforcer_slot_releases_total by result.
	ok, failed, retried, expired, dropped atomic.Uint64
}

// add queues leases whose release failed at now; the retry goroutine starts
// if it is not running.
func (r *releaseRetry) add(l *Limiter, leases []Lease, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ls := range leases {
		if r.closed || len(r.pending) >= maxPendingReleases {
			r.dropped.Add(1)
			continue
		}
		ttl := ls.TTL
		if ttl <= 0 {
			ttl = maxReleaseRetry
		}
		// The lease was taken before now: it has expired by now + TTL.
		r.pending = append(r.pending, pendingLease{Lease: ls, until: now.Add(ttl)})
	}
	if !r.running && len(r.pending) > 0 {
		r.running = true
		r.quit, r.done = make(chan struct{}), make(chan struct{})
		go r.run(l, r.quit, r.done)
	}
}

// close ends the retries: the running goroutine stops at once (after the
// attempt under way, if any), its pending leases counted as dropped (they
// run out by themselves), and a release that fails later is dropped too.
// It waits for the goroutine; calling it again does nothing.
func (r *releaseRetry) close() {
	r.mu.Lock()
	var done chan struct{}
	if !r.closed && r.running {
		close(r.quit)
		done = r.done
	}
	r.closed = true
	r.mu.Unlock()
	if done != nil {
		<-done
	}
}

// maxReleaseRetry bounds the retries of a lease whose expiry is not known.
const maxReleaseRetry = time.Minute

// run retries the pending releases, all of them in one pipeline per
// attempt, with exponential backoff between attempts, until none is left.
func (r *releaseRetry) run(l *Limiter, quit, done chan struct{}) {
	defer close(done)
	b := &backoff.ExponentialBackOff{InitialInterval: firstReleaseInterval, RandomizationFactor: 0.5,
		Multiplier: 1.5, MaxInterval: maxReleaseInterval}
	b.Reset()
	t := time.NewTimer(b.NextBackOff())
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-quit:
			r.mu.Lock()
			r.dropped.Add(uint64(len(r.pending)))
			r.pending, r.running = nil, false
			r.mu.Unlock()
			return
		}
		r.mu.Lock()
		batch := r.pending
		r.pending = nil
		r.mu.Unlock()
		failed := r.attempt(l, batch, time.Now())
		r.mu.Lock()
		r.pending = append(r.pending, failed...)
		if len(r.pending) == 0 {
			r.running = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		if len(failed) < len(batch) {
			b.Reset() // Redis answers again: retry the rest soon
		}
		t.Reset(b.NextBackOff())
	}
}

// attempt releases batch in one pipeline and returns the leases that are
// still held and could not be released.
func (r *releaseRetry) attempt(l *Limiter, batch []pendingLease, now time.Time) (failed []pendingLease) {
	live := batch[:0]
	for _, p := range batch {
		if now.After(p.until) {
			r.expired.Add(1)
			continue
		}
		live = append(live, p)
	}
	if len(live) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.releaseTimeout())
	defer cancel()
	pipe := l.rdb.Pipeline()
	cmds := make([]*redis.IntCmd, len(live))
	for i, p := range live {
		cmds[i] = pipe.ZRem(ctx, p.Key, p.ID)
	}
	_, _ = pipe.Exec(ctx) // each command's error is looked at below
	l.roundTrips.Add(1)
	for i, c := range cmds {
		if c.Err() != nil {
			failed = append(failed, live[i])
			continue
		}
		r.retried.Add(1)
	}
	return failed
}

// releaseTimeout is how long one release attempt waits for Redis.
func (l *Limiter) releaseTimeout() time.Duration {
	return max(l.opts.Budget, minReleaseTimeout)
}

// collector is sluice_enforcer_slot_releases_total.
func (r *releaseRetry) collector() prometheus.Collector {
	return releaseCollector{r: r, desc: prometheus.NewDesc("sluice_enforcer_slot_releases_total",
		"Releases of concurrency slots by result: ok (at once), failed (retried in the background), retried (released by a retry), expired (the lease ran out before a retry got through), dropped (too many pending retries; the lease runs out by itself).",
		[]string{"result"}, nil)}
}

type releaseCollector struct {
	r    *releaseRetry
	desc *prometheus.Desc
}

func (c releaseCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c releaseCollector) Collect(ch chan<- prometheus.Metric) {
	for _, v := range []struct {
		name string
		n    *atomic.Uint64
	}{{"ok", &c.r.ok}, {"failed", &c.r.failed}, {"retried", &c.r.retried}, {"expired", &c.r.expired}, {"dropped", &c.r.dropped}} {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(v.n.Load()), v.name)
	}
}

// ErrReleaseRetried is the error of a Release that did not get through
// within its wait: the slots are released by retries in the background
// (or free themselves when their lease runs out), so a caller need do
// nothing but log it.
var ErrReleaseRetried = errors.New("enforcer: releasing concurrency slots failed (retried in the background)")

// Release gives back the concurrency slots d holds. Call it when the
// request ends; a slot not released frees itself when its lease runs out.
// The release waits for Redis at most ctx's deadline or
// max(Options.Budget, 50 ms); one that fails is retried in the background
// (exponential backoff from 50 ms up to 1 s between attempts) until it gets
// through or the lease has run out, and the error says so: it wraps
// ErrReleaseRetried and Redis's error. Release is safe for concurrent use,
// not on the same d.
func (l *Limiter) Release(ctx context.Context, d *Decision) error {
	if d == nil || len(d.Leases) == 0 {
		return nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.releaseTimeout())
		defer cancel()
	}
	var err error
	var failed []Lease
	if len(d.Leases) == 1 {
		if err = l.rdb.ZRem(ctx, d.Leases[0].Key, d.Leases[0].ID).Err(); err != nil {
			failed = d.Leases
		}
	} else {
		pipe := l.rdb.Pipeline()
		cmds := make([]*redis.IntCmd, len(d.Leases))
		for i, ls := range d.Leases {
			cmds[i] = pipe.ZRem(ctx, ls.Key, ls.ID)
		}
		_, err = pipe.Exec(ctx)
		for i, c := range cmds {
			if c.Err() != nil {
				failed = append(failed, d.Leases[i])
			}
		}
	}
	l.roundTrips.Add(1)
	l.slotRetry.ok.Add(uint64(len(d.Leases) - len(failed)))
	if len(failed) > 0 {
		l.slotRetry.failed.Add(uint64(len(failed)))
		l.slotRetry.add(l, failed, time.Now())
		err = fmt.Errorf("%w: %d slots: %w", ErrReleaseRetried, len(failed), err)
	}
	d.Leases = d.Leases[:0]
	return err
}
