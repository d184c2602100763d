package enforcer

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/sluice-rl/sluice/rules"
)

// overrideRules bounds the distinct (limit, period) override rules kept.
const overrideRules = 1024

// overrideKeyName stands for the rule id in an override's Redis keys:
// sl:{<entity tag>}:override:2:<window start ms>. The counter is the
// entity's (the domain and the descriptor's entries) and the window's, as
// envoyproxy/ratelimit keys it (domain, entries, window start), not the
// limit's: an override lowered mid-window counts what was already taken,
// and a changed period starts counting in its own windows.
const overrideKeyName = "override"

// overrideRule returns the fixed-window rule that stands for o: one per
// distinct limit and period, cached, so that a request with an override
// allocates nothing after the first. Its id names the limit, for responses
// and metrics; its counter does not (overrideKeyName).
func (l *Limiter) overrideRule(o *Override) (*rules.Rule, error) {
	if o.Entity == "" {
		return nil, fmt.Errorf("%w: a limit override needs an entity", ErrBadRequest)
	}
	k := overrideKey{o.Limit, o.Period}
	if r, ok := l.overrides.Get(k); ok {
		return r, nil
	}
	r := &rules.Rule{
		ID:        "override_" + strconv.FormatInt(o.Limit, 10) + "_per_" + o.Period.String(),
		Algorithm: rules.FixedWindow, Limit: o.Limit, Burst: o.Limit, Period: o.Period,
		Mode: rules.Enforce, FailureMode: rules.FailOpen,
	}
	v := *r
	v.Match = []rules.Match{{}} // an override matches nothing: it is given with the request
	if err := v.Validate(); err != nil {
		return nil, fmt.Errorf("%w: limit override: %v", ErrBadRequest, err)
	}
	l.overrides.Add(k, r)
	return r, nil
}

type overrideKey struct {
	limit  int64
	period time.Duration
}

// appendOverrideTag appends the entity tag of an override's entity: like
// rules.AppendEntityTag, a 128-bit SHA-256 prefix in hex, with a prefix
// byte no rule's match keys produce.
func appendOverrideTag(dst []byte, entity string) []byte {
	h := sha256.New()
	h.Write([]byte{0xff})
	h.Write([]byte(entity))
	var sum [sha256.Size]byte
	return hex.AppendEncode(dst, h.Sum(sum[:0])[:16])
}
