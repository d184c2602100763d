package replay_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/replay"
	"github.com/sluice-rl/sluice/rules"
)

// TestReplayBackendDegrades is issue 22's scenario through the whole
// replay: a backend's error rate rises from 1% to 40% for two minutes of
// event time. The adaptive rule falls to the controller's level within
// 10 s, sheddable traffic is shed first, critical traffic never, and all
// recover within 30 s after the backend heals; the report shows the factor
// and the sheds over time.
func TestReplayBackendDegrades(t *testing.T) {
	set, err := rules.Parse("adaptive.yaml", []byte(`
domain: replay
rules:
  - {id: per-route, match: [{key: route}], limit: 200, period: 1s, burst: 400, adaptive: {floor: 0.2}}
shedding:
  default: normal
  routes: {/v1/search: sheddable, /v1/items: sheddable, /v1/login: critical, /v1/orders: critical}
`))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := hangGuard(t)
	defer cancel()
	const degradeAt, degradeFor = 60 * time.Second, 2 * time.Minute
	rep, err := replay.Run(ctx, replay.Options{Rules: set,
		Backend: &replay.Backend{ErrorRate: 0.01, DegradedErrorRate: 0.4, DegradeAt: degradeAt, DegradeFor: degradeFor, Seed: 1}},
		replay.Generate(replay.Scenario{Duration: 5 * time.Minute, Clients: 200}))
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Adaptive) < 250 {
		t.Fatalf("%d seconds in the adaptive series, want about 300", len(rep.Adaptive))
	}
	start := rep.Adaptive[0].Time
	var atFloor, firstSheddable, firstNormal time.Duration = -1, -1, -1
	critical := 0
	for _, a := range rep.Adaptive {
		off := a.Time.Sub(start)
		if off >= degradeAt && atFloor < 0 && a.Factor <= 0.2 {
			atFloor = off
		}
		if a.Shed[rules.Sheddable] > 0 && firstSheddable < 0 {
			firstSheddable = off
		}
		if a.Shed[rules.Normal] > 0 && firstNormal < 0 {
			firstNormal = off
		}
		critical += a.Shed[rules.Critical]
		if off >= degradeAt+degradeFor+30*time.Second && off < degradeAt+degradeFor+2*time.Minute {
			if a.Factor != 1 || a.Shed != [rules.NumPriorities]int{} {
				t.Errorf("at %s, %s after healing: factor %v, shed %v; want 1 and none", off, off-degradeAt-degradeFor, a.Factor, a.Shed)
			}
		}
		if off < degradeAt-time.Second && a.Shed != [rules.NumPriorities]int{} {
			t.Errorf("at %s, before the degradation: shed %v", off, a.Shed)
		}
	}
	if atFloor < 0 || atFloor-degradeAt > 10*time.Second {
		t.Errorf("the factor reached the rule's floor (0.2) at %s, want within 10 s of %s", atFloor, degradeAt)
	}
	if firstSheddable < degradeAt || firstNormal >= 0 && firstNormal < firstSheddable {
		t.Errorf("first sheds: sheddable at %s, normal at %s; want sheddable first, after %s", firstSheddable, firstNormal, degradeAt)
	}
	if critical > 0 {
		t.Errorf("%d critical requests shed", critical)
	}
	var out bytes.Buffer
	rep.Print(&out)
	if !strings.Contains(out.String(), "Backend health, adaptive factor and load shedding") {
		t.Errorf("the report has no adaptive section:\n%s", out.String())
	}
	t.Log("\n" + out.String()[:min(out.Len(), 2500)])
}
