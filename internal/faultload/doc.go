// Package faultload is the harness of the limiter's fault tests under load
// (enforcer.TestFaultLoad, the Redis faults and failovers, and this
// package's TestFaultLoadKafka, Kafka down): an open-loop load of
// -fault.rate requests per second for -fault.duration through the
// limiter's HTTP middleware, a Sink that records every decision by request,
// and the checks and measurements the cases share (answers, failure modes,
// latency per phase, goroutines and heap, the limiter's metrics).
//
// Only tests import it (internal/archtest holds that): its init registers
// -fault.duration and -fault.rate on the test binary's flag set, once per
// binary, and registers nothing in a binary that is not a test. It imports
// enforcer and no package of the slow loop, so that enforcer's tests may
// use it; the Kafka case, which needs pipeline's producer, is this
// package's own test.
package faultload
