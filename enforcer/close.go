package enforcer

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Close ends what the Limiter runs in the background and lets go of what
// outlives a call: it stops the stall clock's timer (which, pending for a
// second after the last decision, kept the Limiter and all it holds
// reachable: its hot-key and remembered-answers tables, its Sink), ends the
// retries of failed slot releases (their leases run out by themselves;
// counted as dropped), and unregisters the Limiter's metrics from
// Options.Registerer, so that a new Limiter can register on it. A charge
// of the fallback's debts under way ends by itself within RefundBudget.
// An enforcer that has heartbeated leaves the region's count of enforcers
// (sluice:instances), waiting at most 200 ms for Redis.
// It closes neither the Redis client nor the Sink, which are the caller's.
//
// Call it when the Limiter is no longer used, e.g. at the end of a replay;
// a process that keeps one Limiter for its life need not. Calls after Close
// still decide, but measure no stall and retry no release. Calling it
// twice is safe.
func (l *Limiter) Close() {
	if ic := l.instances; ic.override == 0 && ic.learned.Load() != 0 {
		// Leave the region's count, so that the others stop dividing their
		// fallback by this one at once (best effort, briefly: a Redis that
		// does not answer keeps it counted until its heartbeat's TTL).
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		_ = l.store.Leave(ctx, ic.id)
		cancel()
	}
	l.clock.stop()
	l.slotRetry.close()
	l.registered.unregisterAll()
}

// newCallPool returns the pool of a Limiter's calls. It is an object of
// its own, not a field of the Limiter: a pool used since the last GC is on
// the runtime's list of pools (sync's allPools) until the next GC, then on
// its list of old ones until the one after, and a field's address would
// keep the whole Limiter, its tables and its Sink, reachable that long after
// its last decision, Close or not.
func newCallPool() *sync.Pool {
	return &sync.Pool{New: func() any {
		return &call{groups: make([]group, 0, MaxRules), args: make([]any, 0, MaxRules*(argsPerRule+7))}
	}}
}

// registrations records the collectors a Limiter registered, for Close.
// Its zero value is ready; safe for concurrent use.
type registrations struct {
	mu  sync.Mutex
	reg prometheus.Registerer
	cs  []prometheus.Collector
}

// wrap returns a Registerer that registers on reg and records what it
// registered; nil for a nil reg (no metrics).
func (r *registrations) wrap(reg prometheus.Registerer) prometheus.Registerer {
	if reg == nil {
		return nil
	}
	r.reg = reg
	return recordingRegisterer{r}
}

func (r *registrations) unregisterAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.cs {
		r.reg.Unregister(c)
	}
	r.cs = nil
}

type recordingRegisterer struct{ r *registrations }

func (w recordingRegisterer) Register(c prometheus.Collector) error {
	if err := w.r.reg.Register(c); err != nil {
		return err
	}
	w.r.mu.Lock()
	w.r.cs = append(w.r.cs, c)
	w.r.mu.Unlock()
	return nil
}

func (w recordingRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := w.Register(c); err != nil {
			panic(err)
		}
	}
}

func (w recordingRegisterer) Unregister(c prometheus.Collector) bool { return w.r.reg.Unregister(c) }
