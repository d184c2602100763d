// Package sim holds the global-quota simulation (sim_test.go): five regions,
// each a real redis-server with an enforcer, one in-process Kafka cluster
// (kfake), the pipeline with the aggregator, the output topic and an applier
// per region, driven on simulated event time by a traffic generator whose
// demand shifts between regions. It measures the global allowed count against
// the limit every second: overshoot, convergence after each shift,
// starvation, and the theoretical bound. See docs/global-quotas.md.
//
// Run it with
//
//	go test -count=1 -run TestGlobalQuotaSimulation -v ./replay/sim/
package sim
