// Package rules is sluice's rule model: rules that match request descriptors
// to limits (token bucket, sliding-window counter, fixed or calendar window,
// concurrency), their strict YAML format, matching, the entity tags
// that key Redis buckets and shares, and the Redis store through which the
// pipeline hands enforcers dynamic rules and per-region shares.
//
// # Usage
//
//	set, err := rules.Load("rules.yaml") // errors name file:line:column and the fix
//	if err != nil { ... }
//	var d rules.Descriptors
//	d[rules.KeyClientIP] = rules.NormalizeIP("::ffff:192.0.2.7", 64) // "192.0.2.7"
//	for _, r := range set.Match(&d, nil) {
//		fmt.Println(r.ID, rules.EntityTag(r, &d))
//	}
package rules
