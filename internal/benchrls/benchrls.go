// Package benchrls holds what the sidecar's benchmarks share: the rule set,
// the entities they rotate through and an HTTP check, so that the in-process
// benchmarks (enforcer/sidecar) and the process-level latency benchmark
// (cmd/sluice) measure the same work.
package benchrls

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// Rules are 4 token buckets that never deny, one per descriptor of
// benchRequest, as in enforcer's BenchmarkCheck.
const Rules = `
domain: b
rules:
  - {id: r0, match: [{key: user}], limit: 1000000000, period: 1s}
  - {id: r1, match: [{key: client_ip}], limit: 1000000000, period: 1s}
  - {id: r2, match: [{key: tenant}], limit: 1000000000, period: 1s}
  - {id: r3, match: [{key: api_key}], limit: 1000000000, period: 1s}
`

// Entities is how many distinct entities the latency benchmark
// rotates through: at 10 000 checks/s each key sees about 2.4 a second, far
// below the hot-key rate, so every check goes to Redis (one hot key is
// BenchmarkHotKey's subject, in package enforcer).
const Entities = 4096

// Entity returns entity i's user, client IP, tenant and API key.
func Entity(i int) (user, ip, tenant, key string) {
	return fmt.Sprintf("u%d", i), fmt.Sprintf("10.0.%d.%d", i/256, i%256), fmt.Sprintf("t%d", i), fmt.Sprintf("k%d", i)
}

// HTTPCheck posts body (a /v1/check request in JSON) to url; degraded is true for an answer without
// counts (Redis did not answer within the budget).
func HTTPCheck(cl *http.Client, url, body string) (degraded bool, err error) {
	r, err := cl.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return false, err
	}
	var buf [2048]byte
	n, _ := io.ReadFull(r.Body, buf[:])
	_, _ = io.Copy(io.Discard, r.Body)
	r.Body.Close()
	if r.StatusCode != http.StatusOK {
		return false, fmt.Errorf("status %d", r.StatusCode)
	}
	return !bytes.Contains(buf[:n], []byte(`"currentLimit"`)), nil
}

// Request is what Envoy sends for 4 rate-limit actions: 4 descriptors of one
// entry each (user_id, remote_address, tenant_id, x-api-key), in domain "b".
func Request(user, ip, tenant, key string) *rlsv3.RateLimitRequest {
	r := &rlsv3.RateLimitRequest{Domain: "b"}
	for _, kv := range [][2]string{{"user_id", user}, {"remote_address", ip}, {"tenant_id", tenant}, {"x-api-key", key}} {
		r.Descriptors = append(r.Descriptors, &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: kv[0], Value: kv[1]}}})
	}
	return r
}
