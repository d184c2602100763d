package enforcer

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/sluice-rl/sluice/rules"
)

// lastKnown is the remembered Redis state: for each key, where Redis last
// said it stood (whole units remaining after its decision, at Redis's time),
// so that when a check for the key must be decided without Redis (a failed
// call, an open breaker, a shed check) the fallback continues from there
// instead of from a full bucket. It also holds the fallback's debts: units it
// granted that Redis has not counted, charged to Redis when it answers again
// (see debts and charge.lua).
//
// What the fallback may grant for a key it knows, as this enforcer's part of
// the region's (share = 1/instances, times 1/Regions for pinned and
// G-Counter rules):
//
//   - token bucket and sliding window: a bucket that starts at share × (R −
//     debts) at Redis's time of R and refills at share × Headroom × limit per
//     period, up to share × Headroom × burst. An exhausted key (R = 0) gets
//     its share of the refill only.
//   - fixed window and G-Counter: share × (R − debts) until the window's end
//     as Redis gave it; after it the key is unknown again (a new window).
//
// Keys never seen (or forgotten) are decided as before, by a full local
// bucket (fallback); the units those grant are debts too.
//
// It is a 2-way set-associative table of fixed size, keyed by a 64-bit hash
// (xxhash) of the Redis key: bounded memory (about 130 bytes an entry), no
// allocation to record an answer, and a key whose set is taken by two others
// replaces the one Redis spoke of least recently (and its debt, if it has
// one, is dropped and counted). Two keys share an entry only if their hashes
// collide (about n²/2⁶⁵ for n keys). Safe for concurrent use: each set is
// guarded by one of 256 striped mutexes.
type lastKnown struct {
	slots []knownEntry
	mask  uint64 // of the set index
	locks [256]sync.Mutex
	used  atomic.Int64  // entries holding a Redis answer
	any   atomic.Bool   // some Redis answer was recorded since start
	owing atomic.Int64  // entries with a debt not yet charged
	lost  atomic.Uint64 // units of debt dropped with their entry (evicted)

	dmu     sync.Mutex
	debtors []uint64 // hashes of the entries that may hold a debt to charge (each once: knownEntry.listed)
}

// knownRule is a rule's values as the script got them (scaled by the
// region's share, a split, an adaptive factor): an entry is used only for the
// same values, since a rule changed since Redis's answer makes it stale.
type knownRule struct {
	alg, limit, burst, period int64 // period in ms
}

type knownEntry struct {
	hash uint64
	knownRule
	rem, at int64 // Redis's remaining after its decision, and its time (ms); at 0: no answer (a debt only)
	sent    int64 // when that decision was sent (Unix ns, this host's clock)
	end     int64 // fixed window, G-Counter: the window's end (ms)
	// The fallback's bucket for the key, seeded from rem at its first use
	// after an answer: tokens at last (ms).
	seeded bool
	listed bool // in debtors
	tokens float64
	last   int64
	// Debts: units granted without Redis, not yet charged (owed) and being
	// charged (charging); key is the Redis key's text, now the caller's time
	// of the last grant (0: Redis TIME), ttl a fixed window key's TTL (ms).
	owed, charging int64
	key            string
	now, ttl       int64
	curve          debtCurve // a token bucket's owed units at their times (owed, not charging)
	// Charges that succeeded: the last one's end (Unix ns, this host's
	// clock) and the units of those within 10 s of each other up to it. An
	// answer to a decision sent before that end may have been decided
	// before the charge ran (see record).
	settledAt, settled int64
}

// newLastKnown returns a table of at least size entries (rounded up to a
// power of two); nil when size < 1 (off).
func newLastKnown(size int) *lastKnown {
	if size < 1 {
		return nil
	}
	n := 2
	for n < size {
		n <<= 1
	}
	return &lastKnown{slots: make([]knownEntry, n), mask: uint64(n/2 - 1)}
}

func knownHash(key []byte) uint64 { return xxhash.Sum64(key) | 1 } // never 0: 0 marks a free entry

// find returns the entry of hash, or nil. Called with its lock held.
func (k *lastKnown) find(hash uint64) *knownEntry {
	set := (hash & k.mask) << 1
	if e := &k.slots[set]; e.hash == hash {
		return e
	}
	if e := &k.slots[set+1]; e.hash == hash {
		return e
	}
	return nil
}

// claim returns the entry of hash, making one (evicting the entry of its set
// that Redis spoke of least recently) if there is none. Called with its lock
// held.
func (k *lastKnown) claim(hash uint64) *knownEntry {
	if e := k.find(hash); e != nil {
		return e
	}
	set := (hash & k.mask) << 1
	a, b := &k.slots[set], &k.slots[set+1]
	e := a
	switch {
	case a.hash == 0:
	case b.hash == 0:
		e = b
	case max(b.at, b.last) < max(a.at, a.last):
		e = b
	}
	if e.hash != 0 {
		if e.at != 0 {
			k.used.Add(-1)
		}
		if e.owed > 0 { // units being charged are settled (or counted lost) by settle
			k.lost.Add(uint64(e.owed))
			k.owing.Add(-1)
		}
	}
	*e = knownEntry{hash: hash} // an evicted hash left in debtors is skipped there
	return e
}

// answered reports whether Redis has answered for key under r's values
// since this enforcer started (or since the entry was evicted).
func (k *lastKnown) answered(key []byte, r knownRule) bool {
	hash := knownHash(key)
	mu := k.lock(hash)
	mu.Lock()
	defer mu.Unlock()
	e := k.find(hash)
	return e != nil && e.at != 0 && e.knownRule == r
}

// debtOf moves key's owed units, if any, into charging and appends them to
// out as a debt (see debts): a decision's own keys, charged before it
// (Limiter.chargeFirst). The entry stays in debtors, which skip it while
// nothing is owed.
func (k *lastKnown) debtOf(key []byte, out []debt) []debt {
	hash := knownHash(key)
	mu := k.lock(hash)
	mu.Lock()
	defer mu.Unlock()
	if e := k.find(hash); e != nil && e.owed > 0 {
		out = append(out, debt{hash: hash, key: e.key, rule: e.knownRule, units: e.owed, now: e.now, ttl: e.ttl, curve: e.curve})
		e.charging += e.owed
		e.owed, e.curve = 0, debtCurve{}
		k.owing.Add(-1)
	}
	return out
}

// owes reports whether the fallback owes Redis units for key (owed, or
// being charged).
func (k *lastKnown) owes(key []byte) bool {
	if k.owing.Load() == 0 {
		return false
	}
	hash := knownHash(key)
	mu := k.lock(hash)
	mu.Lock()
	defer mu.Unlock()
	e := k.find(hash)
	return e != nil && e.owed+e.charging > 0
}

// lock returns the mutex of hash's set (both its entries).
func (k *lastKnown) lock(hash uint64) *sync.Mutex { return &k.locks[hash&k.mask&255] }

// record keeps Redis's answer for key: rem whole units left after the
// decision, reset ms until a fixed window's end (else unused), at Redis's
// time of the decision (ms), for a decision sent at sent (Unix ns, this
// host's clock). An answer older than the one kept is ignored; of two at
// the same millisecond, the lower remaining is kept.
//
// A decision sent before a charge of the key's debts ended may have run in
// Redis before the charge (they travel on different connections) and its
// remaining then leaves the charged units out while the debt is no longer
// owed: the fallback, seeded from it, would grant them again (a test of the
// breaker's ramp saw 6 of a fixed window of 5, a half-open probe's answer
// recorded after the charge its decision ran ahead of). The fallback's
// bucket is seeded from such an answer less the units charged (the recent
// charges'; when the decision ran after them this under-grants until
// Redis's next answer, the safe side): see take.
func (k *lastKnown) record(key []byte, r knownRule, rem, reset, at, sent int64) {
	hash := knownHash(key)
	mu := k.lock(hash)
	mu.Lock()
	e := k.claim(hash)
	switch {
	case e.at == 0:
		k.used.Add(1)
	case e.knownRule != r: // the rule changed: the old answer is stale
	case at < e.at || at == e.at && rem >= e.rem:
		mu.Unlock()
		return
	}
	e.knownRule, e.rem, e.at, e.sent, e.seeded = r, max(0, rem), at, sent, false
	e.end = 0
	if r.alg == int64(rules.FixedWindow) || r.alg == algGCounter {
		e.end = at + reset
	}
	mu.Unlock()
	if !k.any.Load() {
		k.any.Store(true)
	}
}

// take decides cost for key from what Redis last said, at now (ms, the
// fallback's clock): known is false when there is no usable answer (none,
// another rule's values, a fixed window that has ended), and the caller
// decides by its own bucket. Otherwise ok says whether the key holds cost
// for this enforcer, and if it does the cost is taken (and owed to Redis: a
// debt). wait is how long until it would (ms), -1 when cost exceeds this
// enforcer's part of the capacity. share is this enforcer's part of the
// rule (1/instances, or less), headroom the refill's allowance for uneven
// traffic (Options.Fallback.Headroom). callerNow is the request's own time (ms; 0:
// Redis TIME) and ttl a fixed window key's TTL (ms), for the debt's charge;
// debt false takes without owing (a pinned rule, whose Redis is another
// region's).
func (k *lastKnown) take(key []byte, r knownRule, cost int64, share, headroom float64, now, callerNow, ttl int64, debt bool) (known, ok bool, wait int64) {
	hash := knownHash(key)
	mu := k.lock(hash)
	mu.Lock()
	defer mu.Unlock()
	e := k.find(hash)
	if e == nil || e.at == 0 || e.knownRule != r {
		return false, false, 0
	}
	fixed := r.alg == int64(rules.FixedWindow) || r.alg == algGCounter
	if fixed && now >= e.end {
		return false, false, 0
	}
	if !e.seeded {
		charged := int64(0) // units charged since the answer's decision was sent (see record)
		if e.settledAt >= e.sent {
			charged = e.settled
		}
		e.tokens = float64(max(0, e.rem-e.owed-e.charging-charged)) * share
		e.last, e.seeded = e.at, true
	}
	capacity := max(1, float64(r.burst)*share*headroom)
	perMs := 0.0 // a fixed window refills nothing before its end
	if !fixed {
		perMs = float64(r.limit) * share * headroom / float64(r.period)
		if now > e.last {
			e.tokens = min(capacity, e.tokens+float64(now-e.last)*perMs)
			e.last = now
		}
	}
	if fixed {
		capacity = max(1, float64(r.burst)*share)
	}
	need := float64(cost)
	switch {
	case need > capacity:
		return true, false, -1
	case e.tokens+localEps >= need:
		e.tokens = max(0, e.tokens-need)
		if debt {
			k.oweLocked(e, key, cost, grantTime(now, callerNow), callerNow, ttl)
		}
		return true, true, 0
	case fixed:
		return true, false, e.end - now
	}
	return true, false, int64(math.Ceil((need-e.tokens)/perMs - localEps))
}

// giveBack returns cost taken by take, when another rule denied the request.
func (k *lastKnown) giveBack(key []byte, r knownRule, cost int64) {
	hash := knownHash(key)
	mu := k.lock(hash)
	mu.Lock()
	if e := k.find(hash); e != nil && e.knownRule == r {
		e.tokens += float64(cost)
		if e.owed > 0 {
			e.curve.ungrant(min(cost, e.owed), r) // (a charge under way may hold the rest)
			e.owed = max(0, e.owed-cost)
			if e.owed == 0 {
				k.owing.Add(-1)
			}
		}
	}
	mu.Unlock()
}

// owe records that the fallback's own bucket granted cost for key, which
// Redis has not counted: a debt, charged when Redis answers again. now is
// the fallback's clock (ms), callerNow the request's own time (ms; 0:
// Redis TIME).
func (k *lastKnown) owe(key []byte, r knownRule, cost, now, callerNow, ttl int64) {
	hash := knownHash(key)
	mu := k.lock(hash)
	mu.Lock()
	e := k.claim(hash)
	if e.at != 0 && e.knownRule != r {
		e.at, e.seeded = 0, false // stale answer, for another rule's values
		k.used.Add(-1)
	}
	if e.knownRule != r {
		e.curve = debtCurve{} // grants under other values: charged at once
	}
	e.knownRule = r
	k.oweLocked(e, key, cost, grantTime(now, callerNow), callerNow, ttl)
	mu.Unlock()
}

// grantTime is a grant's time on the clock its debt's charge runs on: the
// caller's when it gives one, else this host's (ms).
func grantTime(now, callerNow int64) int64 {
	if callerNow != 0 {
		return callerNow
	}
	return now
}

// oweLocked adds cost, granted at at (ms, grantTime), to e's debt. Called
// with e's lock held.
func (k *lastKnown) oweLocked(e *knownEntry, key []byte, cost, at, callerNow, ttl int64) {
	if cost <= 0 || !chargeable(e.alg) {
		return
	}
	if e.key != string(key) {
		e.key = string(key) // the degraded path only: a debt is rare
	}
	if e.alg == int64(rules.TokenBucket) {
		e.curve.grant(at, cost, e.knownRule)
	}
	k.addDebt(e, cost, callerNow, ttl)
}

// addDebt adds cost to e's debt, listing e for the next charge. Called with
// e's lock held.
func (k *lastKnown) addDebt(e *knownEntry, cost, callerNow, ttl int64) {
	if e.owed == 0 {
		k.owing.Add(1)
	}
	e.owed += cost
	e.now, e.ttl = callerNow, ttl
	if !e.listed {
		e.listed = true
		k.dmu.Lock()
		k.debtors = append(k.debtors, e.hash)
		k.dmu.Unlock()
	}
}

// chargeable reports whether charge.lua charges a debt of algorithm alg:
// token buckets, sliding and fixed windows. G-Counter windows (whose counts
// other regions merge) and concurrency limits (never decided locally) are
// not.
func chargeable(alg int64) bool {
	return alg == int64(rules.TokenBucket) || alg == int64(rules.SlidingWindow) || alg == int64(rules.FixedWindow)
}

// debt is one key's units to charge to Redis.
type debt struct {
	hash  uint64
	key   string
	rule  knownRule
	units int64
	now   int64 // the caller's time, ms; 0: Redis TIME
	ttl   int64 // fixed window: its key's TTL if it has none, ms
	curve debtCurve
}

// debts moves up to cap(out) − len(out) owed debts into charging and
// appends them to out. Each must be settled (settle) once its charge has
// succeeded or failed. One caller at a time (the limiter's flush).
func (k *lastKnown) debts(out []debt) []debt {
	if k.owing.Load() == 0 {
		return out
	}
	k.dmu.Lock()
	n := min(cap(out)-len(out), len(k.debtors))
	take := append([]uint64(nil), k.debtors[:n]...)
	k.debtors = append(k.debtors[:0], k.debtors[n:]...)
	k.dmu.Unlock()
	for _, h := range take {
		mu := k.lock(h)
		mu.Lock()
		if e := k.find(h); e != nil {
			e.listed = false
			if e.owed > 0 {
				out = append(out, debt{hash: h, key: e.key, rule: e.knownRule, units: e.owed, now: e.now, ttl: e.ttl, curve: e.curve})
				e.charging += e.owed
				e.owed, e.curve = 0, debtCurve{}
				k.owing.Add(-1)
			}
		}
		mu.Unlock()
	}
	return out
}

// settle ends d's charge: charged, the units leave the debt (Redis counts
// them now); else they are owed again.
func (k *lastKnown) settle(d *debt, charged bool) {
	mu := k.lock(d.hash)
	mu.Lock()
	defer mu.Unlock()
	e := k.find(d.hash)
	if e == nil {
		if !charged {
			k.lost.Add(uint64(d.units))
		}
		return
	}
	e.charging = max(0, e.charging-d.units)
	if charged {
		now := time.Now().UnixNano()
		if now-e.settledAt > int64(10*time.Second) {
			e.settled = 0
		}
		e.settled += d.units
		e.settledAt = now
	} else {
		if e.knownRule == d.rule {
			e.curve = d.curve.then(e.curve, e.knownRule) // its grants came before those owed since
		} else {
			e.curve = debtCurve{}
		}
		k.addDebt(e, d.units, d.now, d.ttl)
	}
}

// owedFor returns the units owed and being charged for key.
func (k *lastKnown) owedFor(key []byte) int64 {
	hash := knownHash(key)
	mu := k.lock(hash)
	mu.Lock()
	defer mu.Unlock()
	if e := k.find(hash); e != nil {
		return e.owed + e.charging
	}
	return 0
}
