package storetest

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/rules/store"
)

// Account is a key-store account: its organisation and tier.
type Account struct{ Org, Tier string }

// PutKeys files API keys under accounts (key → account) and the accounts'
// organisations and tiers in rdb's key store, as store.RedisKeys does. It
// fails the test on a Redis error.
func PutKeys(t testing.TB, rdb redis.UniversalClient, keys map[string]string, accounts map[string]Account) {
	t.Helper()
	ks := store.NewRedisKeys(rdb)
	ctx := context.Background()
	for k, a := range keys {
		if err := ks.PutKey(ctx, k, a); err != nil {
			t.Fatalf("put key: %v", err)
		}
	}
	for a, v := range accounts {
		if err := ks.PutAccount(ctx, a, v.Org, v.Tier); err != nil {
			t.Fatalf("put account: %v", err)
		}
	}
}

// KeyCache returns the key store in rdb behind a cache with the defaults,
// for enforcer.Options.Keys.
func KeyCache(rdb redis.UniversalClient) *store.KeyCache {
	return store.NewKeyCache(store.NewRedisKeys(rdb), 0, 0)
}
