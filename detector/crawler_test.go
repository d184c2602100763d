package detector

import (
	"testing"
	"time"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
)

// Googlebot from Google's AS15169 is left alone; "Googlebot" from a hosting
// ASN is flagged, scoped to its address; a record without an ASN is not
// judged.
func TestFakeCrawlers(t *testing.T) {
	l := stage.NewLocal([]stage.Stage{must(NewFakeCrawlers(FakeCrawlerOptions{}))}, 2, time.Second)
	gb := "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
	add := func(i int, ip string, asn uint32, ua string) {
		l.Observe(i, &decisionpb.Decision{Version: 1, EventTimeMs: t0.Add(time.Duration(i) * time.Second).UnixMilli(), Outcome: decisionpb.Outcome_OUTCOME_ALLOWED,
			UserAgent: ua, Descriptors: &decisionpb.Descriptors{ClientIp: ip, Asn: asn}})
	}
	for i := range 10 {
		add(i, "66.249.73.135", 15169, gb)         // the real one
		add(i, "203.0.113.5", 14061, gb)           // a hosting provider's
		add(i, "198.51.100.3", 0, gb)              // ASN unknown
		add(i, "192.0.2.44", 14061, "curl/8.4.0")  // no claim
		add(i, "192.0.2.45", 16509, "BingBot/2.0") // Amazon claiming bingbot
	}
	got := l.Advance(t0.Add(time.Hour)).Rules
	want := map[string]bool{"203.0.113.5": true, "192.0.2.45": true}
	for _, r := range got {
		if !want[r.Match[0].Value] || r.Origin != "detector/fake-crawler" || r.Mode != rules.Shadow {
			t.Errorf("unexpected rule %s: %s", r.ID, r.Reason)
		}
		delete(want, r.Match[0].Value)
	}
	if len(want) != 0 {
		t.Errorf("not flagged: %v", want)
	}
}
