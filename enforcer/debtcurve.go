package enforcer

// debtCurve is what a run of fallback grants does to a token bucket in
// Redis, had each reached it at its time: the bucket's level just after the
// last grant, as a function of its level x just before the first,
//
//	level = min(a, x + b)
//
// in the script's units (tokens × period; a bucket gains limit units a ms,
// up to burst × period). Lazy refill is x ↦ min(cap, x + Δ·limit) and a grant
// of u tokens is x ↦ x − u·period; each is of that form, and so is any run of
// them (min(A, x + B) refilled is min(min(cap, A + Δ·limit), x + B + Δ·limit),
// then less u·period both), so two numbers hold the run whatever its
// length, exactly (the token bucket as a min-plus linear map; see Le Boudec
// and Thiran, "Network Calculus", 2001, ch. 1). t0 and tl are the first and
// the last grant's times (ms, the grant clock: the caller's when it gives
// one, else this host's).
//
// charge.lua applies it where Redis's stored state is no newer than t0 (no
// one else wrote the key since the first grant: Redis was down, frozen or
// unreachable for everyone): the level refilled to t0, the curve, then the
// refill from tl to the charge. A client that stayed under its limit
// through an outage then owes nothing it did not refill, where charging
// every unit at once at the end (the refill of the outage capped at the
// burst, then the whole debt) left it denied for seconds after. Where the
// state is newer (others decided on Redis meanwhile), the units are charged
// at once, as before: less refill, never more.
type debtCurve struct {
	a, b, t0, tl int64
	set          bool // false: no grant
}

// curveSlack bounds b above a: min(a, x + b) is a for every input x ≥
// a − b, and an input (a level, or what an earlier curve leaves: a debt
// beyond empty) is never below −2⁵², so b ≤ a + 2⁵² changes nothing and
// keeps both exact in int64 and in Lua's doubles however long the refills.
const curveSlack = 1 << 52

// addCapped is min(ceil, x + dt·l) for x ≤ ceil, dt ≥ 0 and l > 0, without
// overflow.
func addCapped(x, dt, l, ceil int64) int64 {
	if dt > (ceil-x)/l {
		return ceil
	}
	return min(ceil, x+dt*l)
}

// refill is the curve followed by dt ms of refill for r.
func (c debtCurve) refill(dt int64, r knownRule) debtCurve {
	if dt <= 0 || r.limit <= 0 {
		return c
	}
	c.a = addCapped(c.a, dt, r.limit, r.burst*r.period)
	c.b = addCapped(c.b, dt, r.limit, c.a+curveSlack)
	return c
}

// grant adds a grant of units tokens at time at (ms) for rule r.
func (c *debtCurve) grant(at, units int64, r knownRule) {
	if !c.set {
		*c = debtCurve{a: r.burst * r.period, b: 0, t0: at, tl: at, set: true}
	} else if at > c.tl {
		*c = c.refill(at-c.tl, r)
		c.tl = at
	}
	c.a -= units * r.period
	c.b -= units * r.period
}

// ungrant gives back the last grant of units tokens (another rule denied
// the request it was for).
func (c *debtCurve) ungrant(units int64, r knownRule) {
	if c.set {
		c.a = min(r.burst*r.period, c.a+units*r.period)
		c.b = min(c.b+units*r.period, c.a+curveSlack)
	}
}

// then is c followed by n (n's grants all later than c's: a charge that
// failed, owed again before the grants made while it ran).
func (c debtCurve) then(n debtCurve, r knownRule) debtCurve {
	if !c.set {
		return n
	}
	if !n.set {
		return c
	}
	m := c.refill(n.t0-c.tl, r)
	out := debtCurve{a: min(n.a, m.a+n.b), b: m.b + n.b, t0: c.t0, tl: max(c.tl, n.tl), set: true}
	out.b = min(out.b, out.a+curveSlack)
	return out
}
