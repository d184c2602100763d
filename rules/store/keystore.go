package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/redis/go-redis/v9"
	"github.com/sluice-rl/sluice/rules"
)

// KeyStore resolves an API key to its Identity. ok is false for a key it
// does not know. Implementations must be safe for concurrent use.
type KeyStore interface {
	Lookup(ctx context.Context, apiKey string) (id rules.Identity, ok bool, err error)
}

// lookupLua reads a key's account and the account's record in one round
// trip: KEYS = keys hash, accounts hash; ARGV[1] = API key.
const lookupLua = `
local a = redis.call('HGET', KEYS[1], ARGV[1])
if not a then return false end
return {a, redis.call('HGET', KEYS[2], a) or ''}`

// RedisKeys is the KeyStore in a region's Redis: API key → account in one
// hash, account → organisation and tier in another, read together by one
// script call. Wrap it in a KeyCache on the request path.
type RedisKeys struct {
	rdb    redis.UniversalClient
	lookup *redis.Script
}

// NewRedisKeys returns the key store in rdb.
func NewRedisKeys(rdb redis.UniversalClient) *RedisKeys {
	return &RedisKeys{rdb: rdb, lookup: redis.NewScript(lookupLua)}
}

// Lookup implements KeyStore.
func (k *RedisKeys) Lookup(ctx context.Context, apiKey string) (rules.Identity, bool, error) {
	v, err := k.lookup.Run(ctx, k.rdb, []string{KeysKey, AccountsKey}, apiKey).StringSlice()
	if errors.Is(err, redis.Nil) {
		return rules.Identity{}, false, nil
	}
	if err != nil {
		return rules.Identity{}, false, fmt.Errorf("key store: %w", err)
	}
	if len(v) != 2 {
		return rules.Identity{}, false, fmt.Errorf("key store: unexpected reply %q", v)
	}
	id := rules.Identity{Account: v[0]}
	if v[1] != "" {
		if err := json.Unmarshal([]byte(v[1]), &id); err != nil {
			return rules.Identity{}, false, fmt.Errorf("key store: account %q: %w", v[0], err)
		}
		id.Account = v[0]
	}
	return id, true, nil
}

// PutKey files apiKey under account.
func (k *RedisKeys) PutKey(ctx context.Context, apiKey, account string) error {
	if apiKey == "" || account == "" {
		return errors.New("key store: want an API key and an account")
	}
	return k.rdb.HSet(ctx, KeysKey, apiKey, account).Err()
}

// PutAccount sets an account's organisation and tier.
func (k *RedisKeys) PutAccount(ctx context.Context, account, org, tier string) error {
	if account == "" {
		return errors.New("key store: want an account")
	}
	b, _ := json.Marshal(rules.Identity{Org: org, Tier: tier}) // plain strings: cannot fail
	return k.rdb.HSet(ctx, AccountsKey, account, b).Err()
}

// KeyCache keeps a KeyStore's answers for TTL, both the keys it knows and
// those it does not (so an unknown key costs one lookup per TTL, not one per
// request), in a least-recently-used cache of Size entries. A hit allocates
// nothing. Errors are not cached. Changes in the store reach enforcers
// within TTL.
type KeyCache struct {
	store KeyStore
	ttl   time.Duration
	now   func() time.Time
	cache *lru.Cache[string, cachedIdentity]
}

type cachedIdentity struct {
	id      rules.Identity
	ok      bool
	expires time.Time
}

// NewKeyCache caches store's answers: size entries (default 100 000) for ttl
// (default 1 minute) each. Entries lapse when read after their TTL; no
// goroutine sweeps them (the LRU bound holds the memory).
func NewKeyCache(store KeyStore, size int, ttl time.Duration) *KeyCache {
	if size <= 0 {
		size = 100_000
	}
	if ttl <= 0 {
		ttl = time.Minute
	}
	c, _ := lru.New[string, cachedIdentity](size) // errors only for size <= 0
	return &KeyCache{store: store, ttl: ttl, now: time.Now, cache: c}
}

// Cached returns the cached answer for apiKey: hit is false when there is
// none (or it lapsed), and then only Lookup can tell.
func (c *KeyCache) Cached(apiKey string) (id rules.Identity, ok, hit bool) {
	if v, found := c.cache.Get(apiKey); found && c.now().Before(v.expires) {
		return v.id, v.ok, true
	}
	return rules.Identity{}, false, false
}

// Lookup implements KeyStore.
func (c *KeyCache) Lookup(ctx context.Context, apiKey string) (rules.Identity, bool, error) {
	if id, ok, hit := c.Cached(apiKey); hit {
		return id, ok, nil
	}
	now := c.now()
	id, ok, err := c.store.Lookup(ctx, apiKey)
	if err != nil {
		return rules.Identity{}, false, err
	}
	c.cache.Add(apiKey, cachedIdentity{id, ok, now.Add(c.ttl)})
	return id, ok, nil
}
