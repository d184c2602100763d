// Package check holds the Go tests of what deploy/ ships: the Kubernetes
// manifests (deploy/kubernetes, with the gateway's Envoy configuration), the
// Prometheus alerts (deploy/prometheus/alerts.yaml) and the Grafana
// dashboard (deploy/grafana/sluice.json). It has no code of its own.
//
//   - TestKubernetesManifests builds every overlay with kustomize's library
//     (krusty), decodes each object strictly into k8s.io/api's types, parses
//     the Envoy bootstrap with go-control-plane, and runs the sluice binary
//     on every container's args (`sluice ARGS... --help`: cobra parses the
//     flags, and fails on an unknown one or a bad value, before it honours
//     --help).
//   - TestMetricNames, TestAlertRules and TestDashboard build the metric
//     registries of what `sluice serve`, `sluice pipeline` and `sluice
//     apply` run, from the library packages' constructors; the alerts and
//     panels may name only those metrics. TestServedMetricsAreKnown runs the
//     built binary's three commands and scrapes their /metrics, so that the
//     registries built here cannot drift from what the processes serve.
//     TestAlertsFire evaluates each alert with Prometheus's own PromQL
//     engine over synthetic series.
//   - TestTenantDashboard checks deploy/grafana/sluice-tenant.json, one API
//     key's dashboard, as TestDashboard checks sluice.json, and runs each of
//     its ClickHouse queries, macros expanded, on a clickhouse-server with
//     the schema (through clickhouse-client; skipped without them, failed
//     under CI=true).
//
// It is a module of its own (github.com/sluice-rl/sluice/deploy/check, with
// the main module through a replace of ../..) so that what only these
// checks need, Prometheus's server packages (with their cloud SDKs),
// k8s.io/api, k8s.io/apimachinery, kustomize and sigs.k8s.io/yaml, stays
// out of the main module's go.mod: no build or test of sluice itself
// downloads them. Run it with `make test`, or `cd deploy/check && go test
// ./...`. It needs the go command (it builds cmd/sluice) and redis-server
// on PATH (a test without it is skipped, or fails under CI=true).
//
// It reaches sluice only as any other module would: through its exported
// packages, and through the binary built from ../../cmd/sluice. Package main
// and sluice's internal packages are out of its reach.
package check
