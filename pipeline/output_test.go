package pipeline

import (
	"encoding/json"
	"os"
	"reflect"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/rules"
)

// v0Records reads testdata/stored/v0-output-records.json: output records as
// format 1 wrote them (bare integer enums, Go field names).
func v0Records(t *testing.T) []struct{ Key, Value string } {
	t.Helper()
	b, err := os.ReadFile("../testdata/stored/v0-output-records.json")
	if err != nil {
		t.Fatal(err)
	}
	var recs []struct{ Key, Value string }
	if err := json.Unmarshal(b, &recs); err != nil {
		t.Fatal(err)
	}
	return recs
}

// v0Output is what the v0 fixture's records hold, in order.
func v0Output() []*OutputRecord {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	exp := t0.Add(time.Hour)
	rule := func(r rules.Rule) *OutputRecord {
		return &OutputRecord{Format: 1, Kind: KindRule, Version: r.Version, Rule: &r}
	}
	share := func(s rules.Share) *OutputRecord {
		return &OutputRecord{Format: 1, Kind: KindShare, Version: s.Version, Share: &s}
	}
	return []*OutputRecord{
		rule(rules.Rule{ID: "hh-tb-shadow", Match: []rules.Match{{Key: rules.KeyClientIP, Value: "198.51.100.7"}, {Key: rules.KeyASN, Value: "64500"}},
			Algorithm: rules.TokenBucket, Limit: 10, Period: time.Minute, Burst: 20, Mode: rules.Shadow, FailureMode: rules.FailClosed,
			Origin: "detector/heavy-hitter", Reason: "198.51.100.7 sent 4000 requests in 1m", Evidence: map[string]string{"count": "4000", "window": "1m"},
			ExpiresAt: exp, Version: 1796040000000}),
		rule(rules.Rule{ID: "sw-enforce", Match: []rules.Match{{Key: rules.KeyCustom, Name: "x-plan", Value: "free"}, {Key: rules.KeyPath, Prefix: "/v1/"}},
			Algorithm: rules.SlidingWindow, Limit: 100, Period: 10 * time.Second, Burst: 100, Mode: rules.Enforce, FailureMode: rules.FailOpenUnlimited, Global: true,
			Origin: "detector/heavy-hitter", Reason: "free plan burst", ExpiresAt: exp, Version: 1796040000001}),
		rule(rules.Rule{ID: "fw-month", Match: []rules.Match{{Key: rules.KeyOrg, Value: "acme"}},
			Algorithm: rules.FixedWindow, Limit: 1000000, Burst: 1000000, Calendar: rules.Month, Mode: rules.Shadow,
			Origin: "detector/quota", ExpiresAt: exp, Version: 1796040000002}),
		share(rules.Share{RuleID: "sw-enforce", Region: "eu-west", Fraction: 0.6, Version: 1796040000001, ComputedAt: t0}),
		share(rules.Share{RuleID: "sw-enforce", Key: "4ba12667cf0f32f8789c10bd8cb63ed7", Region: "us-east", Fraction: 0.25, Version: 1796040000001,
			ComputedAt: t0.Add(time.Second)}),
	}
}

// TestStoredFormatsOfV0: output records of format 1 (before text enums,
// testdata/stored/v0-output-records.json) decode to what was written.
func TestStoredFormatsOfV0(t *testing.T) {
	recs, want := v0Records(t), v0Output()
	if len(recs) != len(want) {
		t.Fatalf("the fixture holds %d records, the test expects %d", len(recs), len(want))
	}
	for i, rec := range recs {
		r, err := DecodeOutputRecord([]byte(rec.Key), []byte(rec.Value))
		if err != nil {
			t.Errorf("record %d: %v", i, err)
			continue
		}
		if !reflect.DeepEqual(r, want[i]) {
			t.Errorf("record %d (%s):\n got %+v %+v %+v\nwant %+v %+v %+v", i, rec.Key, r, r.Rule, r.Share, want[i], want[i].Rule, want[i].Share)
		}
	}
}
