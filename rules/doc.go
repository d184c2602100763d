// Package rules is sluice's rule model: rules that match request descriptors
// (well-known and custom keys; exact values, lists, prefixes, wildcards,
// networks, route templates, exclusions) to limits (token bucket,
// sliding-window counter, fixed or calendar window, concurrency, or a block),
// with overrides (Replaces), tiers from a key store (API key → account →
// organisation and tier), their strict YAML format and envoyproxy/ratelimit's
// (ParseEnvoy, ConvertEnvoy), the index that matches a request against
// thousands of rules without allocating, the entity tags that key Redis
// buckets and shares, versioned rule sets in each region's Redis (SetStore)
// followed by enforcers (Watcher), and the store through which the pipeline
// and operators hand enforcers dynamic rules (with a TTL, a cap and a kill
// switch), shares and hot keys (Store). See docs/rules.md.
//
// # Usage
//
//	set, err := rules.Load("rules.yaml") // sluice's format or an envoyproxy/ratelimit config;
//	if err != nil { ... }                // errors name file:line:column and the fix
//	var d rules.Descriptors
//	d[rules.KeyClientIP] = rules.NormalizeIP("::ffff:192.0.2.7", 64) // "192.0.2.7"
//	d.SetCustom("generic_key", "slow")
//	for _, r := range rules.Replaced(set.Match(&d, nil)) {
//		fmt.Println(r.ID, rules.EntityTag(r, &d))
//	}
//
//	// Push a new version to a region, and follow it in an enforcer.
//	_, err = store.NewSetStore(rdb).Push(ctx, "rules.yaml", data, 0)
//	w, err := store.NewWatcher(store.WatchOptions{Redis: rdb, Instance: "pod-7f9c2", Apply: limiter.SetRules})
//	go w.Run(ctx)
//
// # Metrics
//
// A Watcher registers, on WatchOptions.Registerer:
//
//	sluice_rules_reloads_total{source,result}  rule sets read: applied, invalid, stale, duplicate, conflict, error
//	sluice_rules_version                       the version in force
package rules
