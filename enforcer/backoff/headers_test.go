package backoff

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// hdr builds a header from "Name: value" lines; a name may repeat.
func hdr(lines ...string) http.Header {
	h := http.Header{}
	for _, l := range lines {
		name, value, _ := strings.Cut(l, ":")
		h.Add(name, strings.TrimSpace(value))
	}
	return h
}

func TestParseHeaders(t *testing.T) {
	date := t0.Add(7 * time.Second).Format(http.TimeFormat)
	cases := []struct {
		name   string
		h      http.Header
		want   Signal
		reason string
	}{
		{"none", hdr(), Signal{RetryAfter: -1, Remaining: -1, Reset: -1}, ""},

		// Retry-After
		{"retry-after seconds", hdr("Retry-After: 3"), Signal{RetryAfter: 3 * time.Second, Remaining: -1, Reset: -1}, ""},
		{"retry-after zero", hdr("Retry-After: 0"), Signal{RetryAfter: 0, Remaining: -1, Reset: -1}, ""},
		{"retry-after date", hdr("Retry-After: " + date), Signal{RetryAfter: 7 * time.Second, Remaining: -1, Reset: -1}, "IMF-fixdate"},
		{"retry-after date vs Date", hdr("Retry-After: "+date, "Date: "+t0.Add(5*time.Second).Format(http.TimeFormat)),
			Signal{RetryAfter: 2 * time.Second, Remaining: -1, Reset: -1}, "relative to the server's Date, not our clock"},
		{"retry-after RFC 850 date", hdr("Retry-After: Sunday, 01-Mar-26 12:00:30 GMT"), Signal{RetryAfter: 30 * time.Second, Remaining: -1, Reset: -1}, "obsolete form"},
		{"retry-after asctime", hdr("Retry-After: Sun Mar  1 12:01:00 2026"), Signal{RetryAfter: time.Minute, Remaining: -1, Reset: -1}, "obsolete form"},
		{"retry-after past date", hdr("Retry-After: " + t0.Add(-time.Hour).Format(http.TimeFormat)), Signal{RetryAfter: 0, Remaining: -1, Reset: -1}, "a past date is no wait"},
		{"retry-after negative", hdr("Retry-After: -5"), Signal{RetryAfter: -1, Remaining: -1, Reset: -1}, "not delta-seconds"},
		{"retry-after decimal", hdr("Retry-After: 1.5"), Signal{RetryAfter: -1, Remaining: -1, Reset: -1}, "not delta-seconds"},
		{"retry-after garbage", hdr("Retry-After: soon"), Signal{RetryAfter: -1, Remaining: -1, Reset: -1}, ""},
		{"retry-after huge", hdr("Retry-After: 99999999999999999999999999"), Signal{RetryAfter: maxDuration, Remaining: -1, Reset: -1}, "saturates"},
		{"retry-after year 9999", hdr("Retry-After: Fri, 31 Dec 9999 23:59:59 GMT"), Signal{RetryAfter: maxDuration, Remaining: -1, Reset: -1}, "saturates"},

		// draft RateLimit, as enforcer/headers.go writes it
		{"sluice deny", hdr(`RateLimit-Policy: "per-ip";q=60;w=60`, `RateLimit: "per-ip";r=0;t=58`, "Retry-After: 1",
			"X-RateLimit-Remaining: 0", "X-RateLimit-Reset: 58"),
			Signal{RetryAfter: time.Second, Remaining: 0, Reset: 58 * time.Second, Policy: "per-ip"}, ""},
		{"sluice allow, two policies", hdr(`RateLimit-Policy: "per-ip";q=60;w=60, "per-key";q=40;w=2`, `RateLimit: "per-key";r=39;t=1`),
			Signal{RetryAfter: -1, Remaining: 39, Reset: time.Second, Policy: "per-key"}, ""},
		{"draft example", hdr(`RateLimit: "default";r=50;t=30`), Signal{RetryAfter: -1, Remaining: 50, Reset: 30 * time.Second, Policy: "default"}, ""},
		{"no t: the policy's w", hdr(`RateLimit-Policy: "burst";q=100;w=60,"daily";q=1000;w=86400`, `RateLimit: "daily";r=0`),
			Signal{RetryAfter: -1, Remaining: 0, Reset: 86400 * time.Second, Policy: "daily"}, ""},
		{"no t, no policy", hdr(`RateLimit: "default";r=0`), Signal{RetryAfter: -1, Remaining: 0, Reset: -1, Policy: "default"}, ""},
		{"sluice block: q=0, no t", hdr(`RateLimit-Policy: "blocked-net";q=0;w=1`, `RateLimit: "blocked-net";r=0`, "Sluice-Reason: blocked"),
			Signal{RetryAfter: -1, Remaining: 0, Reset: -1, Policy: "blocked-net", Blocked: true}, "no wait makes room: not the w"},
		{"no t, malformed policy", hdr(`RateLimit-Policy: "daily";w=60`, `RateLimit: "daily";r=0`),
			Signal{RetryAfter: -1, Remaining: 0, Reset: -1, Policy: "daily"}, "q is required"},
		{"least remaining binds", hdr(`RateLimit: "a";r=5;t=1, "b";r=0;t=9, "c";r=0;t=4`),
			Signal{RetryAfter: -1, Remaining: 0, Reset: 9 * time.Second, Policy: "b"}, "ties: the longest reset"},
		{"split over lines", hdr(`RateLimit: "a";r=5;t=1`, `RateLimit: "b";r=2;t=3`),
			Signal{RetryAfter: -1, Remaining: 2, Reset: 3 * time.Second, Policy: "b"}, ""},
		{"other parameters", hdr(`RateLimit: "p";pk=:cHsdsRa894==:;r=1;acme-x=?1;t=2;z="s";d=1.5`),
			Signal{RetryAfter: -1, Remaining: 1, Reset: 2 * time.Second, Policy: "p"}, "comments are allowed"},
		{"repeated parameter: the last", hdr(`RateLimit: "p";r=9;r=1`), Signal{RetryAfter: -1, Remaining: 1, Reset: -1, Policy: "p"}, ""},
		{"escaped name", hdr(`RateLimit: "a\"b\\c";r=1`), Signal{RetryAfter: -1, Remaining: 1, Reset: -1, Policy: `a"b\c`}, ""},
		{"draft wins over legacy", hdr(`RateLimit: "p";r=7;t=3`, "X-RateLimit-Remaining: 0", "X-RateLimit-Reset: 60"),
			Signal{RetryAfter: -1, Remaining: 7, Reset: 3 * time.Second, Policy: "p"}, ""},
		{"huge t", hdr(`RateLimit: "p";r=0;t=999999999999999`), Signal{RetryAfter: -1, Remaining: 0, Reset: maxDuration, Policy: "p"}, "saturates"},

		// malformed RateLimit: ignored whole, the legacy headers used instead
		{"token name", hdr(`RateLimit: default;r=0;t=5`, "X-RateLimit-Remaining: 3"), Signal{RetryAfter: -1, Remaining: 3, Reset: -1}, "the item must be a String"},
		{"negative r", hdr(`RateLimit: "p";r=-1;t=5`), Signal{RetryAfter: -1, Remaining: -1, Reset: -1}, ""},
		{"decimal r", hdr(`RateLimit: "p";r=1.5`), Signal{RetryAfter: -1, Remaining: -1, Reset: -1}, ""},
		{"string t", hdr(`RateLimit: "p";r=0;t="5"`), Signal{RetryAfter: -1, Remaining: -1, Reset: -1}, ""},
		{"no r", hdr(`RateLimit: "p";t=5`), Signal{RetryAfter: -1, Remaining: -1, Reset: -1}, "r is required"},
		{"one bad member spoils the field", hdr(`RateLimit: "a";r=0;t=5, "b";t=1`), Signal{RetryAfter: -1, Remaining: -1, Reset: -1}, ""},
		{"trailing comma", hdr(`RateLimit: "p";r=0;t=5,`), Signal{RetryAfter: -1, Remaining: -1, Reset: -1}, ""},
		{"unterminated string", hdr(`RateLimit: "p;r=0;t=5`), Signal{RetryAfter: -1, Remaining: -1, Reset: -1}, ""},
		{"16-digit integer", hdr(`RateLimit: "p";r=1234567890123456`), Signal{RetryAfter: -1, Remaining: -1, Reset: -1}, "Integers have at most 15 digits"},
		{"inner list", hdr(`RateLimit: ("p" "q");r=0;t=5`), Signal{RetryAfter: -1, Remaining: -1, Reset: -1}, "not a String"},
		{"uppercase key", hdr(`RateLimit: "p";R=0;t=5`), Signal{RetryAfter: -1, Remaining: -1, Reset: -1}, "keys are lowercase"},
		{"non-ASCII", hdr("RateLimit: \"p\u00e9\";r=0"), Signal{RetryAfter: -1, Remaining: -1, Reset: -1}, ""},
		{"empty", hdr(`RateLimit: `, "X-RateLimit-Remaining: 2", "X-RateLimit-Reset: 4"), Signal{RetryAfter: -1, Remaining: 2, Reset: 4 * time.Second}, "an empty list binds nothing"},

		// legacy
		{"legacy", hdr("X-RateLimit-Limit: 60", "X-RateLimit-Remaining: 0", "X-RateLimit-Reset: 58"),
			Signal{RetryAfter: -1, Remaining: 0, Reset: 58 * time.Second}, ""},
		{"legacy epoch reset", hdr("X-RateLimit-Remaining: 0", "X-RateLimit-Reset: "+strconv.FormatInt(t0.Unix()+90, 10)),
			Signal{RetryAfter: -1, Remaining: 0, Reset: 90 * time.Second}, "GitHub's form"},
		{"legacy epoch past", hdr("X-RateLimit-Remaining: 0", "X-RateLimit-Reset: 1000000000"),
			Signal{RetryAfter: -1, Remaining: 0, Reset: 0}, ""},
		{"legacy garbage reset", hdr("X-RateLimit-Remaining: 0", "X-RateLimit-Reset: tomorrow"),
			Signal{RetryAfter: -1, Remaining: 0, Reset: -1}, ""},
		{"legacy garbage remaining", hdr("X-RateLimit-Remaining: -3", "X-RateLimit-Reset: 5"),
			Signal{RetryAfter: -1, Remaining: -1, Reset: -1}, "no remaining, no reset"},
		{"legacy huge remaining", hdr("X-RateLimit-Remaining: 123456789012345678901234567890"),
			Signal{RetryAfter: -1, Remaining: 1<<63 - 1, Reset: -1}, "saturates"},

		// from a cache
		{"cached", hdr("Age: 30", "Retry-After: 2", `RateLimit: "p";r=0;t=5`, "X-RateLimit-Remaining: 0"),
			Signal{RetryAfter: 2 * time.Second, Remaining: -1, Reset: -1}, "draft §7.3: stale"},
		{"age 0", hdr("Age: 0", `RateLimit: "p";r=0;t=5`), Signal{RetryAfter: -1, Remaining: 0, Reset: 5 * time.Second, Policy: "p"}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := ParseHeaders(c.h, t0); got != c.want {
				t.Errorf("ParseHeaders(%v) = %+v, want %+v %s", c.h, got, c.want, c.reason)
			}
		})
	}
}

// FuzzParseHeaders: no input panics the parser, and what it returns is
// either unknown (-1) or a sane value.
func FuzzParseHeaders(f *testing.F) {
	seeds := [][5]string{
		{"1", `"per-ip";r=0;t=58`, `"per-ip";q=60;w=60`, "0", "58"},
		{"Fri, 31 Dec 9999 23:59:59 GMT", `"a";r=5;t=1, "b";r=0;t=9`, `"a";q=1;w=1,"b";q=2`, "3", "1700000000"},
		{"-1", `"p";r=-1`, `"p";q=-1;w=0`, "-1", "-1"},
		{"99999999999999999999999", `"p";r=999999999999999;t=999999999999999`, `"p";q=1;w=999999999999999`, "99999999999999999999999", "99999999999999999999999"},
		{"", `("a" "b");r=1, "c";r=2;x=%"%c3%a9";y=:YWJj:;z=@1;w=?1;v=1.5`, `"c";q=1;qu="requests";w=4`, "", ""},
		{"Sunday, 01-Mar-26 12:00:30 GMT", `"p";r=0`, `"p";q=1;w=7`, "0", "x"},
		{"soon", `"\"`, `";`, "1e9", "0x10"},
	}
	for _, s := range seeds {
		f.Add(s[0], s[1], s[2], s[3], s[4])
	}
	f.Fuzz(func(t *testing.T, retryAfter, rateLimit, policy, remaining, reset string) {
		h := http.Header{}
		h.Set("Retry-After", retryAfter)
		h.Set("RateLimit", rateLimit)
		h.Set("RateLimit-Policy", policy)
		h.Set("X-RateLimit-Remaining", remaining)
		h.Set("X-RateLimit-Reset", reset)
		s := ParseHeaders(h, t0)
		if s.RetryAfter < -1 || s.Remaining < -1 || s.Reset < -1 {
			t.Fatalf("%+v: below -1", s)
		}
		if s.Policy != "" && s.Remaining < 0 {
			t.Fatalf("%+v: a policy without remaining", s)
		}
		// The transport's use of it: waits within [0, cap], whatever it says.
		d := Decorrelated{Base: 100 * time.Millisecond, Cap: 20 * time.Second}
		if w := d.NextAfter(floor(s)); w != -1 && (w < floor(s) || w > d.Cap) {
			t.Fatalf("%+v: wait %v outside [floor, cap]", s, w)
		}
	})
}
