// Package store is sluice's control plane in each region's Redis: the
// versioned static rule set with its history and rollback (SetStore, which
// `sluice rules push` writes), dynamic rules with their cap, expiry, shadow
// and promotion (Store.PutDynamic, Promote, RollbackRule, and the Promoter
// that applies a rules.PromotionPolicy to a Tally of shadow evidence), the
// kill switch, per-region shares and hot keys, the API key store (RedisKeys,
// cached by KeyCache), and the Watcher that follows a rule file or the
// rule-set store and applies each valid version whole.
//
// The model these store (rules.Rule, rules.DynamicRule, rules.Share,
// rules.HotKey, rules.Identity) and its validation are package rules's,
// which does no I/O. keys.go lists every Redis key sluice writes, with its
// TTL.
package store
