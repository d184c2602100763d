package crowdsec

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/sluice-rl/sluice/rules"
)

// Scopes of CrowdSec decisions, as the Local API names them.
const (
	ScopeIP       = "Ip"
	ScopeRange    = "Range"
	ScopeAS       = "AS"
	ScopeCountry  = "Country"
	ScopeUsername = "Username"
)

// DefaultScopes are the scopes a Bouncer asks the decision stream for: those
// sluice enforces (Ip and Range on client_ip, AS on asn) and the common ones
// it cannot (Country, Username), so that their decisions reach it, to be
// counted and logged, rather than being filtered out by the Local API
// unseen. A scope not asked for never reaches sluice.
var DefaultScopes = []string{ScopeIP, ScopeRange, ScopeAS, ScopeCountry, ScopeUsername}

// Origin is the prefix of the Origin of every rule a Bouncer writes
// ("crowdsec/cscli", "crowdsec/crowdsec", "crowdsec/CAPI"): the rules it
// owns, counts against its cap, and deletes.
const Origin = "crowdsec/"

// TypeBan is the decision type that denies: its rule has a limit of 0.
const TypeBan = "ban"

// Reasons a decision makes no rule (label reason of
// sluice_crowdsec_decisions_refused_total).
const (
	// RefusedScope: a scope sluice cannot enforce (Country, Username, or
	// a custom one): requests carry no descriptor for it.
	RefusedScope = "scope"
	// RefusedValue: a value that is not what its scope holds (an address,
	// a network, an AS number).
	RefusedValue = "value"
	// RefusedDuration: a duration (or until) that does not parse, or is
	// already over.
	RefusedDuration = "duration"
)

// Limit is a rate: Limit requests per Period (a token bucket of burst
// Limit, as every rule sluice writes for CrowdSec).
type Limit struct {
	Limit  int64
	Period time.Duration
}

// String writes the limit as ParseLimit reads it, e.g. "60/1m".
func (l Limit) String() string {
	p := l.Period.String()
	if strings.HasSuffix(p, "m0s") {
		p = strings.TrimSuffix(p, "0s")
	}
	if strings.HasSuffix(p, "h0m") {
		p = strings.TrimSuffix(p, "0m")
	}
	return fmt.Sprintf("%d/%s", l.Limit, p)
}

// ParseLimit reads "N/PERIOD", e.g. "10/1m" or "1/1s": N >= 1 requests per
// PERIOD, a Go duration of at least 1 ms.
func ParseLimit(s string) (Limit, error) {
	n, p, ok := strings.Cut(s, "/")
	v, err := strconv.ParseInt(n, 10, 64)
	if !ok || err != nil || v < 1 {
		return Limit{}, fmt.Errorf("limit %q: want N/PERIOD with N >= 1 requests, e.g. 10/1m", s)
	}
	d, err := time.ParseDuration(p)
	if err != nil || d < time.Millisecond || d%time.Millisecond != 0 {
		return Limit{}, fmt.Errorf("limit %q: the period %q is not a whole number of milliseconds >= 1ms, e.g. 10/1m", s, p)
	}
	r := rules.Rule{ID: "x", Match: []rules.Match{{Key: rules.KeyClientIP}}, Limit: v, Period: d}
	if err := r.Validate(); err != nil {
		return Limit{}, fmt.Errorf("limit %q: %w", s, errors.Unwrap(err))
	}
	return Limit{Limit: v, Period: d}, nil
}

// DefaultLimit is the limit of decisions of types other than ban (captcha,
// throttle, custom ones) unless Mapping says otherwise: one request a
// second per source, with a burst of 60.
var DefaultLimit = Limit{Limit: 60, Period: time.Minute}

// Mapping says how decisions become dynamic rules. The zero value takes
// the defaults named on each field. It does no I/O.
type Mapping struct {
	// Limits maps decision types other than ban (lower case: captcha,
	// throttle, ...) to the limit their sources get.
	Limits map[string]Limit
	// Default is the limit of other types not in Limits; default
	// DefaultLimit.
	Default Limit
	// Shadow writes the rules in shadow mode: they count and record
	// would-be denials but deny nothing, until an operator promotes them
	// (sluice rules promote ID), which rollback undoes.
	Shadow bool
	// IPv6Prefix is the prefix length enforcers key IPv6 clients by
	// (sluice serve's, enforcer.Options.IPv6Prefix; default 64). An IPv6
	// address, or a network narrower than it, is widened to that
	// prefix: the enforcer never sees a finer client_ip, so a /128 would
	// match nothing.
	IPv6Prefix int
}

func (m *Mapping) defaults() {
	if m.Default == (Limit{}) {
		m.Default = DefaultLimit
	}
	if m.IPv6Prefix == 0 {
		m.IPv6Prefix = 64
	}
}

// want is the rule a group of decisions makes, before its expiry.
type want struct {
	id    string
	match rules.Match
	limit Limit // Limit 0: ban
	typ   string
	scope string
	value string // normalised
}

// refusal is why a decision makes no rule.
type refusal struct {
	reason string
	detail string
}

func (r *refusal) Error() string { return r.reason + ": " + r.detail }

// match maps a decision to the rule it belongs to, or says why it makes
// none.
func (m *Mapping) match(d *Decision) (want, *refusal) {
	w := want{typ: strings.ToLower(d.Type)}
	switch {
	case strings.EqualFold(d.Scope, ScopeIP), strings.EqualFold(d.Scope, ScopeRange):
		p, err := m.prefix(d)
		if err != nil {
			return w, &refusal{RefusedValue, err.Error()}
		}
		w.scope, w.value = "client_ip", p.String()
		w.match = rules.Match{Key: rules.KeyClientIP, CIDR: []netip.Prefix{p}}
	case strings.EqualFold(d.Scope, ScopeAS):
		v := strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(d.Value)), "AS")
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return w, &refusal{RefusedValue, fmt.Sprintf("AS %q is not an AS number", clean(d.Value, 64))}
		}
		w.scope, w.value = "asn", strconv.FormatUint(n, 10)
		w.match = rules.Match{Key: rules.KeyASN, Value: w.value}
	default:
		return w, &refusal{RefusedScope, fmt.Sprintf("scope %q: requests carry no descriptor for it (sluice enforces Ip, Range and AS)", clean(d.Scope, 64))}
	}
	if w.typ == TypeBan {
		w.limit = Limit{Period: time.Second}
	} else if l, ok := m.Limits[w.typ]; ok {
		w.limit = l
	} else {
		w.limit = m.Default
	}
	// One rule per source, type and limit: several decisions on one source
	// (from several scenarios or origins) share it.
	h := sha256.Sum256([]byte(w.scope + "|" + w.value + "|" + w.typ))
	w.id = "cs-" + hex.EncodeToString(h[:8])
	return w, nil
}

// prefix parses an Ip or Range decision's value into the network the
// enforcer can match: an address is its /32 (IPv4) or its IPv6Prefix
// network; a range is its network, widened to IPv6Prefix when narrower.
func (m *Mapping) prefix(d *Decision) (netip.Prefix, error) {
	v := strings.TrimSpace(d.Value)
	var p netip.Prefix
	if strings.Contains(v, "/") {
		var err error
		if p, err = netip.ParsePrefix(v); err != nil {
			return p, fmt.Errorf("%s %q is not a network", d.Scope, clean(d.Value, 64))
		}
	} else {
		a, err := netip.ParseAddr(v)
		if err != nil || a.Zone() != "" {
			return p, fmt.Errorf("%s %q is not an address", d.Scope, clean(d.Value, 64))
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	a := p.Addr()
	if a.Is4In6() {
		bits := p.Bits() - 96
		if bits < 0 {
			return p, fmt.Errorf("%s %q: an IPv4-mapped network wider than ::ffff:0:0/96", d.Scope, clean(d.Value, 64))
		}
		p = netip.PrefixFrom(a.Unmap(), bits)
	}
	if p.Addr().Is6() && p.Bits() > m.IPv6Prefix {
		p = netip.PrefixFrom(p.Addr(), m.IPv6Prefix)
	}
	return p.Masked(), nil
}

// expiry is when a decision ends, received at now: Until when the Local
// API gives it, else now + Duration.
func expiry(d *Decision, now time.Time) (time.Time, *refusal) {
	if d.Until != "" {
		if t, err := time.Parse(time.RFC3339Nano, d.Until); err == nil {
			if !t.After(now) {
				return t, &refusal{RefusedDuration, fmt.Sprintf("until %s is over", t.UTC().Format(time.RFC3339))}
			}
			return t, nil
		}
	}
	dur, err := time.ParseDuration(d.Duration)
	if err != nil {
		return time.Time{}, &refusal{RefusedDuration, fmt.Sprintf("duration %q does not parse", clean(d.Duration, 64))}
	}
	if dur <= 0 {
		return time.Time{}, &refusal{RefusedDuration, fmt.Sprintf("duration %s is over", dur)}
	}
	return now.Add(dur), nil
}

// clean makes a value from the Local API printable and at most n bytes,
// for a log line or a rule's reason and evidence.
func clean(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return -1
	}, s)
	if len(s) > n {
		s = strings.ToValidUTF8(s[:n], "") // a rune cut in two is dropped
	}
	return s
}
