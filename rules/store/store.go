package store

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluice-rl/sluice/rules"
)

// DefaultDynamicCap is how many dynamic rules may be active at once, unless
// DynamicCap says otherwise.
const DefaultDynamicCap = 1000

// Store reads and writes dynamic rules and shares in one region's Redis. Its
// zero value is not usable: build one with NewStore. It is safe for
// concurrent use. Enforcers call Load; the pipeline and operators write with
// PutDynamic (or PutRules) and PutShares.
type Store struct {
	rdb   redis.UniversalClient
	cap   int
	clock func() time.Time
}

// StoreOption configures a Store.
type StoreOption func(*Store)

// DynamicCap bounds the dynamic rules active at once (n >= 1): writes beyond
// it are refused (ErrCapReached) and Load keeps at most n. Default
// DefaultDynamicCap (1000).
func DynamicCap(n int) StoreOption { return func(s *Store) { s.cap = max(n, 1) } }

// StoreClock is the clock PutRules checks expiries against. Default none:
// PutRules is then the pipeline's, whose time is event time (a replay's is
// in the past), and it cannot tell an expired rule; see PutRules.
func StoreClock(now func() time.Time) StoreOption { return func(s *Store) { s.clock = now } }

// NewStore returns a Store over rdb.
func NewStore(rdb redis.UniversalClient, opts ...StoreOption) *Store {
	s := &Store{rdb: rdb, cap: DefaultDynamicCap}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Cap returns the store's cap on active dynamic rules.
func (s *Store) Cap() int { return s.cap }

// PutRules writes dynamic rules as PutDynamic does, at the time of the
// store's clock (StoreClock). Without a clock it checks expiries against
// none: a rule still needs an ExpiresAt, but one in the past (or more than
// MaxDynamicTTL ahead) is not refused, nothing is pruned, and the cap counts
// every stored rule, expired or not
// (they leave with the hash's 24 h TTL, or with a write that has a clock).
// Writers that know the time (event time in the pipeline) should call
// PutDynamic.
func (s *Store) PutRules(ctx context.Context, rs []rules.Rule) error {
	var now time.Time
	if s.clock != nil {
		now = s.clock()
	}
	_, err := s.PutDynamic(ctx, now, rs)
	return err
}

// Applied reports whether the region's Redis holds AppliedKey.
func (s *Store) Applied(ctx context.Context) (bool, error) {
	n, err := s.rdb.Exists(ctx, AppliedKey).Result()
	return n == 1, err
}

// MarkApplied sets AppliedKey.
func (s *Store) MarkApplied(ctx context.Context) error {
	return s.rdb.Set(ctx, AppliedKey, "1", 0).Err()
}

// PutShares writes shares. Only the region's own shares belong in a region's
// Redis.
func (s *Store) PutShares(ctx context.Context, ss []rules.Share) error {
	if len(ss) == 0 {
		return nil
	}
	args := make([]any, 0, 2*len(ss))
	for i := range ss {
		b, err := json.Marshal(&ss[i])
		if err != nil {
			return fmt.Errorf("encoding share: %w", err)
		}
		args = append(args, ss[i].RuleID+"|"+ss[i].Key, b)
	}
	return s.hset(ctx, SharesKey, args)
}

// PutHotKeys writes hot-key marks.
func (s *Store) PutHotKeys(ctx context.Context, hs []rules.HotKey) error {
	if len(hs) == 0 {
		return nil
	}
	args := make([]any, 0, 2*len(hs))
	for i := range hs {
		if hs[i].Split < 0 || hs[i].Split > rules.MaxSplit || len(hs[i].Key) != rules.EntityTagLen || hs[i].ExpiresAt.IsZero() {
			return fmt.Errorf("hot key %s|%s: want a %d-character entity tag, a split of 0 to %d and an expiry", hs[i].RuleID, hs[i].Key, rules.EntityTagLen, rules.MaxSplit)
		}
		b, err := json.Marshal(&hs[i])
		if err != nil {
			return fmt.Errorf("encoding hot key: %w", err)
		}
		args = append(args, hs[i].RuleID+"|"+hs[i].Key, b)
	}
	return s.hset(ctx, HotKeysKey, args)
}

func (s *Store) hset(ctx context.Context, key string, args []any) error {
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, key, args...)
		p.PExpire(ctx, key, controlTTL)
		return nil
	})
	if err != nil {
		return fmt.Errorf("writing %s: %w", key, err)
	}
	return nil
}

// Control is what an enforcer loads from its region's Redis: dynamic rules
// and shares. Entries that fail to decode are counted in Bad and skipped.
type Control struct {
	Rules  []*rules.Rule
	Shares map[string]rules.Share  // by rule id "|" entity tag
	Hot    map[string]rules.HotKey // by rule id "|" entity tag
	Bad    int
	// Killed says the kill switch (DynamicKillKey) is on: Rules is empty.
	Killed bool
	// OverCap counts the active dynamic rules left out because more than
	// the store's cap were stored (by a writer that bypassed PutDynamic).
	OverCap int
}

// Load reads all dynamic rules, shares and hot-key marks. Rules and marks
// that expired at now are left out. While the kill switch is on, no dynamic
// rule is loaded (Control.Killed). Of more active dynamic rules than the
// cap, the cap's worth created first (by DynamicRule.Created, then id) are
// kept and the rest counted in Control.OverCap: a flood of new rules cannot
// push out the established ones.
func (s *Store) Load(ctx context.Context, now time.Time) (*Control, error) {
	var rulesCmd, sharesCmd, hotCmd *redis.MapStringStringCmd
	var killCmd *redis.IntCmd
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		rulesCmd = p.HGetAll(ctx, DynamicRulesKey)
		sharesCmd = p.HGetAll(ctx, SharesKey)
		hotCmd = p.HGetAll(ctx, HotKeysKey)
		killCmd = p.Exists(ctx, DynamicKillKey)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("loading dynamic rules and shares: %w", err)
	}
	c := &Control{Shares: map[string]rules.Share{}, Hot: map[string]rules.HotKey{}, Killed: killCmd.Val() > 0}
	if !c.Killed {
		var active []*rules.DynamicRule
		for id, v := range rulesCmd.Val() {
			d, err := decodeDynamic(id, v)
			if err != nil {
				c.Bad++
				continue
			}
			if !d.Expired(now) {
				active = append(active, d)
			}
		}
		if len(active) > s.cap {
			slices.SortFunc(active, byCreated)
			c.OverCap = len(active) - s.cap
			active = active[:s.cap]
		}
		for _, d := range active {
			c.Rules = append(c.Rules, &d.Rule)
		}
	}
	for f, v := range sharesCmd.Val() {
		var sh rules.Share
		if err := json.Unmarshal([]byte(v), &sh); err != nil || !strings.HasPrefix(f, sh.RuleID+"|") || sh.Fraction < 0 || sh.Fraction > 1 {
			c.Bad++
			continue
		}
		c.Shares[f] = sh
	}
	for f, v := range hotCmd.Val() {
		var h rules.HotKey
		if err := json.Unmarshal([]byte(v), &h); err != nil || f != h.RuleID+"|"+h.Key || h.Split < 0 || h.Split > rules.MaxSplit {
			c.Bad++
			continue
		}
		if now.Before(h.ExpiresAt) {
			c.Hot[f] = h
		}
	}
	slices.SortFunc(c.Rules, func(a, b *rules.Rule) int { return strings.Compare(a.ID, b.ID) })
	return c, nil
}
