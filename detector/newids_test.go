package detector

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/sketch"
)

// runNewIDs feeds 10 minutes of returning clients plus extra through a
// 4-partition pipeline with the new-identities signal.
func runNewIDs(t *testing.T, extra func(s int, at time.Time) []*decisionpb.Decision) []rules.Rule {
	t.Helper()
	g := &traffic{r: rand.New(rand.NewPCG(21, 22)), clients: 3000, rate: 150}
	l := stage.NewLocal([]stage.Stage{must(NewNewIdentities(NewIdentityOptions{}))}, 4, 5*time.Second)
	var out []rules.Rule
	for s := range 10 * 60 {
		at := t0.Add(time.Duration(s) * time.Second)
		recs := g.second(at, 1)
		recs = append(recs, extra(s, at)...)
		for _, d := range recs {
			if d.Status == 0 {
				d.Status = 200
			}
			l.Observe(int(sketch.Hash64(d.Descriptors.ClientIp)%4), d)
		}
		out = append(out, l.Advance(at.Add(-5*time.Second)).Rules...)
	}
	return append(out, l.Advance(t0.Add(time.Hour)).Rules...)
}

// freshSecond is one second of n requests from addresses never seen
// before, on route, answered status.
func freshSecond(at time.Time, n int, seq *int, route string, status uint32) []*decisionpb.Decision {
	var out []*decisionpb.Decision
	for i := range n {
		*seq++
		out = append(out, &decisionpb.Decision{Version: 1, EventTimeMs: at.Add(time.Duration(i) * time.Second / time.Duration(n)).UnixMilli(), Outcome: decisionpb.Outcome_OUTCOME_ALLOWED,
			Status: status, Descriptors: &decisionpb.Descriptors{ClientIp: fmt.Sprintf("172.%d.%d.%d", 16+*seq>>16, (*seq>>8)&255, *seq&255), Route: route}})
	}
	return out
}

// A botnet of fresh addresses failing logins: /login is flagged within a
// few windows. A flash crowd of fresh visitors who succeed: nothing.
func TestNewIdentities(t *testing.T) {
	seq := 0
	got := runNewIDs(t, func(s int, at time.Time) []*decisionpb.Decision {
		if s < 6*60 {
			return nil
		}
		return freshSecond(at, 300, &seq, "/login", 401)
	})
	if len(got) == 0 {
		t.Fatal("the botnet of new addresses was not flagged")
	}
	r := got[0]
	if r.Origin != "detector/new-identities" || r.Match[0].Value != "/login" {
		t.Fatalf("rule %+v: want /login", r)
	}
	if d := time.UnixMilli(r.Version).Sub(t0.Add(6 * time.Minute)); d < 0 || d > 30*time.Second {
		t.Errorf("flagged %v after the botnet began", d)
	}
	if err := r.Validate(); err != nil {
		t.Error(err)
	}

	seq = 0
	crowd := runNewIDs(t, func(s int, at time.Time) []*decisionpb.Decision {
		if s < 6*60 || s > 8*60 {
			return nil
		}
		return freshSecond(at, 300, &seq, "/", 200)
	})
	for _, r := range crowd {
		t.Errorf("flash crowd flagged: %s", r.Reason)
	}
}

func TestNewIdentitiesCheckpoint(t *testing.T) {
	s := must(NewNewIdentities(NewIdentityOptions{}))
	l := stage.NewLocal([]stage.Stage{s}, 2, time.Second)
	seq := 0
	for i := range 120 {
		for _, d := range freshSecond(t0.Add(time.Duration(i)*time.Second), 5, &seq, routes[i%len(routes)], 200) {
			l.Observe(i, d)
		}
		l.Advance(t0.Add(time.Duration(i) * time.Second))
	}
	state, err := s.MarshalState()
	if err != nil {
		t.Fatal(err)
	}
	other := must(NewNewIdentities(NewIdentityOptions{}))
	if err := other.UnmarshalState(state); err != nil {
		t.Fatal(err)
	}
	again, err := other.MarshalState()
	if err != nil {
		t.Fatal(err)
	}
	if string(again) != string(state) {
		t.Fatal("the restored state encodes differently")
	}
	if err := other.UnmarshalState(state[:len(state)-3]); err == nil {
		t.Fatal("a truncated state was accepted")
	}
}

func FuzzNewIdentitiesPartial(f *testing.F) {
	fuzzPartial(f, must(NewNewIdentities(NewIdentityOptions{K: 2})), &decisionpb.Decision{Status: 401, Descriptors: &decisionpb.Descriptors{ClientIp: "192.0.2.1", Route: "/login"}})
}
