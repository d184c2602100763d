package sidecar_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/enforcer/sidecar"
	"github.com/sluice-rl/sluice/rules"
)

// FuzzCheckJSON posts arbitrary bodies to /v1/check: every answer is 200 or
// 429 with one status per descriptor, or 400 or 413 with a reason, never a
// panic.
func FuzzCheckJSON(f *testing.F) {
	for _, s := range []string{
		`{"domain":"t","descriptors":[{"entries":[{"key":"user","value":"u"}]}]}`,
		`{"domain":"t","hitsAddend":3,"descriptors":[{"entries":[{"key":"remote_address","value":"[2001:db8::1]:443"}]},{"entries":[{"key":"generic_key","value":"x"}],"hits_addend":0}]}`,
		`{"domain":"t","descriptors":[{"entries":[{"key":"user","value":"u"}],"limit":{"requests_per_unit":2,"unit":"MINUTE","unit_multiplier":3}}]}`,
		`{"domain":"t","descriptors":[{"entries":[{"key":"route","value":"/login"},{"key":"user","value":"u"}],"hitsAddend":"4"}]}`,
		`{"domain":"t","descriptors":[{"entries":[{"key":"user","value":"a"},{"key":"user","value":"b"}],"isNegativeHits":true}]}`,
		`{"domain":"","descriptors":[]}`, `[]`, `null`, `{"domain":"t","descriptors":[null]}`,
	} {
		f.Add([]byte(s))
	}
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		f.Fatal(err)
	}
	f.Cleanup(m.Close)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
	f.Cleanup(func() { rdb.Close() })
	set, err := rules.Parse("fuzz.yaml", []byte(testRules))
	if err != nil {
		f.Fatal(err)
	}
	lim, err := enforcer.New(rdb, set, enforcer.Options{Budget: time.Second})
	if err != nil {
		f.Fatal(err)
	}
	srv, err := sidecar.New(lim, sidecar.Options{Registry: prometheus.NewRegistry()})
	if err != nil {
		f.Fatal(err)
	}
	h := srv.Handler()
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/check", strings.NewReader(string(body))))
		out, _ := io.ReadAll(rec.Body)
		switch rec.Code {
		case http.StatusOK, http.StatusTooManyRequests:
			var in rlsv3.RateLimitRequest
			if err := protojson.Unmarshal(body, &in); err != nil {
				t.Fatalf("answered %d to a body that does not decode: %v", rec.Code, err)
			}
			var resp rlsv3.RateLimitResponse
			if err := protojson.Unmarshal(out, &resp); err != nil {
				t.Fatalf("answer %q: %v", out, err)
			}
			if len(resp.GetStatuses()) != len(in.GetDescriptors()) {
				t.Fatalf("%d statuses for %d descriptors", len(resp.GetStatuses()), len(in.GetDescriptors()))
			}
			if (rec.Code == http.StatusOK) != (resp.GetOverallCode() == rlsv3.RateLimitResponse_OK) {
				t.Fatalf("status %d with overall code %v", rec.Code, resp.GetOverallCode())
			}
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
			if !strings.Contains(string(out), `"error"`) {
				t.Fatalf("%d without a reason: %q", rec.Code, out)
			}
		default:
			t.Fatalf("status %d: %q", rec.Code, out)
		}
	})
}
