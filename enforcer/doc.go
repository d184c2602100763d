// Package enforcer decides rate-limited requests: the fast loop of sluice.
//
// A Limiter matches a request's descriptors against a rule set (static rules
// plus dynamic rules from the detector) and decides every matching rule with
// one Redis script call (tokenbucket.lua): each rule is a token bucket with
// lazy refill in exact integer units; all are checked, and only if every
// enforced rule allows are they all committed. A deny consumes nothing and
// names the rule, its remaining tokens and the exact wait. Shadow-mode rules
// are counted but never deny. When Redis fails, each rule's failure mode
// decides: fail-open (the default) or fail-closed.
//
// Every decision is handed to a Sink (pipeline.Producer logs it to Kafka)
// without waiting.
//
// # Usage
//
//	set, err := rules.Load("rules.yaml")
//	if err != nil { ... }
//	rdb := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{"127.0.0.1:6379"}})
//	lim, err := enforcer.New(rdb, set, enforcer.Options{Region: "eu-west", Regions: 5})
//	if err != nil { ... }
//	var req enforcer.Request
//	req.Descriptors[rules.KeyAPIKey] = "k-123"
//	d, err := lim.Check(ctx, &req)
//	if !d.Outcome.Allow() {
//		w.Header().Set("Retry-After", enforcer.FormatRetryAfter(d.RetryAfter))
//		w.WriteHeader(http.StatusTooManyRequests)
//	}
//
// Metrics, on Options.Registerer:
//
//	sluice_enforcer_decisions_total{outcome}         decisions by outcome
//	sluice_enforcer_redis_errors_total               script calls that failed
//	sluice_enforcer_control_refreshes_total{result}  loads of dynamic rules and shares
package enforcer
