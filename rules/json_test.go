package rules

import (
	"encoding/json"
	"errors"
	"net/netip"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// enumCase is one enum value: its JSON text name and its format-1 integer.
type enumCase struct {
	v    any // a pointer to the value, e.g. &Algorithm(1)
	name string
	n    int
}

func enumCases() []enumCase {
	var cs []enumCase
	for i, n := range algorithmNames {
		a := Algorithm(i)
		cs = append(cs, enumCase{&a, n, i})
	}
	for i, n := range modeNames {
		m := Mode(i)
		cs = append(cs, enumCase{&m, n, i})
	}
	for i, n := range failureModeNames {
		f := FailureMode(i)
		cs = append(cs, enumCase{&f, n, i})
	}
	for i, n := range calendarNames {
		c := Calendar(i)
		cs = append(cs, enumCase{&c, n, i})
	}
	return cs
}

// The names are the YAML format's: what String writes and Parse reads.
func TestEnumNames(t *testing.T) {
	if got := strings.Join(algorithmNames[:], ","); got != "token_bucket,sliding_window,fixed_window,concurrency" {
		t.Errorf("algorithms %s", got)
	}
	if got := strings.Join(modeNames[:], ","); got != "enforce,shadow" || Enforce != 0 || Shadow != 1 {
		t.Errorf("modes %s", got)
	}
	if got := strings.Join(failureModeNames[:], ","); got != "open,closed,open_unlimited" {
		t.Errorf("failure modes %s", got)
	}
	if got := strings.Join(calendarNames[:], ","); got != ",day,week,month" {
		t.Errorf("calendars %s", got)
	}
	for _, c := range enumCases() {
		v := reflect.ValueOf(c.v).Elem()
		if s := v.Interface().(interface{ String() string }).String(); s != c.name {
			t.Errorf("%T %d: String %q, JSON name %q", v.Interface(), c.n, s, c.name)
		}
	}
}

// Every enum writes its name and reads its name (format 2) and its integer
// (format 1).
func TestEnumJSONRoundTrip(t *testing.T) {
	for _, c := range enumCases() {
		v := reflect.ValueOf(c.v).Elem()
		b, err := json.Marshal(v.Interface())
		if err != nil || string(b) != strconv.Quote(c.name) {
			t.Errorf("%T %d: wrote %s, %v; want %q", v.Interface(), c.n, b, err, c.name)
		}
		for _, in := range []string{strconv.Quote(c.name), strconv.Itoa(c.n)} {
			p := reflect.New(v.Type())
			p.Elem().SetUint(99)
			if err := json.Unmarshal([]byte(in), p.Interface()); err != nil || p.Elem().Uint() != uint64(c.n) {
				t.Errorf("%T from %s: %v, %v; want %d", v.Interface(), in, p.Elem().Interface(), err, c.n)
			}
			if in[0] == '"' {
				p.Elem().SetUint(99)
				if err := p.Interface().(interface{ UnmarshalText([]byte) error }).UnmarshalText([]byte(c.name)); err != nil || p.Elem().Uint() != uint64(c.n) {
					t.Errorf("%T UnmarshalText %q: %v", v.Interface(), c.name, err)
				}
			}
		}
	}
}

// An unknown name or an integer out of range is an error naming the field and
// the value, in a rule, a match, a dynamic rule's previous version.
func TestEnumJSONErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"algorithm":"leaky_bucket"}`, `algorithm "leaky_bucket"`},
		{`{"algorithm":""}`, `algorithm ""`},
		{`{"Algorithm":4}`, `Rule.algorithm`},
		{`{"Algorithm":-1}`, `algorithm -1`},
		{`{"Algorithm":256}`, `algorithm 256`},
		{`{"Algorithm":1.0}`, `algorithm 1.0`},
		{`{"Algorithm":1e0}`, `algorithm 1e0`},
		{`{"Algorithm":true}`, `algorithm true`},
		{`{"mode":"Shadow"}`, `mode "Shadow"`},
		{`{"Mode":2}`, `Rule.mode`},
		{`{"failure_mode":"open-unlimited"}`, `failure_mode "open-unlimited"`},
		{`{"FailureMode":3}`, `failure_mode 3`},
		{`{"calendar":"year"}`, `calendar "year"`},
		{`{"Calendar":4}`, `Rule.calendar`},
		{`{"match":[{"key":"ip"}]}`, `descriptor key "ip"`},
	} {
		var r Rule
		err := json.Unmarshal([]byte(tc.in), &r)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.in, err, tc.want)
		}
	}
	var d DynamicRule
	err := json.Unmarshal([]byte(`{"id":"x","mode":"shadow","prev":{"Mode":7}}`), &d)
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) || !strings.Contains(err.Error(), "DynamicRule.prev.mode") || !strings.Contains(err.Error(), "mode 7") {
		t.Errorf("bad previous mode: %v", err)
	}
	if _, err := json.Marshal(&Rule{ID: "x", Algorithm: 9}); err == nil || !strings.Contains(err.Error(), "algorithm 9") {
		t.Errorf("writing algorithm 9: %v", err)
	}
}

// The keys of format 1, Go's field names, are still read: encoding/json
// matches "Algorithm" to "algorithm", and Rule and Match read the keys that
// differ by more than case (FailureMode, GCounter, ExactKeys, DetailedMetric,
// ExpiresAt, NotPrefix).
func TestRuleJSONReadsFormat1Keys(t *testing.T) {
	in := `{"ID":"r","Match":[{"Key":"custom","Name":"x-plan","Value":"free"},{"Key":"path","Prefix":"/v1/","NotPrefix":["/v1/health"]},` +
		`{"Key":"client_ip","CIDR":["203.0.113.0/24"],"Shared":true},{"Key":"tier","Values":["a"],"Not":["b"]},{"Key":"route","Template":"/x/{id}"},{"Key":"user","Wildcard":"u*"}],` +
		`"Algorithm":2,"Limit":7,"Period":0,"Burst":7,"Calendar":3,"Mode":1,"FailureMode":2,"Global":true,"Pinned":true,"GCounter":true,"ExactKeys":true,` +
		`"Replaces":["q"],"DetailedMetric":true,"Origin":"o","Reason":"why","Evidence":{"k":"v"},"ExpiresAt":"2026-11-30T13:00:00Z","Version":5}`
	want := Rule{ID: "r", Match: []Match{{Key: KeyCustom, Name: "x-plan", Value: "free"}, {Key: KeyPath, Prefix: "/v1/", NotPrefix: []string{"/v1/health"}},
		{Key: KeyClientIP, CIDR: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}, Shared: true}, {Key: KeyTier, Values: []string{"a"}, Not: []string{"b"}},
		{Key: KeyRoute, Template: "/x/{id}"}, {Key: KeyUser, Wildcard: "u*"}},
		Algorithm: FixedWindow, Limit: 7, Burst: 7, Calendar: Month, Mode: Shadow, FailureMode: FailOpenUnlimited, Global: true, Pinned: true, GCounter: true,
		ExactKeys: true, Replaces: []string{"q"}, DetailedMetric: true, Origin: "o", Reason: "why", Evidence: map[string]string{"k": "v"},
		ExpiresAt: time.Date(2026, 11, 30, 13, 0, 0, 0, time.UTC), Version: 5}
	var got Rule
	if err := json.Unmarshal([]byte(in), &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("format 1:\n got %+v\nwant %+v", got, want)
	}
	// Written again, it is format 2, and reads back the same.
	b, err := json.Marshal(&got)
	if err != nil {
		t.Fatal(err)
	}
	var again Rule
	if err := json.Unmarshal(b, &again); err != nil || !reflect.DeepEqual(again, want) {
		t.Errorf("format 2 %s:\n got %+v, %v", b, again, err)
	}
}

// bareEnum finds an enum field written as an integer.
var bareEnum = regexp.MustCompile(`"(?i:algorithm|mode|failure_?mode|calendar|key)":\s*-?[0-9]`)

// New writes name the enums, in snake_case keys, and read back unchanged.
func TestRuleJSONWritesNames(t *testing.T) {
	exp := time.Date(2026, 11, 30, 13, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		r    Rule
		want []string
	}{
		{Rule{ID: "tb", Match: []Match{{Key: KeyClientIP, Value: "198.51.100.7"}}, Limit: 10, Period: time.Minute, Burst: 20, Mode: Shadow, FailureMode: FailClosed, Origin: "o", ExpiresAt: exp},
			[]string{`"algorithm":"token_bucket"`, `"mode":"shadow"`, `"failure_mode":"closed"`, `"key":"client_ip"`, `"expires_at":"2026-11-30T13:00:00Z"`}},
		{Rule{ID: "sw", Match: []Match{{Key: KeyPath, Prefix: "/v1/", NotPrefix: []string{"/v1/h"}}}, Algorithm: SlidingWindow, Limit: 1, Period: time.Second, Burst: 1, FailureMode: FailOpenUnlimited, Global: true},
			[]string{`"algorithm":"sliding_window"`, `"mode":"enforce"`, `"failure_mode":"open_unlimited"`, `"not_prefix":["/v1/h"]`}},
		{Rule{ID: "fw", Match: []Match{{Key: KeyAccount}}, Algorithm: FixedWindow, Limit: 1, Burst: 1, Calendar: Week, Global: true, GCounter: true, ExactKeys: true},
			[]string{`"algorithm":"fixed_window"`, `"calendar":"week"`, `"failure_mode":"open"`, `"g_counter":true`, `"exact_keys":true`}},
		{Rule{ID: "c", Match: []Match{{Key: KeyCustom, Name: "x-plan"}}, Algorithm: Concurrency, Limit: 1, Period: time.Second, Burst: 1, DetailedMetric: true},
			[]string{`"algorithm":"concurrency"`, `"key":"custom","name":"x-plan"`, `"detailed_metric":true`}},
	} {
		if err := tc.r.Validate(); err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(&tc.r)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range tc.want {
			if !strings.Contains(string(b), w) {
				t.Errorf("%s: %s lacks %s", tc.r.ID, b, w)
			}
		}
		if m := bareEnum.FindString(string(b)); m != "" || regexp.MustCompile(`"[A-Z]`).Match(b) {
			t.Errorf("%s: %s has a bare enum %q or a Go field name", tc.r.ID, b, m)
		}
		if tc.r.Calendar == NoCalendar && strings.Contains(string(b), "calendar") {
			t.Errorf("%s: %s writes no calendar", tc.r.ID, b)
		}
		var got Rule
		if err := json.Unmarshal(b, &got); err != nil || !reflect.DeepEqual(got, tc.r) {
			t.Errorf("%s: read back %+v, %v", tc.r.ID, got, err)
		}
	}
}

// A dynamic rule writes "format":2 first and reads back unchanged; format 1
// (no format) is read; another format is an error.
func TestDynamicRuleJSON(t *testing.T) {
	r := Rule{ID: "sw", Match: []Match{{Key: KeyASN, Value: "64500"}}, Algorithm: SlidingWindow, Limit: 5, Period: time.Second, Burst: 5,
		Origin: "detector/x", ExpiresAt: time.Date(2026, 11, 30, 13, 0, 0, 0, time.UTC), Version: 2}
	prev := r
	prev.Mode, prev.Version = Shadow, 1
	d := &DynamicRule{Rule: r, Created: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC), Previous: &prev, RolledBack: true}
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(b), `{"format":2,"id":"sw",`) || !strings.Contains(string(b), `"prev":{"id":"sw"`) ||
		!strings.Contains(string(b), `"mode":"shadow"`) || !strings.Contains(string(b), `"rolled_back":true`) || bareEnum.Match(b) {
		t.Errorf("wrote %s", b)
	}
	var got DynamicRule
	if err := json.Unmarshal(b, &got); err != nil || !reflect.DeepEqual(&got, d) {
		t.Errorf("read back %+v, %v", got, err)
	}
	b1 := `{"ID":"sw","Match":[{"Key":"asn","Value":"64500"}],"Algorithm":1,"Limit":5,"Period":1000000000,"Burst":5,"Calendar":0,"Mode":0,"FailureMode":0,"Global":false,` +
		`"Origin":"detector/x","ExpiresAt":"2026-11-30T13:00:00Z","Version":2,"created":"2026-11-30T12:00:00Z","prev":{"ID":"sw","Match":[{"Key":"asn","Value":"64500"}],` +
		`"Algorithm":1,"Limit":5,"Period":1000000000,"Burst":5,"Calendar":0,"Mode":1,"FailureMode":0,"Global":false,"Origin":"detector/x","ExpiresAt":"2026-11-30T13:00:00Z","Version":1},"rolled_back":true}`
	got = DynamicRule{}
	if err := json.Unmarshal([]byte(b1), &got); err != nil || !reflect.DeepEqual(&got, d) {
		t.Errorf("format 1: %+v, %v", got, err)
	}
	for _, f := range []string{"3", "-1", `"2"`} {
		if err := json.Unmarshal([]byte(`{"format":`+f+`,"id":"sw"}`), &got); err == nil {
			t.Errorf("format %s read", f)
		}
	}
}

// Decoding any bytes into a dynamic rule does not panic, and what decodes
// writes and reads back.
func FuzzDynamicRuleJSON(f *testing.F) {
	f.Add([]byte(`{"format":2,"id":"x","algorithm":"fixed_window","calendar":"day","mode":"shadow","failure_mode":"closed","prev":{"Mode":1}}`))
	f.Add([]byte(`{"ID":"x","Algorithm":3,"Mode":1,"FailureMode":2,"Calendar":1,"Match":[{"Key":"path","NotPrefix":["/a"]}]}`))
	f.Add([]byte(`{"algorithm":9}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var d DynamicRule
		if json.Unmarshal(b, &d) != nil {
			return
		}
		out, err := json.Marshal(&d)
		if err != nil {
			t.Fatalf("%s decoded to %+v, which does not encode: %v", b, d, err)
		}
		var again DynamicRule
		if err := json.Unmarshal(out, &again); err != nil {
			t.Fatalf("%s does not read back: %v", out, err)
		}
	})
}
