// Package storetest writes the control plane's state (rules/store) for the
// tests of packages that may not import rules/store themselves. It is not
// in redistest, whose harness the tests of rules/store use.
package storetest

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

// PutShares writes shares to rdb as the aggregator's applier does
// (rules/store), for tests of packages that may not import the control plane
// themselves (enforcer/sidecar). It fails the test on a Redis error.
func PutShares(t testing.TB, rdb redis.UniversalClient, shares ...rules.Share) {
	t.Helper()
	if err := store.NewStore(rdb).PutShares(context.Background(), shares); err != nil {
		t.Fatalf("put shares: %v", err)
	}
}
