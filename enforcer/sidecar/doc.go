// Package sidecar serves an enforcer.Limiter to gateways: Envoy's rate limit
// service over gRPC (envoy.service.ratelimit.v3.RateLimitService, a drop-in
// for envoyproxy/ratelimit), the same model as JSON over HTTP
// (POST /v1/check), forward-auth for nginx, Caddy and Traefik
// (ForwardAuthPath, ForwardAuthOptions: docs/forward-auth.md), health,
// readiness and Prometheus metrics (also alone, AdminHandler). It is what
// `sluice serve` runs.
//
// A request's descriptors become the parts of one enforcer.Request, decided
// in one atomic call: every descriptor's rules are committed only if all
// allow. Entry keys map to sluice's descriptor keys by KeyFor; a descriptor
// with any other key matches no rule and is answered OK, as
// envoyproxy/ratelimit answers a descriptor no rule matches. The mapping,
// the per-descriptor statuses and readiness are specified in
// docs/enforcement.md, "Sidecar APIs".
//
// The request path allocates nothing of its own beyond a limit override's
// entity and the header values the engine formats: requests are decoded
// into pooled memory and answers built in pooled messages, which the
// server's codec takes back once gRPC has marshaled them.
//
// # Usage
//
//	lim, err := enforcer.New(rdb, set, enforcer.Options{Registerer: reg})
//	if err != nil { ... }
//	srv, err := sidecar.New(lim, sidecar.Options{Registry: reg, Redis: rdb})
//	if err != nil { ... }
//	gs := srv.NewGRPCServer() // RateLimitService and grpc.health.v1
//	go gs.Serve(grpcListener)
//	go http.Serve(httpListener, srv.Handler())       // /v1/check, /v1/forward-auth, /v1/usage, ...: loopback
//	go http.Serve(adminListener, srv.AdminHandler()) // /healthz, /readyz, /metrics: for the kubelet
//	...
//	srv.Drain() // unready first, then stop: gs.GracefulStop()
//
// The whole process (listeners, the Redis client, the rule watcher, decision
// records to Kafka, refresh and graceful shutdown, as one run group) is
// `sluice serve`, wired in cmd/sluice: this package has no process wiring
// and links no Kafka client.
//
// Metrics, on Options.Registry (besides the limiter's, when it shares the
// registry, and the Go and process collectors that sluice serve adds):
//
//	sluice_sidecar_checks_total{api,code}           checks by API (grpc, http, forward_auth) and answer (ok, over_limit, invalid, shed)
//	sluice_sidecar_check_duration_seconds{api}      time from a decoded request to its answer
//	sluice_sidecar_unmatched_descriptors_total      descriptors with a key sluice cannot map
//	sluice_sidecar_other_domain_checks_total        checks for a domain other than the rule set's (allowed; logged once a minute)
//	sluice_sidecar_unknown_descriptor_keys_total    entries of the set's domain whose key no rule matches (a misspelt key; logged once a minute, with the key)
//	sluice_sidecar_usage_requests_total{code}       GET /v1/usage by answer (ok, over_limit, no_key, bad_request, unavailable)
//
// GET /v1/usage (UsageOptions) answers an API's customers with their own
// key's rules, remaining and reset, read without charging
// (enforcer.Limiter.Usage), and its denials (a Denials reader); it is off
// the request path and allocates freely. docs/customers.md is its page.
package sidecar
