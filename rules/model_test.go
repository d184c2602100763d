package rules

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The rule model: algorithms, calendar windows, leases and route costs, as
// the YAML parser builds them and as Rule.Window places a time.

const modelGood = `
domain: api
rules:
  - id: sw
    algorithm: sliding_window
    match: [{key: user}]
    limit: 100
    period: 1m
  - id: sw-burst
    algorithm: sliding_window
    match: [{key: api_key}]
    limit: 7
    period: 3s
    burst: 7
  - id: fw
    algorithm: fixed_window
    match: [{key: api_key}]
    limit: 50
    period: 15m
  - id: day
    algorithm: fixed_window
    match: [{key: tenant}]
    limit: 1000
    calendar: day
    timezone: Europe/Berlin
  - id: week
    algorithm: fixed_window
    match: [{key: tenant}]
    limit: 5000
    calendar: week
    timezone: Europe/Berlin
  - id: month
    algorithm: fixed_window
    match: [{key: tenant}]
    limit: 20000
    calendar: month
  - id: month-berlin
    algorithm: fixed_window
    match: [{key: tenant}]
    limit: 30000
    calendar: month
    timezone: Europe/Berlin
  - id: cc
    algorithm: concurrency
    match: [{key: api_key}]
    limit: 10
    lease: 45s
  - id: cc-default
    algorithm: concurrency
    match: [{key: user}]
    limit: 3
  - id: tb
    algorithm: token_bucket
    match: [{key: client_ip}]
    limit: 5
    period: 1s
    burst: 20
costs:
  /v1/search: 5
  /v1/export: 1073741824
`

func TestModelParseGood(t *testing.T) {
	s, err := Parse("good.yaml", []byte(modelGood))
	if err != nil {
		t.Fatal(err)
	}
	if s.Domain != "api" || s.Version != 1 || len(s.Rules) != 10 {
		t.Fatalf("domain %q version %d rules %d; want api, 1, 10", s.Domain, s.Version, len(s.Rules))
	}
	type want struct {
		alg    Algorithm
		limit  int64
		period time.Duration
		burst  int64
		cal    Calendar
		loc    string // "" = nil Location
	}
	for id, w := range map[string]want{
		"sw":           {SlidingWindow, 100, time.Minute, 100, NoCalendar, ""},
		"sw-burst":     {SlidingWindow, 7, 3 * time.Second, 7, NoCalendar, ""},
		"fw":           {FixedWindow, 50, 15 * time.Minute, 50, NoCalendar, ""},
		"day":          {FixedWindow, 1000, 0, 1000, Day, "Europe/Berlin"},
		"week":         {FixedWindow, 5000, 0, 5000, Week, "Europe/Berlin"},
		"month":        {FixedWindow, 20000, 0, 20000, Month, ""},
		"month-berlin": {FixedWindow, 30000, 0, 30000, Month, "Europe/Berlin"},
		"cc":           {Concurrency, 10, 45 * time.Second, 10, NoCalendar, ""},
		"cc-default":   {Concurrency, 3, DefaultLease, 3, NoCalendar, ""},
		"tb":           {TokenBucket, 5, time.Second, 20, NoCalendar, ""},
	} {
		r := s.Rule(id)
		if r == nil {
			t.Errorf("rule %s missing", id)
			continue
		}
		loc := ""
		if r.Location != nil {
			loc = r.Location.String()
		}
		got := want{r.Algorithm, r.Limit, r.Period, r.Burst, r.Calendar, loc}
		if got != w {
			t.Errorf("rule %s: got %+v, want %+v", id, got, w)
		}
		if r.Mode != Enforce || r.FailureMode != FailOpen || r.Global || r.Dynamic() {
			t.Errorf("rule %s: mode %v failure %v global %v dynamic %v; want the defaults", id, r.Mode, r.FailureMode, r.Global, r.Dynamic())
		}
	}
	if DefaultLease != 30*time.Second {
		t.Errorf("DefaultLease %v, want 30s as documented", DefaultLease)
	}
	if len(s.Costs) != 2 || s.Costs["/v1/search"] != 5 || s.Costs["/v1/export"] != MaxCost {
		t.Errorf("costs %v, want /v1/search 5 and /v1/export %d", s.Costs, MaxCost)
	}
	for _, c := range []struct {
		requested uint32
		route     string
		want      int64
	}{
		{0, "/v1/search", 5}, // the route's default
		{3, "/v1/search", 3}, // the request's own cost wins
		{1, "/v1/search", 1}, // even when smaller than the default
		{0, "/v1/export", MaxCost},
		{0, "/v1/other", 1}, // no default: 1
		{0, "", 1},          // no route: 1
		{7, "", 7},
		{4294967295, "/v1/search", 4294967295},
	} {
		if got := s.Cost(c.requested, c.route); got != c.want {
			t.Errorf("Cost(%d, %q) = %d, want %d", c.requested, c.route, got, c.want)
		}
	}
	var none *Set
	if got := none.Cost(0, "/v1/search"); got != 1 {
		t.Errorf("nil set: Cost(0, route) = %d, want 1", got)
	}
	if got := none.Cost(9, "/v1/search"); got != 9 {
		t.Errorf("nil set: Cost(9, route) = %d, want 9", got)
	}
	noCosts := mustParse(t, "domain: a\nrules:\n  - {id: x, match: [{key: user}], limit: 1, period: 1s}\n")
	if noCosts.Costs != nil || noCosts.Cost(0, "/v1/search") != 1 {
		t.Errorf("a file without costs: Costs %v, Cost %d; want nil and 1", noCosts.Costs, noCosts.Cost(0, "/v1/search"))
	}
}

func mustParse(t *testing.T, y string) *Set {
	t.Helper()
	s, err := Parse("good.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestModelAlgorithmAndCalendarNames(t *testing.T) {
	for s, want := range map[string]Algorithm{"": TokenBucket, "token_bucket": TokenBucket, "sliding_window": SlidingWindow,
		"fixed_window": FixedWindow, "concurrency": Concurrency} {
		a, err := ParseAlgorithm(s)
		if err != nil || a != want {
			t.Errorf("ParseAlgorithm(%q) = %v, %v; want %v", s, a, err, want)
		}
		if s != "" && a.String() != s {
			t.Errorf("%v.String() = %q, want %q", a, a.String(), s)
		}
	}
	if _, err := ParseAlgorithm("Token_Bucket"); err == nil {
		t.Error("ParseAlgorithm is case-sensitive: Token_Bucket must fail")
	}
	if got := Algorithm(9).String(); got != "Algorithm(9)" {
		t.Errorf("Algorithm(9).String() = %q", got)
	}
	for c, want := range map[Calendar]string{NoCalendar: "", Day: "day", Week: "week", Month: "month", Calendar(7): "Calendar(7)"} {
		if c.String() != want {
			t.Errorf("%d.String() = %q, want %q", uint8(c), c.String(), want)
		}
	}
}

// oneRule wraps one rule's YAML (indented under "  - ") into a file whose rule
// list starts on line 3, column 5.
func oneRule(lines ...string) string {
	return "domain: a\nrules:\n  - " + strings.Join(lines, "\n    ") + "\n"
}

func TestModelParseBad(t *testing.T) {
	for _, c := range []struct{ name, yaml, want string }{
		{"unknown algorithm",
			oneRule("id: x", "algorithm: leaky_bucket", "match: [{key: user}]", "limit: 1", "period: 1s"),
			`bad.yaml:4:16: rule 1: invalid rule "x": unknown algorithm "leaky_bucket" (want one of [token_bucket sliding_window fixed_window concurrency])`},
		{"calendar on the default token bucket",
			oneRule("id: x", "match: [{key: user}]", "limit: 1", "calendar: day"),
			`bad.yaml:6:15: rule 1: invalid rule "x": calendar windows need algorithm fixed_window`},
		{"calendar on a sliding window",
			oneRule("id: x", "algorithm: sliding_window", "match: [{key: user}]", "limit: 1", "calendar: week"),
			`bad.yaml:7:15: rule 1: invalid rule "x": calendar windows need algorithm fixed_window`},
		{"timezone Local",
			oneRule("id: x", "algorithm: fixed_window", "match: [{key: user}]", "limit: 1", "calendar: day", "timezone: Local"),
			`bad.yaml:8:15: rule 1: invalid rule "x": timezone Local depends on the host: name the zone, e.g. Europe/Berlin, or UTC`},
		{"an empty match value",
			oneRule("id: x", `match: [{key: route, value: ""}]`, "limit: 1", "period: 1s"),
			`bad.yaml:4:12: rule 1: invalid rule "x": match route has an empty value: omit value to keep a bucket per value of route`},
		{"a calendar limit past 2^52",
			oneRule("id: x", "algorithm: fixed_window", "match: [{key: user}]", "limit: 9223372036854775807", "calendar: month"),
			`bad.yaml:6:12: rule 1: invalid rule "x": limit and burst must be at most 2^52`},
		{"a concurrency lease too long for its limit",
			oneRule("id: x", "algorithm: concurrency", "match: [{key: user}]", "limit: 4503599627370496", "lease: 2ms"),
			`bad.yaml:6:12: rule 1: invalid rule "x": burst or limit times lease (ms) exceeds 2^52: use a smaller limit or burst, or a shorter lease`},
		{"calendar and period",
			oneRule("id: x", "algorithm: fixed_window", "match: [{key: user}]", "limit: 1", "period: 24h", "calendar: day"),
			`bad.yaml:7:13: rule 1: invalid rule "x": a calendar window has no period: remove period, or calendar`},
		{"bad calendar name",
			oneRule("id: x", "algorithm: fixed_window", "match: [{key: user}]", "limit: 1", "calendar: year"),
			`bad.yaml:7:15: rule 1: invalid rule "x": calendar "year": want day, week or month`},
		{"calendar name is case-sensitive",
			oneRule("id: x", "algorithm: fixed_window", "match: [{key: user}]", "limit: 1", "calendar: Day"),
			`bad.yaml:7:15: rule 1: invalid rule "x": calendar "Day": want day, week or month`},
		{"fixed window without period or calendar",
			oneRule("id: x", "algorithm: fixed_window", "match: [{key: user}]", "limit: 1"),
			`bad.yaml:3:5: rule 1: invalid rule "x": period is missing, e.g. period: 1m`},
		{"timezone without calendar",
			oneRule("id: x", "algorithm: fixed_window", "match: [{key: user}]", "limit: 1", "period: 1h", "timezone: Europe/Berlin"),
			`bad.yaml:8:15: rule 1: invalid rule "x": timezone applies only to calendar windows (calendar: day, week or month)`},
		{"timezone on a concurrency rule",
			oneRule("id: x", "algorithm: concurrency", "match: [{key: user}]", "limit: 1", "timezone: UTC"),
			`bad.yaml:7:15: rule 1: invalid rule "x": timezone applies only to calendar windows (calendar: day, week or month)`},
		{"unknown timezone",
			oneRule("id: x", "algorithm: fixed_window", "match: [{key: user}]", "limit: 1", "calendar: month", "timezone: Mars/Olympus_Mons"),
			`bad.yaml:8:15: rule 1: invalid rule "x": timezone "Mars/Olympus_Mons": unknown time zone Mars/Olympus_Mons (write an IANA name such as Europe/Berlin or UTC)`},
		{"lease on a token bucket",
			oneRule("id: x", "match: [{key: user}]", "limit: 1", "period: 1s", "lease: 30s"),
			`bad.yaml:7:12: rule 1: invalid rule "x": lease applies only to algorithm: concurrency`},
		{"lease on a fixed window",
			oneRule("id: x", "algorithm: fixed_window", "match: [{key: user}]", "limit: 1", "calendar: day", "lease: 30s"),
			`bad.yaml:8:12: rule 1: invalid rule "x": lease applies only to algorithm: concurrency`},
		{"period on concurrency",
			oneRule("id: x", "algorithm: concurrency", "match: [{key: user}]", "limit: 1", "period: 30s"),
			`bad.yaml:7:13: rule 1: invalid rule "x": a concurrency rule has no period: its limit is requests in flight; set lease (the longest a request holds its slot), e.g. lease: 30s`},
		{"bad lease duration",
			oneRule("id: x", "algorithm: concurrency", "match: [{key: user}]", "limit: 1", "lease: forever"),
			`bad.yaml:7:12: rule 1: invalid rule "x": lease "forever": time: invalid duration "forever" (write a Go duration such as 7s, 15m, 1h)`},
		{"lease of zero",
			oneRule("id: x", "algorithm: concurrency", "match: [{key: user}]", "limit: 1", "lease: 0s"),
			`bad.yaml:3:5: rule 1: invalid rule "x": period must be a whole number of milliseconds >= 1ms, got 0s`},
		{"burst above limit on sliding_window",
			oneRule("id: x", "algorithm: sliding_window", "match: [{key: user}]", "limit: 10", "period: 1s", "burst: 20"),
			`bad.yaml:8:12: rule 1: invalid rule "x": burst applies only to token_bucket: a sliding_window rule's capacity is its limit`},
		{"burst below limit on sliding_window",
			oneRule("id: x", "algorithm: sliding_window", "match: [{key: user}]", "limit: 10", "period: 1s", "burst: 5"),
			`bad.yaml:8:12: rule 1: invalid rule "x": burst applies only to token_bucket: a sliding_window rule's capacity is its limit`},
		{"burst on concurrency",
			oneRule("id: x", "algorithm: concurrency", "match: [{key: user}]", "limit: 10", "burst: 11"),
			`bad.yaml:7:12: rule 1: invalid rule "x": burst applies only to token_bucket: a concurrency rule's capacity is its limit`},
		{"the position of the second rule",
			"domain: a\nrules:\n  - {id: ok, match: [{key: user}], limit: 1, period: 1s}\n  - id: x\n    algorithm: fixed_window\n    match: [{key: user}]\n    limit: 1\n    calendar: fortnight\n",
			`bad.yaml:8:15: rule 2: invalid rule "x": calendar "fortnight": want day, week or month`},
		{"cost 0",
			"domain: a\nrules:\n  - {id: x, match: [{key: user}], limit: 1, period: 1s}\ncosts:\n  /x: 0\n",
			`bad.yaml:5:3: costs: route "/x": cost must be 1 to 1073741824, got 0`},
		{"negative cost",
			"domain: a\nrules:\n  - {id: x, match: [{key: user}], limit: 1, period: 1s}\ncosts:\n  /x: -3\n",
			`bad.yaml:5:3: costs: route "/x": cost must be 1 to 1073741824, got -3`},
		{"cost above MaxCost",
			"domain: a\nrules:\n  - {id: x, match: [{key: user}], limit: 1, period: 1s}\ncosts:\n  /x: 1073741825\n",
			`bad.yaml:5:3: costs: route "/x": cost must be 1 to 1073741824, got 1073741825`},
		{"fractional cost",
			"domain: a\nrules:\n  - {id: x, match: [{key: user}], limit: 1, period: 1s}\ncosts:\n  /x: 2.5\n",
			`bad.yaml:5:7: "2.5" is not a whole number`},
		{"unknown top-level field",
			"domain: a\nrules:\n  - {id: x, match: [{key: user}], limit: 1, period: 1s}\ncost:\n  /x: 2\n",
			"bad.yaml:4:1: field cost not found at the top level (known: version, domain, custom_keys, rules, costs, shedding)"},
	} {
		_, err := Parse("bad.yaml", []byte(c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v\nwant it to contain %q", c.name, err, c.want)
		}
	}
}

// A calendar is meaningless on a concurrency rule, as on every algorithm but
// fixed_window: the parser must say so rather than drop the field.
func TestModelParseCalendarOnConcurrency(t *testing.T) {
	for _, cal := range []string{"day", "year"} {
		s, err := Parse("bad.yaml", []byte(oneRule("id: x", "algorithm: concurrency", "match: [{key: user}]", "limit: 1", "calendar: "+cal)))
		// Any calendar value on a concurrency rule, valid name or not, gets the
		// same error: the field does not apply.
		want := `bad.yaml:7:15: rule 1: invalid rule "x": calendar windows need algorithm fixed_window`
		if err == nil || !strings.Contains(err.Error(), want) {
			got := "no error"
			if err != nil {
				got = err.Error()
			} else if r := s.Rule("x"); r != nil {
				got += ", rule parsed with calendar " + strconv.Quote(r.Calendar.String()) + ": the field was dropped"
			}
			t.Errorf("concurrency rule with calendar: %s: %s; want an error containing %q", cal, got, want)
		}
	}
}

func TestModelValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		r    Rule
		want string
	}{
		{"unknown algorithm", Rule{ID: "x", Match: []Match{{Key: KeyUser}}, Algorithm: 4, Limit: 1, Period: time.Second}, `invalid rule "x": unknown algorithm 4`},
		{"unknown calendar", Rule{ID: "x", Match: []Match{{Key: KeyUser}}, Algorithm: FixedWindow, Limit: 1, Calendar: 4}, `invalid rule "x": unknown calendar 4`},
		{"location without calendar", Rule{ID: "x", Match: []Match{{Key: KeyUser}}, Algorithm: FixedWindow, Limit: 1, Period: time.Second, Location: time.UTC}, `a time zone applies only to calendar windows`},
		{"calendar with period", Rule{ID: "x", Match: []Match{{Key: KeyUser}}, Algorithm: FixedWindow, Limit: 1, Calendar: Day, Period: time.Hour}, `a calendar window has no period`},
	} {
		r := c.r
		if err := r.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	r := Rule{ID: "x", Match: []Match{{Key: KeyUser}}, Algorithm: FixedWindow, Limit: 9, Calendar: Week}
	if err := r.Validate(); err != nil || r.Burst != 9 {
		t.Errorf("calendar week rule: %v, burst %d; want valid with burst 9", err, r.Burst)
	}
}

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func berlin(t *testing.T) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

type windowCase struct {
	at, start, end string
	length         time.Duration
}

func checkWindows(t *testing.T, name string, r *Rule, cases []windowCase) {
	t.Helper()
	for _, c := range cases {
		at, ws, we := mustTime(t, c.at), mustTime(t, c.start), mustTime(t, c.end)
		s, e := r.Window(at)
		if !s.Equal(ws) || !e.Equal(we) {
			t.Errorf("%s: Window(%s) = [%s, %s), want [%s, %s)", name, c.at,
				s.UTC().Format(time.RFC3339Nano), e.UTC().Format(time.RFC3339Nano), c.start, c.end)
		}
		if got := e.Sub(s); got != c.length {
			t.Errorf("%s: Window(%s) lasts %v, want %v", name, c.at, got, c.length)
		}
	}
}

func TestModelWindowEpochAligned(t *testing.T) {
	seven := &Rule{Algorithm: FixedWindow, Period: 7 * time.Second}
	for _, c := range []struct {
		at         time.Time
		start, end int64 // ms since the epoch
	}{
		{time.UnixMilli(1_700_000_000_123), 1_699_999_994_000, 1_700_000_001_000}, // 242 857 142 x 7 s + 6.123 s
		{time.UnixMilli(1_700_000_000_999), 1_699_999_994_000, 1_700_000_001_000},
		{time.UnixMilli(1_700_000_001_000), 1_700_000_001_000, 1_700_000_008_000}, // a boundary starts its window
		{time.UnixMilli(0), 0, 7000},
		{time.UnixMilli(6999), 0, 7000},
		{time.UnixMilli(-1), -7000, 0}, // before 1970: floor, not truncation
		{time.UnixMilli(-6999), -7000, 0},
		{time.UnixMilli(-7000), -7000, 0},
		{time.UnixMilli(-7001), -14_000, -7000},
		{time.Unix(0, -500_000), -7000, 0}, // half a ms before the epoch
		{time.Unix(0, 999_999), 0, 7000},
	} {
		s, e := seven.Window(c.at)
		if s.UnixMilli() != c.start || e.UnixMilli() != c.end || s.Nanosecond()%int(time.Millisecond) != 0 {
			t.Errorf("7s: Window(%d ns) = [%d, %d) ms, want [%d, %d)", c.at.UnixNano(), s.UnixMilli(), e.UnixMilli(), c.start, c.end)
		}
	}
	fifteen := &Rule{Algorithm: FixedWindow, Period: 15 * time.Minute}
	checkWindows(t, "15m", fifteen, []windowCase{
		{"2026-03-29T01:22:30Z", "2026-03-29T01:15:00Z", "2026-03-29T01:30:00Z", 15 * time.Minute},
		{"2026-03-29T01:15:00Z", "2026-03-29T01:15:00Z", "2026-03-29T01:30:00Z", 15 * time.Minute},
		{"2026-03-29T01:14:59.999Z", "2026-03-29T01:00:00Z", "2026-03-29T01:15:00Z", 15 * time.Minute},
		// The zone of t does not matter: 03:22:30+02:00 is 01:22:30Z.
		{"2026-03-29T03:22:30+02:00", "2026-03-29T01:15:00Z", "2026-03-29T01:30:00Z", 15 * time.Minute},
		// Kolkata is +05:30: the window is still aligned to UTC quarter hours.
		{"2026-03-29T06:52:30+05:30", "2026-03-29T01:15:00Z", "2026-03-29T01:30:00Z", 15 * time.Minute},
		{"1969-12-31T23:50:00Z", "1969-12-31T23:45:00Z", "1970-01-01T00:00:00Z", 15 * time.Minute},
		{"1965-06-15T10:07:03Z", "1965-06-15T10:00:00Z", "1965-06-15T10:15:00Z", 15 * time.Minute},
	})
	one := &Rule{Algorithm: FixedWindow, Period: time.Millisecond}
	if s, e := one.Window(time.Unix(5, 123_456_789)); s.UnixNano() != 5_123_000_000 || e.UnixNano() != 5_124_000_000 {
		t.Errorf("1ms: [%d, %d) ns", s.UnixNano(), e.UnixNano())
	}
}

func TestModelWindowDay(t *testing.T) {
	checkWindows(t, "day UTC", &Rule{Algorithm: FixedWindow, Calendar: Day}, []windowCase{
		{"2026-03-29T12:00:00Z", "2026-03-29T00:00:00Z", "2026-03-30T00:00:00Z", 24 * time.Hour},
		{"2026-03-29T00:00:00Z", "2026-03-29T00:00:00Z", "2026-03-30T00:00:00Z", 24 * time.Hour},
		{"2026-03-28T23:59:59.999Z", "2026-03-28T00:00:00Z", "2026-03-29T00:00:00Z", 24 * time.Hour},
		{"1969-12-31T23:59:59Z", "1969-12-31T00:00:00Z", "1970-01-01T00:00:00Z", 24 * time.Hour},
	})
	loc := berlin(t)
	checkWindows(t, "day Berlin", &Rule{Algorithm: FixedWindow, Calendar: Day, Location: loc}, []windowCase{
		// 2026-03-29: clocks go from 02:00 CET to 03:00 CEST; the day is 23 h.
		{"2026-03-29T12:00:00Z", "2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z", 23 * time.Hour},
		{"2026-03-28T23:00:00Z", "2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z", 23 * time.Hour},
		{"2026-03-29T00:59:59Z", "2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z", 23 * time.Hour}, // 01:59:59 CET
		{"2026-03-29T01:00:00Z", "2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z", 23 * time.Hour}, // 03:00 CEST
		{"2026-03-29T21:59:59.999Z", "2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z", 23 * time.Hour},
		{"2026-03-28T22:59:59.999Z", "2026-03-27T23:00:00Z", "2026-03-28T23:00:00Z", 24 * time.Hour},
		{"2026-03-29T22:00:00Z", "2026-03-29T22:00:00Z", "2026-03-30T22:00:00Z", 24 * time.Hour},
		// 2026-10-25: clocks go from 03:00 CEST back to 02:00 CET; the day is 25 h.
		{"2026-10-25T00:30:00Z", "2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z", 25 * time.Hour}, // 02:30 CEST
		{"2026-10-25T01:30:00Z", "2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z", 25 * time.Hour}, // 02:30 CET
		{"2026-10-24T22:00:00Z", "2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z", 25 * time.Hour},
		{"2026-10-25T22:59:59.999Z", "2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z", 25 * time.Hour},
		{"2026-10-25T23:00:00Z", "2026-10-25T23:00:00Z", "2026-10-26T23:00:00Z", 24 * time.Hour},
		{"2026-10-24T21:59:59Z", "2026-10-23T22:00:00Z", "2026-10-24T22:00:00Z", 24 * time.Hour},
	})
}

func TestModelWindowWeek(t *testing.T) {
	checkWindows(t, "week UTC", &Rule{Algorithm: FixedWindow, Calendar: Week}, []windowCase{
		{"2026-03-29T15:00:00Z", "2026-03-23T00:00:00Z", "2026-03-30T00:00:00Z", 168 * time.Hour}, // a Sunday: the previous Monday
		{"2026-03-23T00:00:00Z", "2026-03-23T00:00:00Z", "2026-03-30T00:00:00Z", 168 * time.Hour}, // a Monday
		{"2026-03-30T00:00:00Z", "2026-03-30T00:00:00Z", "2026-04-06T00:00:00Z", 168 * time.Hour},
		{"2026-03-25T12:00:00Z", "2026-03-23T00:00:00Z", "2026-03-30T00:00:00Z", 168 * time.Hour}, // a Wednesday
		// Across the year: 2027-01-01 is a Friday, in the week from Monday 2026-12-28.
		{"2027-01-01T12:00:00Z", "2026-12-28T00:00:00Z", "2027-01-04T00:00:00Z", 168 * time.Hour},
		{"2027-01-03T23:30:00Z", "2026-12-28T00:00:00Z", "2027-01-04T00:00:00Z", 168 * time.Hour},
		{"2026-01-01T00:00:00Z", "2025-12-29T00:00:00Z", "2026-01-05T00:00:00Z", 168 * time.Hour}, // a Thursday
		{"1970-01-01T00:00:00Z", "1969-12-29T00:00:00Z", "1970-01-05T00:00:00Z", 168 * time.Hour},
	})
	loc := berlin(t)
	checkWindows(t, "week Berlin", &Rule{Algorithm: FixedWindow, Calendar: Week, Location: loc}, []windowCase{
		// The week of the spring change is 167 h long, of the autumn change 169 h.
		{"2026-03-29T15:00:00Z", "2026-03-22T23:00:00Z", "2026-03-29T22:00:00Z", 167 * time.Hour},
		{"2026-03-29T22:30:00Z", "2026-03-29T22:00:00Z", "2026-04-05T22:00:00Z", 168 * time.Hour}, // Monday 00:30 CEST
		{"2026-10-25T12:00:00Z", "2026-10-18T22:00:00Z", "2026-10-25T23:00:00Z", 169 * time.Hour},
		{"2027-01-01T12:00:00Z", "2026-12-27T23:00:00Z", "2027-01-03T23:00:00Z", 168 * time.Hour},
		// Sunday 23:30 in UTC is Monday 00:30 in Berlin: a new week there.
		{"2027-01-03T23:30:00Z", "2027-01-03T23:00:00Z", "2027-01-10T23:00:00Z", 168 * time.Hour},
		{"2027-01-03T22:59:59.999Z", "2026-12-27T23:00:00Z", "2027-01-03T23:00:00Z", 168 * time.Hour},
	})
}

func TestModelWindowMonth(t *testing.T) {
	checkWindows(t, "month UTC", &Rule{Algorithm: FixedWindow, Calendar: Month}, []windowCase{
		{"2028-02-15T08:00:00Z", "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z", 29 * 24 * time.Hour}, // leap year
		{"2028-02-29T23:59:59.999Z", "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z", 29 * 24 * time.Hour},
		{"2028-03-01T00:00:00Z", "2028-03-01T00:00:00Z", "2028-04-01T00:00:00Z", 31 * 24 * time.Hour},
		{"2027-02-15T08:00:00Z", "2027-02-01T00:00:00Z", "2027-03-01T00:00:00Z", 28 * 24 * time.Hour},
		{"2026-12-31T23:59:59Z", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z", 31 * 24 * time.Hour},
		{"2027-01-01T00:00:00Z", "2027-01-01T00:00:00Z", "2027-02-01T00:00:00Z", 31 * 24 * time.Hour},
		{"2026-04-30T23:59:59Z", "2026-04-01T00:00:00Z", "2026-05-01T00:00:00Z", 30 * 24 * time.Hour},
	})
	loc := berlin(t)
	checkWindows(t, "month Berlin", &Rule{Algorithm: FixedWindow, Calendar: Month, Location: loc}, []windowCase{
		{"2028-02-15T08:00:00Z", "2028-01-31T23:00:00Z", "2028-02-29T23:00:00Z", 29 * 24 * time.Hour},
		// 23:30 UTC on 29 February is 00:30 on 1 March in Berlin; March 2028
		// loses an hour to summer time (26 March).
		{"2028-02-29T23:30:00Z", "2028-02-29T23:00:00Z", "2028-03-31T22:00:00Z", 31*24*time.Hour - time.Hour},
		{"2028-02-29T22:59:59.999Z", "2028-01-31T23:00:00Z", "2028-02-29T23:00:00Z", 29 * 24 * time.Hour},
		{"2026-12-15T12:00:00Z", "2026-11-30T23:00:00Z", "2026-12-31T23:00:00Z", 31 * 24 * time.Hour},
		{"2026-12-31T23:30:00Z", "2026-12-31T23:00:00Z", "2027-01-31T23:00:00Z", 31 * 24 * time.Hour}, // already January
		{"2026-10-10T12:00:00Z", "2026-09-30T22:00:00Z", "2026-10-31T23:00:00Z", 31*24*time.Hour + time.Hour},
	})
}

// Every time falls in the window Window returns, windows tile the time line,
// and a window's start maps to that same window.
func TestModelWindowProperties(t *testing.T) {
	loc := berlin(t)
	rs := []*Rule{
		{Algorithm: FixedWindow, Period: 7 * time.Second},
		{Algorithm: FixedWindow, Period: 15 * time.Minute},
		{Algorithm: FixedWindow, Period: 13 * time.Millisecond},
		{Algorithm: FixedWindow, Calendar: Day},
		{Algorithm: FixedWindow, Calendar: Day, Location: loc},
		{Algorithm: FixedWindow, Calendar: Week, Location: loc},
		{Algorithm: FixedWindow, Calendar: Month, Location: loc},
		{Algorithm: FixedWindow, Calendar: Month},
	}
	rng := rand.New(rand.NewPCG(7, 11))
	lo, hi := mustTime(t, "1960-01-01T00:00:00Z").UnixMilli(), mustTime(t, "2040-01-01T00:00:00Z").UnixMilli()
	for i := 0; i < 20000; i++ {
		r := rs[i%len(rs)]
		at := time.UnixMilli(lo + rng.Int64N(hi-lo))
		s, e := r.Window(at)
		if at.Before(s) || !at.Before(e) {
			t.Fatalf("rule %v/%v/%v: %s not in [%s, %s)", r.Period, r.Calendar, r.Location, at.UTC(), s.UTC(), e.UTC())
		}
		if s2, e2 := r.Window(s); !s2.Equal(s) || !e2.Equal(e) {
			t.Fatalf("rule %v/%v: the window's start %s maps to [%s, %s)", r.Period, r.Calendar, s.UTC(), s2.UTC(), e2.UTC())
		}
		if s3, _ := r.Window(e); !s3.Equal(e) {
			t.Fatalf("rule %v/%v: the next window starts at %s, want the end %s", r.Period, r.Calendar, s3.UTC(), e.UTC())
		}
		if _, e4 := r.Window(s.Add(-time.Millisecond)); !e4.Equal(s) {
			t.Fatalf("rule %v/%v: the previous window ends at %s, want %s", r.Period, r.Calendar, e4.UTC(), s.UTC())
		}
	}
}

// Zones whose clocks jump at midnight (America/Santiago in September,
// America/Havana in March, Africa/Cairo in April) start some days at 01:00;
// Lord Howe moves by 30 minutes, Kathmandu is +05:45. Every hour of 2026
// and 2027, in each, falls in its window, windows tile, and a window is the
// local date's span: from its first instant to the next date's.
func TestModelWindowEveryHourInOddZones(t *testing.T) {
	for _, zone := range []string{"America/Santiago", "America/Havana", "Africa/Cairo", "Australia/Lord_Howe", "Asia/Kathmandu", "Europe/Berlin"} {
		loc, err := time.LoadLocation(zone)
		if err != nil {
			t.Fatal(err)
		}
		for _, cal := range []Calendar{Day, Week, Month} {
			r := &Rule{Algorithm: FixedWindow, Calendar: cal, Location: loc}
			for at := mustTime(t, "2026-01-01T00:30:00Z"); at.Year() < 2028; at = at.Add(time.Hour) {
				s, e := r.Window(at)
				if at.Before(s) || !at.Before(e) {
					t.Fatalf("%s %s: %s not in [%s, %s)", zone, cal, at.In(loc), s.In(loc), e.In(loc))
				}
				if _, e0 := r.Window(s.Add(-time.Nanosecond)); !e0.Equal(s) {
					t.Fatalf("%s %s: the window before %s ends at %s", zone, cal, s.In(loc), e0.In(loc))
				}
				// The window starts on the date it names and the instant before
				// it is on an earlier date.
				if sd, ad := s.In(loc).Format("2006-01-02"), s.Add(-time.Nanosecond).In(loc).Format("2006-01-02"); sd == ad {
					t.Fatalf("%s %s: %s is not the first instant of its date", zone, cal, s.In(loc))
				}
				if h := e.Sub(s).Hours(); cal == Day && (h < 22.9 || h > 25.1) {
					t.Fatalf("%s: a day of %.2f h from %s", zone, h, s.In(loc))
				}
			}
		}
	}
	loc, _ := time.LoadLocation("America/Santiago")
	s, e := (&Rule{Algorithm: FixedWindow, Calendar: Day, Location: loc}).Window(mustTime(t, "2026-09-06T03:30:00Z")) // 23:30 -04 on the 5th
	if want := mustTime(t, "2026-09-06T04:00:00Z"); !s.Equal(mustTime(t, "2026-09-05T04:00:00Z")) || !e.Equal(want) {
		t.Errorf("Santiago, 5 September: [%s, %s), want the day to end at the jump, 01:00 -03 on the 6th", s.In(loc), e.In(loc))
	}
}
