package rules

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Mode says whether a rule's denials take effect.
type Mode uint8

const (
	// Enforce denies requests over the limit.
	Enforce Mode = iota
	// Shadow evaluates and counts the rule but always allows; the decision
	// record says "shadow-denied" where it would have denied.
	Shadow
)

var modeNames = [...]string{"enforce", "shadow"}

func (m Mode) String() string {
	if m == Shadow {
		return "shadow"
	}
	return "enforce"
}

// FailureMode says what a rule does when the limiter's storage fails.
type FailureMode uint8

const (
	// FailOpen, the default, falls back to an in-process token bucket per
	// rule and entity, sized to this enforcer's part of the limit (see
	// enforcer.Options.Fallback.Headroom): requests within it are allowed, others
	// denied, while Redis is unavailable.
	FailOpen FailureMode = iota
	// FailClosed denies the request (degraded-closed): for login, OTP and payment rules.
	FailClosed
	// FailOpenUnlimited allows every request while Redis is unavailable.
	FailOpenUnlimited
)

var failureModeNames = [...]string{"open", "closed", "open_unlimited"}

func (f FailureMode) String() string {
	if int(f) < len(failureModeNames) {
		return failureModeNames[f]
	}
	return fmt.Sprintf("FailureMode(%d)", uint8(f))
}

// Algorithm is how a rule counts. Every algorithm of a request's matching
// rules is decided in the same atomic script call (see package enforcer).
type Algorithm uint8

const (
	// TokenBucket, the default: capacity Burst, refilled by Limit tokens per
	// Period, lazily (no timers). A request takes Cost tokens.
	TokenBucket Algorithm = iota
	// SlidingWindow is the sliding-window counter: the previous window's
	// count weighted by how much of it still overlaps the sliding window
	// ending now, plus the current window's count, must stay within Limit
	// per Period. Windows are aligned to the Unix epoch.
	SlidingWindow
	// FixedWindow counts up to Limit per window. Windows are aligned to the
	// Unix epoch in multiples of Period, or are calendar days, ISO weeks or
	// months in a time zone (see Calendar). The window is chosen from the
	// decision's time by the enforcer, so a write that reaches Redis after the
	// window ended still counts in its own window.
	FixedWindow
	// Concurrency limits requests in flight: at most Limit leases are held at
	// once. A lease lasts until released, or at most Period (the lease TTL),
	// so a crashed request frees its slot. Cost does not apply: a request
	// holds one slot.
	Concurrency
)

var algorithmNames = [...]string{"token_bucket", "sliding_window", "fixed_window", "concurrency"}

func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// ParseAlgorithm maps a YAML name such as "sliding_window" to its Algorithm;
// "" is TokenBucket.
func ParseAlgorithm(s string) (Algorithm, error) {
	if s == "" {
		return TokenBucket, nil
	}
	for i, n := range algorithmNames {
		if n == s {
			return Algorithm(i), nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q (want one of %v)", s, algorithmNames[:])
}

// Calendar names a calendar window for FixedWindow rules.
type Calendar uint8

const (
	// NoCalendar: windows are multiples of Period since the Unix epoch (UTC).
	NoCalendar Calendar = iota
	// Day: from midnight to midnight in the rule's Location (23 or 25 hours
	// on daylight-saving days).
	Day
	// Week: ISO weeks, Monday 00:00 to Monday 00:00 in the rule's Location.
	Week
	// Month: from the 1st 00:00 to the next month's 1st in the rule's Location.
	Month
)

var calendarNames = [...]string{"", "day", "week", "month"}

func (c Calendar) String() string {
	if int(c) < len(calendarNames) {
		return calendarNames[c]
	}
	return fmt.Sprintf("Calendar(%d)", uint8(c))
}

// Rule is one limit on the requests that match it. With the default
// TokenBucket algorithm Limit tokens are added every Period, up to Burst; see
// Algorithm for the others. A request costs one token unless it says
// otherwise (hits_addend), or its route has a default cost (Set.Costs).
//
// Static rules come from YAML (see Parse); dynamic rules come from the
// detector or an operator through Redis (see Store) and carry Origin, Reason,
// Evidence and an expiry. A Rule is immutable once in a Set.
type Rule struct {
	ID string `json:"id"`
	// Description says in words what the rule limits and why, for the API's
	// customers (the sidecar's /v1/usage shows it) and operators; optional,
	// at most 200 bytes of printable text. Dynamic rules say it in Reason.
	Description string    `json:"description,omitempty"`
	Match       []Match   `json:"match"`
	Algorithm   Algorithm `json:"algorithm"`
	// Limit is tokens per Period (TokenBucket), requests or cost per window
	// (SlidingWindow, FixedWindow), or leases in flight (Concurrency); > 0.
	//
	// A Limit of 0 blocks: every matching request is denied (shadow: would
	// be denied) without a Redis call, as requests_per_unit: 0 does in an
	// envoyproxy/ratelimit config.
	Limit int64 `json:"limit"`
	// Period is the refill period or window length, or the lease TTL for
	// Concurrency: any whole number of milliseconds >= 1 ms. For calendar
	// windows it is 0 (the calendar decides).
	Period time.Duration `json:"period"`
	// Burst is the token bucket's capacity, > 0; defaults to Limit. The other
	// algorithms' capacity is Limit, and Burst is set to it.
	Burst int64 `json:"burst"`
	// Calendar and Location make a FixedWindow rule's windows calendar days,
	// weeks or months in a time zone (nil Location = UTC).
	Calendar    Calendar       `json:"calendar,omitempty"`
	Location    *time.Location `json:"-"`
	Mode        Mode           `json:"mode"`
	FailureMode FailureMode    `json:"failure_mode"`
	// Global marks a limit that holds across all regions: each region enforces
	// its share of it (see Share), or 1/regions when no share is known —
	// unless Pinned or GCounter says otherwise.
	Global bool `json:"global"`
	// Pinned (a Global rule, YAML `pinned: true`) makes the limit a hard cap
	// counted in one place: each entity's counter lives in the Redis of its
	// home region, chosen by rendezvous hashing of the entity tag over the
	// configured regions (see HomeRegion), and enforcers of other regions
	// check that Redis synchronously, over the WAN. The whole limit applies
	// there; shares do not. For regulatory or paid-per-call caps. Not for
	// concurrency rules.
	Pinned bool `json:"pinned,omitempty"`
	// GCounter (a Global FixedWindow rule, YAML `g_counter: true`) makes the
	// window's count a G-Counter (Shapiro et al. 2011): each region counts
	// its own requests in its Redis, the regions' counts are exchanged and
	// merged by element-wise maximum, and a region denies once the sum of
	// the merged counts reaches Limit. Windows are UTC (calendar day, week,
	// month, or multiples of Period since the epoch). Shares do not apply.
	GCounter bool `json:"g_counter,omitempty"`
	// ExactKeys makes the rule match only a descriptor that carries its
	// match keys and no others (account, org and tier, which the key store
	// adds, aside), as a limit in an envoyproxy/ratelimit config applies
	// only to a descriptor with exactly its entries.
	ExactKeys bool `json:"exact_keys,omitempty"`
	// Replaces names rules (by id) that this rule replaces when both match
	// one request, in any of its descriptors: a per-customer override
	// replacing its tier's rule, as envoyproxy/ratelimit's `replaces`.
	// Static rules only.
	Replaces []string `json:"replaces,omitempty"`
	// DetailedMetric is envoyproxy/ratelimit's detailed_metric, kept for
	// conversion. sluice's decision records carry every descriptor value,
	// so per-value counts come from them; no per-value metric series is
	// made (its cardinality would be unbounded).
	DetailedMetric bool `json:"detailed_metric,omitempty"`
	// Scope says where the rule is counted: the region's Redis (the
	// default) or, for ScopeLocal (YAML `scope: local`), this enforcer's
	// memory alone; see Scope.
	Scope Scope `json:"scope,omitempty"`
	// AdaptiveFloor, when > 0, makes the rule adaptive (YAML `adaptive:
	// {floor: 0.2}`): its limit and burst are scaled by the enforcer's
	// adaptive factor, which follows the backend's health, but never below
	// AdaptiveFloor of them; in (0, 1]. 0: not adaptive.
	AdaptiveFloor float64 `json:"adaptive_floor,omitempty"`

	// Dynamic rules only.
	Origin    string            `json:"origin,omitempty"`
	Reason    string            `json:"reason,omitempty"`
	Evidence  map[string]string `json:"evidence,omitempty"`
	ExpiresAt time.Time         `json:"expires_at,omitzero"`
	Version   int64             `json:"version,omitempty"`
}

// Window returns the FixedWindow window that holds t: [start, end). Windows
// of a Period are aligned to the Unix epoch; calendar windows follow the
// rule's Location (UTC when nil). Only meaningful for FixedWindow rules.
func (r *Rule) Window(t time.Time) (start, end time.Time) {
	if r.Calendar == NoCalendar {
		p := r.Period.Milliseconds()
		ms := t.UnixMilli()
		s := ms - ((ms%p)+p)%p // floor, also before 1970
		return time.UnixMilli(s), time.UnixMilli(s + p)
	}
	loc := r.Location
	if loc == nil {
		loc = time.UTC
	}
	lt := t.In(loc)
	y, m, d := lt.Date()
	switch r.Calendar {
	case Day:
		return dayStart(y, m, d, loc), dayStart(y, m, d+1, loc)
	case Week:
		back := (int(lt.Weekday()) + 6) % 7 // days since Monday
		return dayStart(y, m, d-back, loc), dayStart(y, m, d-back+7, loc)
	default:
		return dayStart(y, m, 1, loc), dayStart(y, m+1, 1, loc)
	}
}

// dayStart returns the first instant of the local date y-m-d in loc (the
// date is normalised, so d may overflow the month). That is midnight, except
// where the clocks jump forward at midnight (America/Santiago in September,
// Africa/Cairo in April): there the day begins at the transition, e.g.
// 01:00 -03, and time.Date would give an instant of the day before.
func dayStart(y int, m time.Month, d int, loc *time.Location) time.Time {
	y, m, d = time.Date(y, m, d, 12, 0, 0, 0, time.UTC).Date()
	c := time.Date(y, m, d, 0, 0, 0, 0, loc)
	if cy, cm, cd := c.Date(); cy != y || cm != m || cd != d {
		_, end := c.ZoneBounds() // c fell on the day before: the day begins where its zone ends
		return end
	}
	// On the right date, c is midnight, or, when midnight is missing, the
	// transition itself (the offset before it applied to 00:00).
	return c
}

// Describe says what the rule limits in words, for reports and logs, e.g.
// "20 per 1s, burst 40 (token bucket), enforce, global".
func (r *Rule) Describe() string {
	var s string
	switch {
	case r.Limit == 0:
		s = "blocks every request"
	case r.Algorithm == Concurrency:
		s = fmt.Sprintf("%d in flight, lease %s (concurrency)", r.Limit, r.Period)
	case r.Calendar != NoCalendar:
		zone := "UTC"
		if r.Location != nil {
			zone = r.Location.String()
		}
		s = fmt.Sprintf("%d per calendar %s in %s (fixed window)", r.Limit, r.Calendar, zone)
	case r.Algorithm == TokenBucket:
		s = fmt.Sprintf("%d per %s, burst %d (token bucket)", r.Limit, r.Period, r.Burst)
	default:
		s = fmt.Sprintf("%d per %s (%s)", r.Limit, r.Period, strings.ReplaceAll(r.Algorithm.String(), "_", " "))
	}
	s += ", " + r.Mode.String()
	if r.Global {
		s += ", global"
	}
	if r.Pinned {
		s += ", pinned to a home region"
	}
	if r.GCounter {
		s += ", G-Counter across regions"
	}
	return s
}

// Dynamic reports whether the rule came from the detector or an operator
// rather than the static rule file.
func (r *Rule) Dynamic() bool { return r.Origin != "" }

// Blocks reports whether the rule denies every request it matches (Limit 0).
func (r *Rule) Blocks() bool { return r.Limit == 0 }

// Matches reports whether the request carries every descriptor the rule
// needs, with values that pass its conditions (see Match), and, for an
// ExactKeys rule, no other descriptor. It allocates nothing.
func (r *Rule) Matches(d *Descriptors) bool {
	for i := range r.Match {
		m := &r.Match[i]
		if !m.Passes(d.Get(m.Key, m.Name)) {
			return false
		}
	}
	return !r.ExactKeys || r.onlyKeys(d)
}

// derived marks the keys the key store fills in (see KeyStore): ExactKeys
// ignores them.
func derived(k Key) bool { return k == KeyAccount || k == KeyOrg || k == KeyTier }

// onlyKeys reports whether d carries no descriptor beyond r's match keys,
// derived keys aside. Matches has checked that d carries all of them, and a
// rule matches a key at most once, so counting suffices.
func (r *Rule) onlyKeys(d *Descriptors) bool {
	want := 0
	for i := range r.Match {
		if !derived(r.Match[i].Key) {
			want++
		}
	}
	have := 0
	for k := range NumKeys {
		if d[k] != "" && !derived(k) {
			have++
		}
	}
	for i := int(NumKeys); i < len(d); i += 2 {
		if d[i] != "" && d[i+1] != "" {
			have++
		}
	}
	return have == want
}

// fieldError is a rule's error about one of its fields, named as in the
// rule file (period, burst, ...): Parse points at that field's line.
type fieldError struct {
	field string
	err   error
}

func (e *fieldError) Error() string { return e.err.Error() }
func (e *fieldError) Unwrap() error { return e.err }

// ErrInvalidRule is wrapped by every validation error.
var ErrInvalidRule = errors.New("invalid rule")

const maxIDLen = 64

// ValidID reports whether id is 1-64 characters of [A-Za-z0-9_.-], so that it
// can be part of a Redis key, a metric label or a share field without
// escaping. Rule ids and region names follow it.
func ValidID(id string) bool {
	if id == "" || len(id) > maxIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '.', c == '-':
		default:
			return false
		}
	}
	return true
}

// MaxWait bounds every wait and reset a rule can make the enforcer compute
// (a Retry-After, X-RateLimit-Reset, RateLimit t=, Envoy's
// duration_until_reset): 100 years, well inside time.Duration's 292. Validate
// refuses a rule whose longest one would be more (see Rule.LongestReset).
const MaxWait = 100 * 365 * 24 * time.Hour

// LongestReset is the longest time the rule can report until it is full
// again (a reset) or make a request wait: a token bucket's time to refill
// from empty (burst × period ÷ limit, rounded up to the millisecond); a
// sliding window's two periods (a burst fades over the current window, then
// as the previous one); a fixed window's or concurrency lease's period; a
// calendar window's longest length (31 days). It is computed in floating
// point, so that it does not overflow for any rule; Validate compares it
// with MaxWait.
func (r *Rule) LongestReset() float64 {
	ms := float64(r.Period.Milliseconds())
	switch {
	case r.Calendar != NoCalendar:
		ms = 31 * 24 * 3600e3
	case r.Algorithm == TokenBucket && r.Limit > 0:
		ms = math.Ceil(float64(max(r.Burst, r.Limit)) * ms / float64(r.Limit))
	case r.Algorithm == SlidingWindow:
		ms *= 2
	}
	return ms * 1e6
}

// Validate checks the rule's fields and fills defaults (Burst = Limit).
func (r *Rule) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w %q: %s", ErrInvalidRule, r.ID, fmt.Sprintf(format, a...))
	}
	badField := func(field, format string, a ...any) error {
		return &fieldError{field: field, err: bad(format, a...)}
	}
	if !ValidID(r.ID) {
		return badField("id", "id must be 1-%d characters of A-Z a-z 0-9 _ . -", maxIDLen)
	}
	if len(r.Description) > maxDescriptionLen || !printable(r.Description) {
		return badField("description", "description must be at most %d bytes of printable text (no control characters)", maxDescriptionLen)
	}
	if len(r.Match) == 0 {
		return badField("match", "match is empty: name at least one descriptor key, e.g. match: [{key: client_ip}]")
	}
	seen := map[string]bool{}
	custom := 0
	for i := range r.Match {
		if r.Match[i].Key == KeyCustom {
			custom++
		}
		m := &r.Match[i]
		if err := m.validate(); err != nil {
			return badField("match", "%v", err)
		}
		if seen[m.KeyName()] {
			return badField("match", "descriptor key %s is matched twice", m.KeyName())
		}
		seen[m.KeyName()] = true
	}
	if custom > MaxCustom {
		return badField("match", "%d custom keys: a request carries at most %d, so the rule could never match", custom, MaxCustom)
	}
	for _, id := range r.Replaces {
		if id == r.ID {
			return badField("replaces", "a rule cannot replace itself")
		}
		if !ValidID(id) {
			return badField("replaces", "replaces %q: not a rule id", id)
		}
	}
	if r.Algorithm > Concurrency {
		return badField("algorithm", "unknown algorithm %d", r.Algorithm)
	}
	if r.FailureMode > FailOpenUnlimited {
		return badField("failure_mode", "unknown failure mode %d", r.FailureMode)
	}
	if r.Limit < 0 {
		return badField("limit", "limit must be >= 0 (tokens per period; 0 blocks), got %d", r.Limit)
	}
	if r.Limit == 0 && r.Algorithm == Concurrency {
		return badField("limit", "a concurrency limit must be > 0 (use a limit of 0 with another algorithm to block)")
	}
	if r.Calendar != NoCalendar {
		if r.Algorithm != FixedWindow {
			return badField("calendar", "calendar windows need algorithm fixed_window")
		}
		if r.Calendar > Month {
			return badField("calendar", "unknown calendar %d", r.Calendar)
		}
		if r.Period != 0 {
			return badField("period", "a calendar window has no period: remove period, or calendar")
		}
	} else if r.Period < time.Millisecond || r.Period%time.Millisecond != 0 {
		return badField("period", "period must be a whole number of milliseconds >= 1ms, got %s", r.Period)
	} else if r.Location != nil {
		return badField("timezone", "a time zone applies only to calendar windows (calendar: day, week or month)")
	}
	if r.Pinned {
		switch {
		case !r.Global:
			return badField("pinned", "pinned applies only to global rules: add global: true")
		case r.Algorithm == Concurrency:
			return badField("pinned", "a concurrency rule cannot be pinned: its leases are released in the region that holds them")
		case r.GCounter:
			return badField("g_counter", "pinned and g_counter are two ways to hold a global limit: choose one")
		}
	}
	if r.GCounter {
		switch {
		case !r.Global:
			return badField("g_counter", "g_counter applies only to global rules: add global: true")
		case r.Algorithm != FixedWindow:
			return badField("g_counter", "g_counter needs algorithm fixed_window (a calendar day, week or month, or a period)")
		case r.Location != nil && r.Location.String() != "UTC":
			return badField("timezone", "a g_counter quota's windows are UTC, so that every region closes them at the same instant: remove timezone %s", r.Location)
		}
	}
	if err := r.validateScope(); err != nil {
		return badField("scope", "%v", err)
	}
	if f := r.AdaptiveFloor; f < 0 || f > 1 || f != f {
		return badField("adaptive", "adaptive: floor %v: want a fraction of the limit in (0, 1], e.g. 0.2", f)
	}
	if r.Algorithm != TokenBucket {
		if r.Burst != 0 && r.Burst != r.Limit {
			return badField("burst", "burst applies only to token_bucket: a %s rule's capacity is its limit", r.Algorithm)
		}
		r.Burst = r.Limit
	}
	if r.Burst == 0 {
		r.Burst = r.Limit
	}
	if r.Burst < 0 || (r.Burst == 0 && r.Limit > 0) {
		return badField("burst", "burst must be at least 1 (or 0, or absent: the limit), got %d", r.Burst)
	}
	if r.Limit == 0 && r.Burst != 0 {
		return badField("burst", "a blocking rule (limit 0) has no burst")
	}
	// Keep burst x period inside the 2^53 integers that Lua numbers hold exactly.
	period := "period"
	if r.Algorithm == Concurrency {
		period = "lease"
	}
	if r.Limit > 1<<52 || r.Burst > 1<<52 {
		return badField("limit", "limit and burst must be at most 2^52")
	}
	if float64(r.Burst)*float64(r.Period.Milliseconds()) > 1<<52 ||
		float64(r.Limit)*float64(r.Period.Milliseconds()) > 1<<52 {
		return badField("limit", "burst or limit times %s (ms) exceeds 2^52: use a smaller limit or burst, or a shorter %s", period, period)
	}
	if ns := r.LongestReset(); ns > float64(MaxWait) {
		how := "its " + period
		switch {
		case r.Algorithm == TokenBucket:
			how = "the time to refill from empty, burst × period ÷ limit"
		case r.Algorithm == SlidingWindow:
			how = "twice its period, as a burst fades over two windows"
		}
		return bad("its longest wait or reset, %s (%s), is more than sluice represents (%.0f years, rules.MaxWait): use a shorter %s or, for a token bucket, a smaller burst or larger limit",
			fmtYears(ns), how, MaxWait.Hours()/24/365, period)
	}
	return nil
}

// fmtYears writes a duration in nanoseconds that may exceed time.Duration
// in years of 365 days.
func fmtYears(ns float64) string {
	return fmt.Sprintf("%.0f years", ns/float64(365*24*time.Hour))
}

// maxDescriptionLen bounds a rule's Description.
const maxDescriptionLen = 200

// printable reports whether s is valid UTF-8 without control characters.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, c := range s {
		if unicode.IsControl(c) {
			return false
		}
	}
	return true
}
