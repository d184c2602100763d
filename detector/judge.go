package detector

import (
	"math"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/sketch"
)

// recordRoute is the route a record counts against: its route, else its
// path without the query. ok is false for none, or one with a NUL (the
// byte the signals separate key parts with): no rule can be scoped to it,
// and an empty value would match every route.
func recordRoute(x *decisionpb.Descriptors) (route string, ok bool) {
	route = x.GetRoute()
	if route == "" {
		route, _, _ = strings.Cut(x.GetPath(), "?")
	}
	return route, route != "" && strings.IndexByte(route, 0) < 0
}

// thresholds are a signal's robust z-scores: Trigger makes a window
// anomalous, below Clear a scope's streak ends (hysteresis).
type thresholds struct{ trigger, clear float64 }

// judge scores share x against base (its z is 0 unless scored), counts the
// scope's streak of anomalous windows, where anomalous also needs gate,
// and teaches the scope's own baseline, if teach: an anomalous window only
// as far as the trigger (winsorised), so that an attack does not raise its
// own bar at once while a lasting change of traffic moves it over a
// baseline's length of windows. It returns whether the window is anomalous.
func judge(own, base *sketch.MAD, x float64, scored, gate, teach bool, th thresholds, streak *int) bool {
	z := 0.0
	if scored && base.Ready() {
		z = score(base, x)
	}
	anomalous := gate && z >= th.trigger
	switch {
	case anomalous:
		*streak++
	case z < th.clear:
		*streak = 0
	}
	if teach {
		learn := x
		if anomalous && base.Ready() {
			learn = math.Min(x, base.Median()+th.trigger*deviation(base))
		}
		own.Update(learn)
	}
	return anomalous
}

// score is a share's robust z-score against a baseline of shares: its
// distance from the median in median absolute deviations (scaled by 1.4826
// to a standard deviation), with a floor of 0.02 or a tenth of the median
// on the deviation, so that a scope whose share never moved is not flagged
// for a small move.
func score(base *sketch.MAD, x float64) float64 {
	return (x - base.Median()) / deviation(base)
}

// deviation is a baseline's robust standard deviation, with score's floor.
func deviation(base *sketch.MAD) float64 {
	med := base.Median()
	return math.Max(1.4826*base.MAD(), math.Max(0.02, 0.1*med))
}

// dynamicRule completes a signal's rule r (id, match, limit, period,
// origin, reason and evidence set) as every detector rule is: a burst of
// its limit, shadow mode unless enforce, expiring ttl after the window's
// end and versioned by it, with the window in its evidence.
func dynamicRule(w stage.Window, ttl time.Duration, enforce bool, r rules.Rule) rules.Rule {
	r.Burst = r.Limit
	r.Mode = rules.Shadow
	if enforce {
		r.Mode = rules.Enforce
	}
	if r.Evidence == nil {
		r.Evidence = map[string]string{}
	}
	r.Evidence["window_start"] = w.Start.UTC().Format(time.RFC3339)
	r.Evidence["window_end"] = w.End.UTC().Format(time.RFC3339)
	r.ExpiresAt = w.End.Add(ttl)
	r.Version = w.End.UnixMilli()
	return r
}
