package rules

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	retry "github.com/cenkalti/backoff/v5"
	"github.com/redis/go-redis/v9"
)

// Errors of dynamic-rule writes.
var (
	// ErrCapReached: the write would have made more dynamic rules active than
	// the store's cap (DynamicCap); the rules beyond it were not written.
	ErrCapReached = errors.New("dynamic rule cap reached")
	// ErrNoExpiry: a dynamic rule has no ExpiresAt, or one not after now.
	// Every dynamic rule lapses on its own.
	ErrNoExpiry = errors.New("a dynamic rule needs an expiry after now")
	// ErrExpiryTooFar: a dynamic rule's ExpiresAt is more than MaxDynamicTTL
	// after now: the hash that holds it would expire first.
	ErrExpiryTooFar = errors.New("a dynamic rule lives at most 24h; make it a static rule for longer")
	// ErrRuleNotFound: no dynamic rule has that id.
	ErrRuleNotFound = errors.New("no dynamic rule with that id")
	// ErrNotShadow: only a shadow rule can be promoted to enforce.
	ErrNotShadow = errors.New("the dynamic rule is not in shadow mode")
	// ErrNotPromoted: the rule has no earlier version to restore.
	ErrNotPromoted = errors.New("the dynamic rule has not been promoted: nothing to roll back")
)

// DynamicRule is a dynamic rule as the store keeps it (JSON in
// DynamicRulesKey): the rule, when it was first written, and, once promoted,
// the version it replaced.
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

func decodeDynamic(id, v string) (*DynamicRule, error) {
	d := new(DynamicRule)
	if err := json.Unmarshal([]byte(v), d); err != nil {
		return nil, err
	}
	if d.ID != id || d.Origin == "" {
		return nil, fmt.Errorf("%w %q: stored under id %q, origin %q", ErrInvalidRule, d.ID, id, d.Origin)
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return d, nil
}

func byCreated(a, b *DynamicRule) int {
	if c := a.Created.Compare(b.Created); c != 0 {
		return c
	}
	return strings.Compare(a.ID, b.ID)
}

// checkDynamic validates a rule for PutDynamic.
func checkDynamic(r *Rule, now time.Time) error {
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

// watchRetries bounds the optimistic transactions' attempts: each retry
// follows a write by someone else to the same hash.
const watchRetries = 10

// txn runs fn in an optimistic transaction on DynamicRulesKey (WATCH, read,
// MULTI/EXEC), retried with backoff while another writer changes the hash
// between the read and the write.
func (s *Store) txn(ctx context.Context, fn func(tx *redis.Tx) error) error {
	_, err := retry.Retry(ctx, func() (struct{}, error) {
		err := s.rdb.Watch(ctx, fn, DynamicRulesKey)
		if errors.Is(err, redis.TxFailedErr) {
			return struct{}{}, err
		}
		if err != nil {
			return struct{}{}, retry.Permanent(err)
		}
		return struct{}{}, nil
	}, retry.WithBackOff(&retry.ExponentialBackOff{
		InitialInterval: 5 * time.Millisecond, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: 200 * time.Millisecond,
	}), retry.WithMaxTries(watchRetries))
	if errors.Is(err, redis.TxFailedErr) {
		return fmt.Errorf("writing dynamic rules: %d attempts raced other writers: %w", watchRetries, err)
	}
	return err
}

// PutDynamic writes dynamic rules, at time now (the writer's clock: event
// time in the pipeline), in one atomic step: it prunes the stored rules
// that expired at now, then writes each rule in order, an update of an
// active rule always and a new rule while fewer than the cap are active. It
// returns how many rules were written; when some were not, the error wraps
// ErrCapReached and names them.
//
// Every rule must be valid, have an Origin and an ExpiresAt after now
// (ErrNoExpiry) and at most MaxDynamicTTL after it (ErrExpiryTooFar: the
// hash expires MaxDynamicTTL after its last write), or nothing is written.
// A zero now checks no expiry against a clock and prunes nothing (see
// PutRules). A rewrite of a stored id keeps
// its Created time and its promotion (see DynamicRule).
func (s *Store) PutDynamic(ctx context.Context, now time.Time, rs []Rule) (int, error) {
	if len(rs) == 0 {
		return 0, nil
	}
	in := make([]Rule, len(rs))
	for i := range rs {
		in[i] = rs[i]
		if err := checkDynamic(&in[i], now); err != nil {
			return 0, err
		}
	}
	var written int
	var refused []string
	var active int
	err := s.txn(ctx, func(tx *redis.Tx) error {
		written, refused = 0, nil
		all, err := tx.HGetAll(ctx, DynamicRulesKey).Result()
		if err != nil {
			return err
		}
		stored := make(map[string]*DynamicRule, len(all))
		var expired []string
		for id, v := range all {
			d, err := decodeDynamic(id, v)
			if err != nil {
				continue // Load counts it as bad; it is not active
			}
			if d.Expired(now) {
				expired = append(expired, id)
				continue
			}
			stored[id] = d
		}
		active = len(stored)
		var args []any
		pending := map[string]bool{}
		for i := range in {
			r := &in[i]
			d := &DynamicRule{Rule: *r, Created: now}
			if old, ok := stored[r.ID]; ok {
				d.Created, d.RolledBack = old.Created, old.RolledBack
				if old.Promoted() { // keep the promotion; the new content is what a rollback restores
					d.Previous = r
					d.Mode = old.Mode
				}
			} else if !pending[r.ID] {
				if active >= s.cap {
					refused = append(refused, r.ID)
					continue
				}
				active++
			}
			pending[r.ID] = true
			b, err := json.Marshal(d)
			if err != nil {
				return retry.Permanent(fmt.Errorf("encoding rule %q: %w", r.ID, err))
			}
			args = append(args, r.ID, b)
			written++
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			if len(expired) > 0 {
				p.HDel(ctx, DynamicRulesKey, expired...)
			}
			if len(args) > 0 {
				p.HSet(ctx, DynamicRulesKey, args...)
				p.PExpire(ctx, DynamicRulesKey, controlTTL)
			}
			return nil
		})
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("writing dynamic rules: %w", err)
	}
	if len(refused) > 0 {
		return written, fmt.Errorf("%w: %d active, cap %d: %d of %d rules not written: %s",
			ErrCapReached, active, s.cap, len(refused), len(rs), strings.Join(refused, ", "))
	}
	return written, nil
}

// Dynamic returns every stored dynamic rule that decodes, expired or not,
// by id.
func (s *Store) Dynamic(ctx context.Context) ([]*DynamicRule, error) {
	all, err := s.rdb.HGetAll(ctx, DynamicRulesKey).Result()
	if err != nil {
		return nil, fmt.Errorf("reading dynamic rules: %w", err)
	}
	ds := make([]*DynamicRule, 0, len(all))
	for id, v := range all {
		if d, err := decodeDynamic(id, v); err == nil {
			ds = append(ds, d)
		}
	}
	slices.SortFunc(ds, func(a, b *DynamicRule) int { return strings.Compare(a.ID, b.ID) })
	return ds, nil
}

// update changes one stored dynamic rule atomically: fn gets it and returns
// its new state.
func (s *Store) update(ctx context.Context, id string, fn func(d *DynamicRule) (*DynamicRule, error)) (*DynamicRule, error) {
	var out *DynamicRule
	err := s.txn(ctx, func(tx *redis.Tx) error {
		v, err := tx.HGet(ctx, DynamicRulesKey, id).Result()
		if errors.Is(err, redis.Nil) {
			return retry.Permanent(fmt.Errorf("%w: %q", ErrRuleNotFound, id))
		}
		if err != nil {
			return err
		}
		d, err := decodeDynamic(id, v)
		if err != nil {
			return retry.Permanent(fmt.Errorf("stored dynamic rule %q: %w", id, err))
		}
		if out, err = fn(d); err != nil {
			return retry.Permanent(err)
		}
		b, err := json.Marshal(out)
		if err != nil {
			return retry.Permanent(err)
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.HSet(ctx, DynamicRulesKey, id, b)
			p.PExpire(ctx, DynamicRulesKey, controlTTL)
			return nil
		})
		return err
	})
	return out, err
}

// Promote switches a shadow dynamic rule to enforce, keeping its shadow
// version for RollbackRule, in one atomic step; its Version goes up by one.
// Errors: ErrRuleNotFound, ErrNotShadow.
func (s *Store) Promote(ctx context.Context, id string) (*DynamicRule, error) {
	return s.update(ctx, id, func(d *DynamicRule) (*DynamicRule, error) {
		if d.Mode != Shadow {
			return nil, fmt.Errorf("%w: %q is %s", ErrNotShadow, id, d.Mode)
		}
		prev := d.Rule
		n := &DynamicRule{Rule: d.Rule, Created: d.Created, Previous: &prev}
		n.Mode = Enforce
		n.Version++
		return n, nil
	})
}

// RollbackRule undoes a promotion in one atomic step: the rule goes back to
// the version Promote kept (shadow), with its Version one above the
// promoted one's, and is marked RolledBack so that a PromotionPolicy leaves
// it alone. Errors: ErrRuleNotFound, ErrNotPromoted.
func (s *Store) RollbackRule(ctx context.Context, id string) (*DynamicRule, error) {
	return s.update(ctx, id, func(d *DynamicRule) (*DynamicRule, error) {
		if d.Previous == nil {
			return nil, fmt.Errorf("%w: %q", ErrNotPromoted, id)
		}
		n := &DynamicRule{Rule: *d.Previous, Created: d.Created, RolledBack: true}
		n.Version = d.Version + 1
		return n, nil
	})
}

// SetKill turns the dynamic-rule kill switch on (with why, e.g. who and
// the reason) or off. While it is on, Load returns no dynamic rule
// (Control.Killed) on every enforcer at its next refresh; writes still
// succeed, so turning it off restores the rules that have not expired.
func (s *Store) SetKill(ctx context.Context, on bool, why string) error {
	var err error
	if on {
		if why == "" {
			why = "on"
		}
		err = s.rdb.Set(ctx, DynamicKillKey, why, 0).Err()
	} else {
		err = s.rdb.Del(ctx, DynamicKillKey).Err()
	}
	if err != nil {
		return fmt.Errorf("setting the dynamic-rule kill switch: %w", err)
	}
	return nil
}

// Killed reports whether the kill switch is on, and why.
func (s *Store) Killed(ctx context.Context) (bool, string, error) {
	v, err := s.rdb.Get(ctx, DynamicKillKey).Result()
	if errors.Is(err, redis.Nil) {
		return false, "", nil
	}
	if err != nil {
		return false, "", fmt.Errorf("reading the dynamic-rule kill switch: %w", err)
	}
	return true, v, nil
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
