package rules

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
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

// Redis keys of the control plane in each region's Redis. Both are hashes and
// both carry a TTL that every write renews.
const (
	DynamicRulesKey = "sluice:dynrules" // field: rule id; value: JSON Rule
	SharesKey       = "sluice:shares"   // field: rule id "|" entity tag; value: JSON Share
	HotKeysKey      = "sluice:hotkeys"  // field: rule id "|" entity tag; value: JSON HotKey
	controlTTL      = 24 * time.Hour
)

// Store reads and writes dynamic rules and shares in one region's Redis. It
// is safe for concurrent use.
type Store struct {
	rdb redis.UniversalClient
}

// NewStore returns a Store over rdb.
func NewStore(rdb redis.UniversalClient) *Store { return &Store{rdb: rdb} }

// PutRules writes dynamic rules; each must be valid and have an ExpiresAt.
func (s *Store) PutRules(ctx context.Context, rs []Rule) error {
	if len(rs) == 0 {
		return nil
	}
	args := make([]any, 0, 2*len(rs))
	for i := range rs {
		if err := rs[i].Validate(); err != nil {
			return err
		}
		b, err := json.Marshal(&rs[i])
		if err != nil {
			return fmt.Errorf("encoding rule %q: %w", rs[i].ID, err)
		}
		args = append(args, rs[i].ID, b)
	}
	return s.hset(ctx, DynamicRulesKey, args)
}

// PutShares writes shares. Only the region's own shares belong in a region's
// Redis.
func (s *Store) PutShares(ctx context.Context, ss []Share) error {
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
func (s *Store) PutHotKeys(ctx context.Context, hs []HotKey) error {
	if len(hs) == 0 {
		return nil
	}
	args := make([]any, 0, 2*len(hs))
	for i := range hs {
		if hs[i].Split < 0 || hs[i].Split > MaxSplit || len(hs[i].Key) != EntityTagLen || hs[i].ExpiresAt.IsZero() {
			return fmt.Errorf("hot key %s|%s: want a %d-character entity tag, a split of 0 to %d and an expiry", hs[i].RuleID, hs[i].Key, EntityTagLen, MaxSplit)
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
	Rules  []*Rule
	Shares map[string]Share  // by rule id "|" entity tag
	Hot    map[string]HotKey // by rule id "|" entity tag
	Bad    int
}

// Load reads all dynamic rules, shares and hot-key marks. Rules and marks
// that expired at now are left out.
func (s *Store) Load(ctx context.Context, now time.Time) (*Control, error) {
	var rulesCmd, sharesCmd, hotCmd *redis.MapStringStringCmd
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		rulesCmd = p.HGetAll(ctx, DynamicRulesKey)
		sharesCmd = p.HGetAll(ctx, SharesKey)
		hotCmd = p.HGetAll(ctx, HotKeysKey)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("loading dynamic rules and shares: %w", err)
	}
	c := &Control{Shares: map[string]Share{}, Hot: map[string]HotKey{}}
	for id, v := range rulesCmd.Val() {
		r := new(Rule)
		if err := json.Unmarshal([]byte(v), r); err != nil || r.ID != id || r.Validate() != nil || r.Origin == "" {
			c.Bad++
			continue
		}
		if !r.ExpiresAt.IsZero() && !now.Before(r.ExpiresAt) {
			continue
		}
		c.Rules = append(c.Rules, r)
	}
	for f, v := range sharesCmd.Val() {
		var sh Share
		if err := json.Unmarshal([]byte(v), &sh); err != nil || !strings.HasPrefix(f, sh.RuleID+"|") || sh.Fraction < 0 || sh.Fraction > 1 {
			c.Bad++
			continue
		}
		c.Shares[f] = sh
	}
	for f, v := range hotCmd.Val() {
		var h HotKey
		if err := json.Unmarshal([]byte(v), &h); err != nil || f != h.RuleID+"|"+h.Key || h.Split < 0 || h.Split > MaxSplit {
			c.Bad++
			continue
		}
		if now.Before(h.ExpiresAt) {
			c.Hot[f] = h
		}
	}
	sortRules(c.Rules)
	return c, nil
}
