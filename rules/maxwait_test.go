package rules

import (
	"strings"
	"testing"
)

// TestWaitsThatCannotBeRepresented: rules whose longest wait or reset is
// past MaxWait (traefik #8235: negative X-RateLimit-Reset, RateLimit t= and
// duration_until_reset, and a Retry-After of 1 for a sliding window of
// 2000000h) are refused, naming the rule and the bound; rules at the bound
// load.
func TestWaitsThatCannotBeRepresented(t *testing.T) {
	for _, c := range []struct{ rule, want string }{
		{"{id: tb, match: [{key: user}], limit: 1, period: 2562047h, burst: 2}",
			`invalid rule "tb": its longest wait or reset, 585 years (the time to refill from empty, burst × period ÷ limit), is more than sluice represents (100 years, rules.MaxWait)`},
		{"{id: day, match: [{key: user}], limit: 1, period: 24h, burst: 200000}",
			`invalid rule "day": its longest wait or reset, 548 years (the time to refill from empty, burst × period ÷ limit), is more than sluice represents (100 years, rules.MaxWait)`},
		{"{id: sw, match: [{key: user}], limit: 1, period: 2000000h, algorithm: sliding_window}",
			`invalid rule "sw": its longest wait or reset, 457 years (twice its period, as a burst fades over two windows), is more than sluice represents (100 years, rules.MaxWait)`},
		{"{id: fw, match: [{key: user}], limit: 1, period: 1000000h, algorithm: fixed_window}",
			`invalid rule "fw": its longest wait or reset, 114 years (its period), is more than sluice represents`},
		{"{id: co, match: [{key: user}], limit: 1, lease: 1000000h, algorithm: concurrency}",
			`invalid rule "co": its longest wait or reset, 114 years (its lease), is more than sluice represents`},
	} {
		_, err := Parse("w.yaml", []byte("domain: d\nrules:\n  - "+c.rule+"\n"))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s:\n got %v\nwant …%s…", c.rule, err, c.want)
		}
	}
	for _, ok := range []string{
		"{id: tb, match: [{key: user}], limit: 1, period: 24h, burst: 36500}", // 100 years to refill
		"{id: sw, match: [{key: user}], limit: 1, period: 438000h, algorithm: sliding_window}",
		"{id: fw, match: [{key: user}], limit: 1, period: 876000h, algorithm: fixed_window}",
	} {
		if _, err := Parse("ok.yaml", []byte("domain: d\nrules:\n  - "+ok+"\n")); err != nil {
			t.Errorf("%s at the bound: %v", ok, err)
		}
	}
}
