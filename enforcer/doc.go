// Package enforcer decides rate-limited requests: the fast loop of sluice.
//
// A Limiter matches a request's descriptors against a rule set (static rules
// plus dynamic rules from the detector) and decides every matching rule with
// one Redis script call per Cluster slot (decide.lua; one call on a single
// node), all sent in one round trip. Each rule is a token bucket (lazy
// refill in exact integer units), a sliding-window counter, a fixed or
// calendar window, or a concurrency limit with leases; all are checked, and
// only if every enforced rule allows are they committed. A deny consumes
// nothing (across slots, what was reserved is refunded by refund.lua) and
// names the rule, its remaining and the exact wait. Shadow-mode rules are
// counted but never deny. When Redis fails, each rule's failure mode
// decides: fail-open (the default) or fail-closed. A global rule is split
// across regions by shares, or, pinned (rules.Rule.Pinned), counted in its
// entity's home region (Options.Homes) and checked there in a call of its
// own, or, as a G-Counter quota (rules.Rule.GCounter), counted per region
// and merged (QuotaCounts, MergeQuotaCounts). The design, and what is exact
// and measured, is in docs/enforcement.md.
//
// Every decision is handed to a Sink (pipeline.Producer logs it to Kafka)
// without waiting.
//
// # Usage
//
//	set, err := rules.Load("rules.yaml")
//	if err != nil { ... }
//	// No retries (a retried script could charge a request twice), context
//	// deadlines that bound a slow Redis, and one dial per connection (a
//	// refused dial is otherwise retried 5 times, 100 ms apart):
//	rdb := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{"127.0.0.1:6379"},
//		MaxRetries: -1, ContextTimeoutEnabled: true, DialerRetries: 1})
//	lim, err := enforcer.New(rdb, set, enforcer.Options{Region: "eu-west", Regions: 5})
//	if err != nil { ... }
//	defer lim.Close() // its timer, retries and metrics; not rdb
//	var req enforcer.Request
//	req.Descriptors[rules.KeyAPIKey] = "k-123"
//	// The Redis budget; a pinned rule homed in another region needs a WAN
//	// round trip more (Options.HomeBudget).
//	check, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
//	d, err := lim.Check(check, &req)
//	cancel()
//	if err != nil { ... } // ErrBadRequest: more than MaxRules rules match
//	defer lim.Release(context.WithoutCancel(ctx), &d) // frees concurrency slots, if any
//	d.WriteHeaders(w.Header(), enforcer.AllHeaders)
//	if !d.Outcome.Allow() {
//		w.WriteHeader(http.StatusTooManyRequests)
//	}
//
// Or, for a net/http server:
//
//	http.ListenAndServe(":8080", lim.Middleware(mux, enforcer.MiddlewareOptions{}))
//
// Metrics, on Options.Registerer:
//
//	sluice_enforcer_decisions_total{outcome,rule}     decisions by outcome and rule (the denying, else binding, rule)
//	sluice_enforcer_degraded_decisions_total          decisions the failure modes took (alert on these)
//	sluice_enforcer_would_deny_total{path}            shadow-mode denials, by decision path
//	sluice_enforcer_redis_duration_seconds            a decision's Redis round trip (histogram)
//	sluice_enforcer_redis_errors_total{cause}         script calls that failed or the open breaker skipped, by cause (RedisCause)
//	sluice_enforcer_redis_up                          1 while the readiness probe's decisions go through Redis (Probe)
//	sluice_enforcer_redis_down_cause{cause}           1 for the cause of the probe's failure (Probe)
//	sluice_enforcer_redis_maxmemory_policy{policy}    1 for each maxmemory-policy Redis runs (MemoryPolicy)
//	sluice_enforcer_redis_round_trips_total           Redis round trips (calls, pipelines)
//	sluice_enforcer_redis_batch_decisions             decisions per batched script call (histogram)
//	sluice_enforcer_lease_hits_total                  decisions served from leased tokens
//	sluice_enforcer_deny_cache_hits_total             decisions denied from the deny cache
//	sluice_enforcer_refunds_total{result}             cross-slot refunds
//	sluice_enforcer_lease_removals_total{result}      leases removed after a call that got no answer
//	sluice_enforcer_slot_releases_total{result}       concurrency slot releases: ok, failed (retried), retried, expired, dropped
//	sluice_enforcer_redis_moved_total                 MOVED from a Redis given as a single node (a Cluster node)
//	sluice_enforcer_breaker_state                     0 closed, 1 half-open, 2 open
//	sluice_enforcer_breaker_trips_total               times a circuit breaker opened
//	sluice_enforcer_shed_total                        requests shed (ErrOverloaded): no place within QueueWait, decided by the failure modes
//	sluice_enforcer_late_retries_total                script calls sent again after Redis ran them late (committing nothing)
//	sluice_enforcer_stalls_total                      stalls of this process seen while deciding (a CPU quota's throttling)
//	sluice_enforcer_stalled_seconds_total             their total time
//	sluice_enforcer_stall_wait_seconds                how much longer than 2 × Budget answers are waited for: the recent stalls
//	sluice_enforcer_fallback_rules_total{from}        fail-open rules the fallback decided: remembered (Redis's last answer) or bucket
//	sluice_enforcer_fallback_instances                enforcers the fallback divides by (override, learned through Redis, or 1)
//	sluice_enforcer_fallback_instances_learned        1 when that count was learned through Redis
//	sluice_enforcer_fallback_instances_age_seconds    since Redis last answered the heartbeat (-1: never, or the override)
//	sluice_enforcer_heartbeat_errors_total            heartbeats Redis did not answer
//	sluice_enforcer_remembered_keys                   keys whose last Redis answer is remembered (Options.Fallback.RememberedKeys)
//	sluice_enforcer_debt_keys                         keys with units the fallback granted that Redis has not counted yet
//	sluice_enforcer_debt_units_charged_total          such units charged to Redis afterwards (charge.lua)
//	sluice_enforcer_debt_units_lost_total             such units dropped with their key (evicted) before a charge
//	sluice_enforcer_debt_charge_errors_total          charges that failed (owed again)
//	sluice_enforcer_queued_total                      decisions that waited for a place (MaxInFlight)
//	sluice_enforcer_queue_wait_seconds                how long they waited (histogram)
//	sluice_enforcer_in_flight                         decisions in progress
//	sluice_enforcer_in_flight_limit                   the adaptive limit on them (AIMD)
//	sluice_enforcer_home_breaker_state                the most open home region's breaker (pinned rules)
//	sluice_enforcer_control_refreshes_total{result}   loads of dynamic rules, shares and hot keys
//	sluice_enforcer_share_newest_timestamp_seconds    when the newest share loaded was computed (0: none)
//	sluice_enforcer_rules_version                     the static rule set's version
//	sluice_enforcer_dynamic_rules                     dynamic rules in force
//	sluice_enforcer_dynamic_rules_refused             dynamic rules left out: they could loosen a static rule
//	sluice_enforcer_dynamic_rules_over_cap            dynamic rules left out past Options.DynamicCap
//	sluice_enforcer_dynamic_rules_killed              1 while the kill switch is on
//	sluice_enforcer_key_store_lookups_total           API keys looked up in the key store (cache misses)
//	sluice_enforcer_key_store_errors_total            key store lookups that failed
//	sluice_enforcer_client_ip_refused_total           requests refused: a client_ip that looks like an address but is none
//	sluice_enforcer_client_ip_names_total             client_ip values that are names (hostnames), keyed as they are
//	sluice_enforcer_local_entities                    entities local-scope rules hold state for (at most Options.LocalEntities)
//	sluice_enforcer_local_evictions_total             local-scope states forgotten, least recently used first
//	sluice_enforcer_load                              the load priority shedding compares with its thresholds (1: full)
//	sluice_enforcer_work_in_flight                    requests the backend serves (BeginWork, EndWork; the middleware)
//	sluice_enforcer_load_shed_total{priority}         requests refused by priority load shedding (503, nothing charged)
//	sluice_enforcer_priority_unknown_total            priority entries that named no priority (the default applied)
//	sluice_enforcer_adaptive_factor                   the factor adaptive rules' limits are scaled by (AIMD), in (0, 1]
//	sluice_enforcer_adaptive_own_factor               this enforcer's own factor (the region's is the mean of its enforcers')
//	sluice_enforcer_adaptive_region_enforcers         enforcers whose factor made the region's at the last refresh
//	sluice_enforcer_adaptive_statuses                 response statuses judged in the controller's last interval
//	sluice_enforcer_adaptive_error_ratio              their 5xx share
//	sluice_enforcer_adaptive_changes_total{direction} changes of the factor, down or up
//	sluice_enforcer_quota_windows_dropped_total       G-Counter windows past MaxQuotaWindows, not published
//
// The decision-record producer (pipeline.Producer) counts its own drops.
package enforcer
