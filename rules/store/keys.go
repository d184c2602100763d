package store

import "github.com/sluice-rl/sluice/rules"

// Every Redis key sluice writes, with its TTL. Values that come from clients
// never appear in a key as they are: an entity is its tag (rules.EntityTag,
// a hash of the rule and the matched values, or of an override), so that no
// input can move a key to another Cluster slot, collide with another rule's
// key, or grow a key without bound.
//
// Per request (package enforcer; decide.lua, refund.lua, merge.lua, and
// charge.lua, which charges the local fallback's debts), all of
// one entity's keys in one slot through the hash tag {<tag>}; slack is 60 s
// with the caller's clock and 1 s with Redis TIME:
//
//	sl:{<tag>}:<rule>:0                     token bucket: "units ms period"; TTL: a refill from empty + slack
//	sl:{<tag>}:<rule>:1                     sliding window: two windows' counts; TTL: 2 periods + slack
//	sl:{<tag>}:<rule>:2:<start ms>          fixed window: count; TTL: window end + 60 s
//	sl:{<tag>}:override:2:<start ms>        a request's limit override (Envoy's descriptor limit):
//	                                        the same, keyed by entity and window, not by the limit
//	sl:{<tag>}:<rule>:2:<start ms>:g        G-Counter window: hash region → count;
//	                                        TTL: window end + 60 s (merge.lua only raises it)
//	sl:{<tag>}:<rule>:3                     concurrency: sorted set of leases by expiry;
//	                                        TTL: the lease period + slack
//	... :s<n>                               a hot key's split sub-key n, same TTL as its key
//
// <alg> is the rule's algorithm number (rules.Algorithm: 0 token bucket,
// 1 sliding window, 2 fixed window, 3 concurrency): it is part of stored
// keys, so those numbers never change.
//
// Control plane (this package), in each region's Redis:
//
//	sluice:dynrules                         DynamicRulesKey: hash rule id → JSON dynamic rule;
//	                                        TTL rules.MaxDynamicTTL (24 h), renewed by every write
//	sluice:dynrules:kill                    DynamicKillKey: the kill switch; no TTL (until turned off)
//	sluice:shares                           SharesKey: hash rule|tag → JSON share; TTL 24 h, renewed
//	sluice:hotkeys                          HotKeysKey: hash rule|tag → JSON hot key; TTL 24 h, renewed
//	sluice:adaptive                         AdaptiveKey: hash instance → "factor unix-ms"; TTL 10 min, renewed
//	sluice:instances                        InstancesKey: sorted set instance → expiry (Redis ms), the
//	                                        live enforcers; TTL the heartbeat's (5 s), renewed
//	sluice:applied                          AppliedKey: the applier's mark; no TTL
//	sluice:quotas-applied                   QuotasAppliedKey: the quota applier's mark; no TTL
//	sluice:{ruleset}                        RuleSetKey: the static rule set in force; no TTL
//	sluice:{ruleset}:history                RuleSetHistoryKey: the last DefaultHistory versions; no TTL
//	sluice:{ruleset}:enforcers              RuleSetEnforcersKey: what each enforcer holds; no TTL,
//	                                        entries older than EnforcerForget deleted
//	sluice:{ruleset}:notify                 RuleSetChannel: a Pub/Sub channel, not a key
//	{sluice:ks}:keys                        KeysKey: hash API key → account; no TTL (operators' data)
//	{sluice:ks}:accounts                    AccountsKey: hash account → JSON {org, tier}; no TTL
//
// The rule-set keys and the key store have no TTL on purpose: they are the
// operators' data, a few kilobytes a region, and a set that expired would
// leave new enforcers with none.
const (
	// BucketKeyPrefix starts every per-request key: "sl:{" <tag> "}:".
	BucketKeyPrefix = "sl:{"

	DynamicRulesKey = "sluice:dynrules"      // field: rule id; value: JSON DynamicRule
	DynamicKillKey  = "sluice:dynrules:kill" // when it exists, no dynamic rule is loaded; value: why
	SharesKey       = "sluice:shares"        // field: rule id "|" entity tag; value: JSON Share
	HotKeysKey      = "sluice:hotkeys"       // field: rule id "|" entity tag; value: JSON HotKey
	// controlTTL is the hashes' TTL: rules.MaxDynamicTTL, the longest a
	// dynamic rule may live from its write.
	controlTTL = rules.MaxDynamicTTL

	// AppliedKey marks a region's Redis as holding what its applier applied
	// (pipeline.Applier): an applier that finds it gone, because the Redis
	// restarted empty, reads the output topic again from its start.
	AppliedKey = "sluice:applied"
	// QuotasAppliedKey is the same mark for the region's quota applier
	// (pipeline/gcounter.QuotaApplier): gone, it reads the quota topic
	// again from its start.
	QuotasAppliedKey = "sluice:quotas-applied"

	// Keys and channel of the versioned static rule set. They share the
	// hash tag {ruleset}, so that one script updates them together on a
	// Cluster.
	// RuleSetKey is a hash holding the set in force: version (decimal),
	// yaml (the file's bytes), sha (hex SHA-256 of yaml), at (push time, Unix
	// ms, Redis's clock), by (the pusher) and from (for a rollback, the
	// version whose content it restores; else 0).
	RuleSetKey = "sluice:{ruleset}"
	// RuleSetHistoryKey is a hash holding the last versions (the current one
	// included): field "<v>" is version v's YAML, and "<v>:sha", "<v>:at",
	// "<v>:by", "<v>:from" its other fields.
	RuleSetHistoryKey = "sluice:{ruleset}:history"
	// RuleSetChannel carries a PUBLISH of the new version (decimal) on every
	// push and rollback.
	RuleSetChannel = "sluice:{ruleset}:notify"
	// RuleSetEnforcersKey is a hash of what each enforcer following the
	// store holds: field the instance name (WatchOptions.Instance), value
	// "<version> <sha> <at>", at in Unix ms of Redis's clock, rewritten at
	// every poll. Push reads it so that versions keep growing even after
	// Redis lost its data; `sluice rules list` shows it.
	RuleSetEnforcersKey = "sluice:{ruleset}:enforcers"

	// Keys of the key store, in one Cluster slot (the hash tag).
	KeysKey     = "{sluice:ks}:keys"     // hash: API key → account
	AccountsKey = "{sluice:ks}:accounts" // hash: account → JSON {org, tier}
)
