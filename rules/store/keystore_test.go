package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/rules"
)

type fakeKeys struct {
	calls int
	ids   map[string]rules.Identity
	err   error
}

func (f *fakeKeys) Lookup(_ context.Context, k string) (rules.Identity, bool, error) {
	f.calls++
	if f.err != nil {
		return rules.Identity{}, false, f.err
	}
	id, ok := f.ids[k]
	return id, ok, nil
}

func TestKeyCache(t *testing.T) {
	f := &fakeKeys{ids: map[string]rules.Identity{"k1": {Account: "a", Org: "o", Tier: "pro"}}}
	c := NewKeyCache(f, 10, time.Minute)
	now := time.Unix(1_700_000_000, 0)
	c.now = func() time.Time { return now }
	ctx := context.Background()
	for range 3 {
		if id, ok, err := c.Lookup(ctx, "k1"); err != nil || !ok || id.Tier != "pro" {
			t.Fatalf("k1: %v %v %v", id, ok, err)
		}
		if _, ok, err := c.Lookup(ctx, "unknown"); err != nil || ok {
			t.Fatalf("unknown: %v %v", ok, err)
		}
	}
	if f.calls != 2 {
		t.Errorf("%d store lookups for 2 keys asked 3 times each, want 2: known and unknown keys are both cached", f.calls)
	}
	if a := testing.AllocsPerRun(100, func() { c.Cached("k1") }); a != 0 {
		t.Errorf("a cache hit allocates %v times", a)
	}
	now = now.Add(time.Minute)
	f.ids["k1"] = rules.Identity{Account: "a", Tier: "enterprise"}
	if id, _, _ := c.Lookup(ctx, "k1"); id.Tier != "enterprise" || f.calls != 3 {
		t.Errorf("after the TTL: tier %q after %d lookups, want the store's new tier", id.Tier, f.calls)
	}
	f.err = errors.New("down")
	now = now.Add(time.Minute)
	if _, _, err := c.Lookup(ctx, "k1"); err == nil {
		t.Error("a store error was hidden")
	}
	f.err = nil
	if _, ok, err := c.Lookup(ctx, "k1"); err != nil || !ok {
		t.Errorf("errors must not be cached: %v %v", ok, err)
	}
	var d rules.Descriptors
	d[rules.KeyTier] = "given"
	(&rules.Identity{Account: "a", Org: "o", Tier: "pro"}).Fill(&d)
	if d[rules.KeyAccount] != "a" || d[rules.KeyOrg] != "o" || d[rules.KeyTier] != "given" {
		t.Errorf("Fill: %q %q %q; the request's own tier wins", d[rules.KeyAccount], d[rules.KeyOrg], d[rules.KeyTier])
	}
}
