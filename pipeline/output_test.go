package pipeline

import (
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"regexp"
	"strings"
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

// bareEnum finds an enum written as an integer, or a Go field name as a key.
var bareEnum = regexp.MustCompile(`"(?i:algorithm|mode|failure_?mode|calendar|key)":\s*-?[0-9]|"[A-Z][A-Za-z]*":`)

// Records are written in format 2, with the enums' names, and decode back
// to what was written; the v0 records' content, written again, is format 2.
func TestOutputRecordFormat2(t *testing.T) {
	for i, want := range v0Output() {
		var k, v []byte
		var err error
		if want.Rule != nil {
			k, v, err = encodeRule(want.Rule)
		} else {
			k, v, err = encodeShare(want.Share)
		}
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(v), `{"format":2,`) {
			t.Errorf("record %d: %s is not format 2", i, v)
		}
		if m := bareEnum.FindString(string(v)); m != "" {
			t.Errorf("record %d: %s has %s", i, v, m)
		}
		if r := want.Rule; r != nil {
			for _, w := range []string{`"algorithm":"` + r.Algorithm.String() + `"`, `"mode":"` + r.Mode.String() + `"`, `"failure_mode":"` + r.FailureMode.String() + `"`} {
				if !strings.Contains(string(v), w) {
					t.Errorf("record %d: %s lacks %s", i, v, w)
				}
			}
		}
		got, err := DecodeOutputRecord(k, v)
		if err != nil {
			t.Fatal(err)
		}
		want.Format = OutputFormat
		if !reflect.DeepEqual(got, want) {
			t.Errorf("record %d:\n got %+v %+v\nwant %+v %+v", i, got.Rule, got.Share, want.Rule, want.Share)
		}
	}
	if !strings.Contains(string(mustValue(encodeRule(v0Output()[2].Rule))), `"algorithm":"fixed_window","limit":1000000,"period":0,"burst":1000000,"calendar":"month","mode":"shadow"`) {
		t.Error("the calendar rule's record lacks its calendar's name")
	}
}

func mustValue(_, v []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return v
}

// Records with an enum of no name, or of an integer out of range, are bad
// records, in either format; the error names the field and the value.
func TestDecodeOutputRecordBadEnums(t *testing.T) {
	for _, tc := range []struct{ value, want string }{
		{`{"format":1,"kind":"rule","rule":{"ID":"x","Algorithm":4}}`, "rule.algorithm"},
		{`{"format":1,"kind":"rule","rule":{"ID":"x","Mode":2}}`, "mode 2"},
		{`{"format":1,"kind":"rule","rule":{"ID":"x","FailureMode":-1}}`, "failure_mode -1"},
		{`{"format":2,"kind":"rule","rule":{"id":"x","algorithm":"leaky_bucket"}}`, `algorithm "leaky_bucket"`},
		{`{"format":2,"kind":"rule","rule":{"id":"x","calendar":"year"}}`, `calendar "year"`},
		{`{"format":2,"kind":"rule","rule":{"id":"x","match":[{"key":"ip"}]}}`, `descriptor key "ip"`},
		{`{"format":3,"kind":"rule","rule":{"id":"x"}}`, "format 3"},
	} {
		_, err := DecodeOutputRecord([]byte("rule/x"), []byte(tc.value))
		if !errors.Is(err, ErrBadOutputRecord) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrBadOutputRecord with %q", tc.value, err, tc.want)
		}
	}
}
