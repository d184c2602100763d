package store

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
	"github.com/sluice-rl/sluice/rules"
)

// Errors of dynamic-rule writes.
var (
	// ErrCapReached: the write would have made more dynamic rules active than
	// the store's cap (DynamicCap); the rules beyond it were not written.
	ErrCapReached = errors.New("dynamic rule cap reached")
	// ErrRuleNotFound: no dynamic rule has that id.
	ErrRuleNotFound = errors.New("no dynamic rule with that id")
	// ErrNotShadow: only a shadow rule can be promoted to enforce.
	ErrNotShadow = errors.New("the dynamic rule is not in shadow mode")
	// ErrNotPromoted: the rule has no earlier version to restore.
	ErrNotPromoted = errors.New("the dynamic rule has not been promoted: nothing to roll back")
)

func decodeDynamic(id, v string) (*rules.DynamicRule, error) {
	d := new(rules.DynamicRule)
	if err := json.Unmarshal([]byte(v), d); err != nil {
		return nil, err
	}
	if d.ID != id || d.Origin == "" {
		return nil, fmt.Errorf("%w %q: stored under id %q, origin %q", rules.ErrInvalidRule, d.ID, id, d.Origin)
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return d, nil
}

func byCreated(a, b *rules.DynamicRule) int {
	if c := a.Created.Compare(b.Created); c != 0 {
		return c
	}
	return strings.Compare(a.ID, b.ID)
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
func (s *Store) PutDynamic(ctx context.Context, now time.Time, rs []rules.Rule) (int, error) {
	if len(rs) == 0 {
		return 0, nil
	}
	in := make([]rules.Rule, len(rs))
	for i := range rs {
		in[i] = rs[i]
		if err := rules.CheckDynamic(&in[i], now); err != nil {
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
		stored := make(map[string]*rules.DynamicRule, len(all))
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
			d := &rules.DynamicRule{Rule: *r, Created: now}
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

// DeleteDynamic deletes, in one atomic step, those of the dynamic rules ids
// whose Origin starts with origin, and returns how many it deleted. An id
// that is not stored, or is stored with another origin (another writer's
// rule), or does not decode, is left alone: a writer removes only its own
// rules (the CrowdSec bouncer gives "crowdsec/"). An origin of "" matches
// every rule that decodes.
func (s *Store) DeleteDynamic(ctx context.Context, origin string, ids ...string) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	var n int
	err := s.txn(ctx, func(tx *redis.Tx) error {
		n = 0
		vs, err := tx.HMGet(ctx, DynamicRulesKey, ids...).Result()
		if err != nil {
			return err
		}
		var del []string
		for i, v := range vs {
			str, ok := v.(string)
			if !ok {
				continue // not stored
			}
			if d, err := decodeDynamic(ids[i], str); err == nil && strings.HasPrefix(d.Origin, origin) {
				del = append(del, ids[i])
			}
		}
		if len(del) == 0 {
			return nil
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.HDel(ctx, DynamicRulesKey, del...)
			return nil
		})
		if err == nil {
			n = len(del)
		}
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("deleting dynamic rules: %w", err)
	}
	return n, nil
}

// Dynamic returns every stored dynamic rule that decodes, expired or not,
// by id.
func (s *Store) Dynamic(ctx context.Context) ([]*rules.DynamicRule, error) {
	all, err := s.rdb.HGetAll(ctx, DynamicRulesKey).Result()
	if err != nil {
		return nil, fmt.Errorf("reading dynamic rules: %w", err)
	}
	ds := make([]*rules.DynamicRule, 0, len(all))
	for id, v := range all {
		if d, err := decodeDynamic(id, v); err == nil {
			ds = append(ds, d)
		}
	}
	slices.SortFunc(ds, func(a, b *rules.DynamicRule) int { return strings.Compare(a.ID, b.ID) })
	return ds, nil
}

// update changes one stored dynamic rule atomically: fn gets it and returns
// its new state.
func (s *Store) update(ctx context.Context, id string, fn func(d *rules.DynamicRule) (*rules.DynamicRule, error)) (*rules.DynamicRule, error) {
	var out *rules.DynamicRule
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
func (s *Store) Promote(ctx context.Context, id string) (*rules.DynamicRule, error) {
	return s.update(ctx, id, func(d *rules.DynamicRule) (*rules.DynamicRule, error) {
		if d.Mode != rules.Shadow {
			return nil, fmt.Errorf("%w: %q is %s", ErrNotShadow, id, d.Mode)
		}
		prev := d.Rule
		n := &rules.DynamicRule{Rule: d.Rule, Created: d.Created, Previous: &prev}
		n.Mode = rules.Enforce
		n.Version++
		return n, nil
	})
}

// RollbackRule undoes a promotion in one atomic step: the rule goes back to
// the version Promote kept (shadow), with its Version one above the
// promoted one's, and is marked RolledBack so that a PromotionPolicy leaves
// it alone. Errors: ErrRuleNotFound, ErrNotPromoted.
func (s *Store) RollbackRule(ctx context.Context, id string) (*rules.DynamicRule, error) {
	return s.update(ctx, id, func(d *rules.DynamicRule) (*rules.DynamicRule, error) {
		if d.Previous == nil {
			return nil, fmt.Errorf("%w: %q", ErrNotPromoted, id)
		}
		n := &rules.DynamicRule{Rule: *d.Previous, Created: d.Created, RolledBack: true}
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
