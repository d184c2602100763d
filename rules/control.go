package rules

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// MaxDynamicTTL is the longest a dynamic rule may live from its write: the
// TTL of the Redis hash that holds the dynamic rules (package rules/store),
// which every write renews. A rule that must last longer belongs in the
// static rule set.
const MaxDynamicTTL = 24 * time.Hour

// Errors of CheckDynamic.
var (
	// ErrNoExpiry: a dynamic rule has no ExpiresAt, or one not after now.
	// Every dynamic rule lapses on its own.
	ErrNoExpiry = errors.New("a dynamic rule needs an expiry after now")
	// ErrExpiryTooFar: a dynamic rule's ExpiresAt is more than MaxDynamicTTL
	// after now: the hash that holds it would expire first.
	ErrExpiryTooFar = errors.New("a dynamic rule lives at most 24h; make it a static rule for longer")
)

// Share is one region's fraction of a global rule's limit, for one entity
// (Key = EntityTag) or, with Key "", for every entity without a share of its
// own. Fractions of one (RuleID, Key) sum to at most 1 over the regions.
type Share struct {
	RuleID     string    `json:"rule"`
	Key        string    `json:"key,omitempty"`
	Region     string    `json:"region"`
	Fraction   float64   `json:"f"`
	Version    int64     `json:"v"`
	ComputedAt time.Time `json:"at"`
}

// HotKey marks one entity of a rule hot (a heavy hitter the pipeline saw
// across the region's enforcers): with Lease, each enforcer takes its tokens
// from Redis in blocks at once, without waiting to see the key's rate
// itself; with Split N > 1, the entity's counter is split into N sub-keys
// of limit/N each, one per group of enforcer instances, so that no single
// Redis key (and node) takes all of its traffic. Key is the entity tag
// (EntityTag). The mark lapses at ExpiresAt.
type HotKey struct {
	RuleID    string    `json:"rule"`
	Key       string    `json:"key"`
	Lease     bool      `json:"lease,omitempty"`
	Split     int       `json:"split,omitempty"`
	ExpiresAt time.Time `json:"expires_at"`
}

// MaxSplit caps HotKey.Split.
const MaxSplit = 64

// DynamicRule is a dynamic rule as the store keeps it (JSON in
// DynamicRulesKey): the rule, when it was first written, and, once promoted,
// the version it replaced. Its JSON carries "format": DynamicFormat; one
// without is format 1, and is read too (see json.go).
type DynamicRule struct {
	Rule
	// Created is the writer's time of the rule's first write (later writes
	// of the same id keep it); zero for a writer without a clock.
	Created time.Time `json:"created,omitzero"`
	// Previous is the rule as it was before Promote: RollbackRule restores
	// it. Writes of the same id while promoted update Previous and keep the
	// promotion.
	Previous *Rule `json:"prev,omitempty"`
	// RolledBack says an operator undid the rule's promotion: a
	// PromotionPolicy does not promote it again.
	RolledBack bool `json:"rolled_back,omitempty"`
}

// Promoted reports whether the rule was switched to enforce by Promote (and
// can be rolled back).
func (d *DynamicRule) Promoted() bool { return d.Previous != nil }

// Expired reports whether the rule has lapsed at now. A zero now (no clock)
// expires nothing.
func (d *DynamicRule) Expired(now time.Time) bool {
	return !now.IsZero() && !now.Before(d.ExpiresAt)
}

// CheckDynamic validates a dynamic rule before a store writes it (rules/store
// Store.PutDynamic): it must be valid, expire after now (ErrNoExpiry) and at
// most MaxDynamicTTL after it (ErrExpiryTooFar).
func CheckDynamic(r *Rule, now time.Time) error {
	if err := r.Validate(); err != nil {
		return err
	}
	if r.Origin == "" {
		return fmt.Errorf("%w %q: a dynamic rule needs an origin (e.g. detector/heavy-hitter, operator/alice)", ErrInvalidRule, r.ID)
	}
	if r.ExpiresAt.IsZero() {
		return fmt.Errorf("%w: rule %q has none", ErrNoExpiry, r.ID)
	}
	if !now.IsZero() && !r.ExpiresAt.After(now) {
		return fmt.Errorf("%w: rule %q expires at %s, now is %s", ErrNoExpiry, r.ID,
			r.ExpiresAt.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	if !now.IsZero() && r.ExpiresAt.Sub(now) > MaxDynamicTTL {
		return fmt.Errorf("%w: rule %q expires at %s, %s from now", ErrExpiryTooFar, r.ID,
			r.ExpiresAt.UTC().Format(time.RFC3339), r.ExpiresAt.Sub(now).Round(time.Second))
	}
	if len(r.Replaces) > 0 {
		return fmt.Errorf("%w %q: a dynamic rule cannot replace rules: it may only add a limit, never loosen one", ErrInvalidRule, r.ID)
	}
	return nil
}

// PromotionPolicy decides which shadow dynamic rules have earned enforce
// mode, from what the rules did in shadow: the caller supplies each rule's
// shadow statistics (from decision records: the analytics stage, or the
// enforcer's sluice_enforcer_decisions_total), and Store.Promote acts on the
// verdicts. Zero fields take the defaults given; DefaultPromotionPolicy
// returns them. It does no I/O.
type PromotionPolicy struct {
	// MinShadow is how long a rule must have run in shadow (since
	// DynamicRule.Created) before promotion. Default 10 min.
	MinShadow time.Duration
	// Origins are the origins promoted automatically: an entry ending in
	// "/" matches every origin it prefixes ("detector/" matches
	// "detector/heavy-hitter"), another one exactly. Operators' rules
	// ("operator/...") are theirs to promote. Default (nil) ["detector/"];
	// an empty, non-nil list takes every origin.
	Origins []string
	// MinMatched is the fewest requests the rule must have matched in
	// shadow: less is too little evidence. Default 100.
	MinMatched int64
	// MinWouldDeny and MaxWouldDeny bound the share of matched requests the
	// rule would have denied. Below the minimum, enforcing changes nothing
	// (the abuse stopped); above the maximum, the rule would deny nearly
	// everything it matches, a sign that its scope is too broad (a shared
	// NAT, a large ASN) or its limit too low: a person decides. Defaults
	// 0.01 and 0.95.
	MinWouldDeny, MaxWouldDeny float64
	// MinRemaining is the least time left before the rule expires for a
	// promotion to be worth it. Default 1 min.
	MinRemaining time.Duration
}

// DefaultPromotionPolicy returns the policy with every default filled in.
func DefaultPromotionPolicy() PromotionPolicy {
	return PromotionPolicy{
		MinShadow: 10 * time.Minute, Origins: []string{"detector/"}, MinMatched: 100,
		MinWouldDeny: 0.01, MaxWouldDeny: 0.95, MinRemaining: time.Minute,
	}
}

func (p PromotionPolicy) withDefaults() PromotionPolicy {
	d := DefaultPromotionPolicy()
	if p.MinShadow == 0 {
		p.MinShadow = d.MinShadow
	}
	if p.Origins == nil {
		p.Origins = d.Origins
	}
	if p.MinMatched == 0 {
		p.MinMatched = d.MinMatched
	}
	if p.MinWouldDeny == 0 {
		p.MinWouldDeny = d.MinWouldDeny
	}
	if p.MaxWouldDeny == 0 {
		p.MaxWouldDeny = d.MaxWouldDeny
	}
	if p.MinRemaining == 0 {
		p.MinRemaining = d.MinRemaining
	}
	return p
}

// ShadowStats is what a dynamic rule did in shadow mode: requests it
// matched and of those, how many it would have denied (shadow-denied).
type ShadowStats struct {
	Matched, WouldDeny int64
}

// Candidate is one dynamic rule and its shadow statistics.
type Candidate struct {
	Rule  *DynamicRule
	Stats ShadowStats
}

// Verdict is the policy's answer for one candidate: promote or not, and why.
type Verdict struct {
	ID      string
	Promote bool
	Reason  string
}

// Decide returns a verdict for every candidate, in order, at time now. A
// rule is promoted when it is in shadow mode, not expired, has never been
// rolled back, comes from one of Origins, has run in shadow for MinShadow,
// matched at least MinMatched requests, would have denied a share of them
// within [MinWouldDeny, MaxWouldDeny], and has at least MinRemaining to run.
func (p PromotionPolicy) Decide(now time.Time, cs []Candidate) []Verdict {
	p = p.withDefaults()
	vs := make([]Verdict, len(cs))
	for i, c := range cs {
		d := c.Rule
		vs[i] = Verdict{ID: d.ID}
		no := func(format string, a ...any) { vs[i].Reason = fmt.Sprintf(format, a...) }
		share := 0.0
		if c.Stats.Matched > 0 {
			share = float64(c.Stats.WouldDeny) / float64(c.Stats.Matched)
		}
		switch {
		case d.Mode != Shadow:
			no("already %s", d.Mode)
		case d.RolledBack:
			no("its promotion was rolled back: promote it by hand")
		case !p.origin(d.Origin):
			no("origin %q is not promoted automatically", d.Origin)
		case d.Expired(now):
			no("expired")
		case d.ExpiresAt.Sub(now) < p.MinRemaining:
			no("expires in %s, under %s", d.ExpiresAt.Sub(now).Round(time.Second), p.MinRemaining)
		case d.Created.IsZero() || now.Sub(d.Created) < p.MinShadow:
			no("in shadow for %s, under %s", now.Sub(d.Created).Round(time.Second), p.MinShadow)
		case c.Stats.Matched < p.MinMatched:
			no("matched %d requests, under %d", c.Stats.Matched, p.MinMatched)
		case share < p.MinWouldDeny:
			no("would deny %.1f%% of its requests, under %.1f%%: enforcing changes nothing", 100*share, 100*p.MinWouldDeny)
		case share > p.MaxWouldDeny:
			no("would deny %.1f%% of its requests, over %.1f%%: too broad or too low for automatic promotion", 100*share, 100*p.MaxWouldDeny)
		default:
			vs[i].Promote = true
			vs[i].Reason = fmt.Sprintf("in shadow for %s, would deny %.1f%% of %d requests",
				now.Sub(d.Created).Round(time.Second), 100*share, c.Stats.Matched)
		}
	}
	return vs
}

func (p *PromotionPolicy) origin(o string) bool {
	if len(p.Origins) == 0 {
		return true
	}
	for _, x := range p.Origins {
		if x == o || (strings.HasSuffix(x, "/") && strings.HasPrefix(o, x)) {
			return true
		}
	}
	return false
}

// Identity is what the key store knows of an API key: the account that owns
// it, the account's organisation, and its tier. Rules on account, org and
// tier then apply to every request made with the key, so that limits for key
// ≤ account ≤ organisation are checked together, in one decision: a tenant
// with 10 000 keys still has one account limit.
type Identity struct {
	Account string `json:"account"`
	Org     string `json:"org,omitempty"`
	Tier    string `json:"tier,omitempty"`
}

// Fill sets d's account, org and tier from id where the request gave none.
func (id *Identity) Fill(d *Descriptors) {
	if d[KeyAccount] == "" {
		d[KeyAccount] = id.Account
	}
	if d[KeyOrg] == "" {
		d[KeyOrg] = id.Org
	}
	if d[KeyTier] == "" {
		d[KeyTier] = id.Tier
	}
}
