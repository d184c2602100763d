package replay

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/sluice-rl/sluice/rules"
)

// ScenarioScore is how the detector did on one injected scenario.
type ScenarioScore struct {
	Scenario string
	Attack   bool
	Scope    map[string]string
	// Rules is how many emitted rules cover the scenario's scope: for an
	// attack, hits; for a benign scenario, false positives.
	Rules int
	// Detected: some rule covers an attack's scope. TimeToDetect is event
	// time from the attack's start to the end of the window whose rule
	// covered it first.
	Detected     bool
	TimeToDetect time.Duration
}

// Score is a replay's rules judged against its injected scenarios.
type Score struct {
	Scenarios []ScenarioScore
	// TruePositives are the rules that cover an attack's scope;
	// FalsePositives those that cover a benign scenario's; Unlabelled those
	// that cover no scenario (they name clients of the background traffic).
	TruePositives, FalsePositives int
	Unlabelled                    []rules.Rule
	// Precision is TruePositives / (TruePositives + FalsePositives); Recall
	// the fraction of attacks detected.
	Precision, Recall float64
}

// Covers reports whether rule r covers a label scope: for every descriptor
// of the scope, r matches exactly that value (r may be narrower, e.g. the
// scope's JA4 on one route). An empty scope is covered by nothing.
func Covers(r *rules.Rule, scope map[string]string) bool {
	if len(scope) == 0 {
		return false
	}
	for key, val := range scope {
		if !slices.ContainsFunc(r.Match, func(m rules.Match) bool { return m.KeyName() == key && m.Value == val }) {
			return false
		}
	}
	return true
}

// ScoreRules judges the rules of rep against the scenarios of spans and
// the labels rep saw.
func ScoreRules(rep *Report, spans []Span) Score {
	var s Score
	covered := make([]bool, len(rep.DynamicRules))
	attacks := 0
	for _, sp := range spans {
		l := rep.Labels[sp.Scenario]
		sc := ScenarioScore{Scenario: sp.Scenario, Attack: sp.Attack, Scope: l.Scope}
		for i := range rep.DynamicRules {
			r := &rep.DynamicRules[i]
			if !Covers(r, l.Scope) {
				continue
			}
			covered[i] = true
			sc.Rules++
			at := time.UnixMilli(r.Version)
			if sp.Attack && (!sc.Detected || at.Sub(sp.Start) < sc.TimeToDetect) {
				sc.Detected, sc.TimeToDetect = true, at.Sub(sp.Start)
			}
		}
		if sp.Attack {
			attacks++
			s.TruePositives += sc.Rules
			if sc.Detected {
				s.Recall++
			}
		} else {
			s.FalsePositives += sc.Rules
		}
		s.Scenarios = append(s.Scenarios, sc)
	}
	for i, c := range covered {
		if !c {
			s.Unlabelled = append(s.Unlabelled, rep.DynamicRules[i])
		}
	}
	if attacks > 0 {
		s.Recall /= float64(attacks)
	}
	s.Precision = 1
	if n := s.TruePositives + s.FalsePositives; n > 0 {
		s.Precision = float64(s.TruePositives) / float64(n)
	}
	return s
}

// Print writes the score as a table.
func (s Score) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tKIND\tSCOPE\tRULES\tDETECTED\tTIME TO DETECT")
	for _, sc := range s.Scenarios {
		kind, det, ttd := "benign", "-", "-"
		if sc.Attack {
			kind, det = "attack", "no"
			if sc.Detected {
				det, ttd = "yes", sc.TimeToDetect.String()
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%v\t%d\t%s\t%s\n", sc.Scenario, kind, sc.Scope, sc.Rules, det, ttd)
	}
	tw.Flush()
	fmt.Fprintf(w, "precision %.3f (%d true, %d false positives), recall %.3f, %d rules on background clients\n",
		s.Precision, s.TruePositives, s.FalsePositives, s.Recall, len(s.Unlabelled))
}
