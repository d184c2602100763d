package rules

import (
	"errors"
	"fmt"
	"time"
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

func (m Mode) String() string {
	if m == Shadow {
		return "shadow"
	}
	return "enforce"
}

// FailureMode says what a rule does when the limiter's storage fails.
type FailureMode uint8

const (
	// FailOpen allows the request (degraded-open). The default.
	FailOpen FailureMode = iota
	// FailClosed denies the request (degraded-closed): for login, OTP and payment rules.
	FailClosed
)

func (f FailureMode) String() string {
	if f == FailClosed {
		return "closed"
	}
	return "open"
}

// Match is one condition of a rule: the request must carry descriptor Key,
// and, when Value is not empty, with exactly that value. A rule with a match
// on a key and no value keeps one bucket per distinct value of that key.
type Match struct {
	Key   Key
	Value string
}

// Rule is one token-bucket limit: Limit tokens are added every Period, up to
// Burst. A request costs one token unless it says otherwise (hits_addend).
//
// Static rules come from YAML (see Parse); dynamic rules come from the
// detector or an operator through Redis (see Store) and carry Origin, Reason,
// Evidence and an expiry. A Rule is immutable once in a Set.
type Rule struct {
	ID          string
	Match       []Match
	Limit       int64         // tokens per Period, > 0
	Period      time.Duration // refill period, >= 1ms, whole milliseconds
	Burst       int64         // bucket capacity in tokens, > 0; defaults to Limit
	Mode        Mode
	FailureMode FailureMode
	// Global marks a limit that holds across all regions: each region enforces
	// its share of it (see Share), or 1/regions when no share is known.
	Global bool

	// Dynamic rules only.
	Origin    string            `json:",omitempty"`
	Reason    string            `json:",omitempty"`
	Evidence  map[string]string `json:",omitempty"`
	ExpiresAt time.Time         `json:",omitzero"`
	Version   int64             `json:",omitempty"`
}

// Dynamic reports whether the rule came from the detector or an operator
// rather than the static rule file.
func (r *Rule) Dynamic() bool { return r.Origin != "" }

// Matches reports whether the request carries every descriptor the rule
// needs, with the values it names.
func (r *Rule) Matches(d *Descriptors) bool {
	for _, m := range r.Match {
		v := d[m.Key]
		if v == "" || (m.Value != "" && v != m.Value) {
			return false
		}
	}
	return true
}

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

// Validate checks the rule's fields and fills defaults (Burst = Limit).
func (r *Rule) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w %q: %s", ErrInvalidRule, r.ID, fmt.Sprintf(format, a...))
	}
	if !ValidID(r.ID) {
		return bad("id must be 1-%d characters of A-Z a-z 0-9 _ . -", maxIDLen)
	}
	if len(r.Match) == 0 {
		return bad("match is empty: name at least one descriptor key, e.g. match: [{key: client_ip}]")
	}
	seen := [NumKeys]bool{}
	for _, m := range r.Match {
		if m.Key >= NumKeys {
			return bad("unknown descriptor key %d", m.Key)
		}
		if seen[m.Key] {
			return bad("descriptor key %s is matched twice", m.Key)
		}
		seen[m.Key] = true
	}
	if r.Limit <= 0 {
		return bad("limit must be > 0 (tokens per period), got %d", r.Limit)
	}
	if r.Period < time.Millisecond || r.Period%time.Millisecond != 0 {
		return bad("period must be a whole number of milliseconds >= 1ms, got %s", r.Period)
	}
	if r.Burst == 0 {
		r.Burst = r.Limit
	}
	if r.Burst < 0 {
		return bad("burst must be > 0, got %d", r.Burst)
	}
	// Keep burst x period inside the 2^53 integers that Lua numbers hold exactly.
	if float64(r.Burst)*float64(r.Period.Milliseconds()) > 1<<52 ||
		float64(r.Limit)*float64(r.Period.Milliseconds()) > 1<<52 {
		return bad("burst or limit times period (ms) exceeds 2^52: use a smaller limit or burst, or a shorter period")
	}
	return nil
}
