package replay

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/rules"
)

// Backend models the health of the backend the replayed traffic reaches,
// for adaptive rules and priority load shedding (docs/enforcement.md): each
// request its region's enforcer allows gets a response, a 503 with
// probability ErrorRate, or DegradedErrorRate from DegradeAt after the
// first request for DegradeFor, else a 200; the enforcer is told of it
// (Limiter.ObserveResponse) at the request's event time. The report's
// Adaptive series then shows the factor and the sheds over time.
type Backend struct {
	ErrorRate         float64 // default 0.01
	DegradedErrorRate float64 // 0: no degradation
	DegradeAt         time.Duration
	DegradeFor        time.Duration
	Seed              uint64 // the responses' draws
}

func (b *Backend) check() error {
	if b.ErrorRate == 0 {
		b.ErrorRate = 0.01
	}
	for _, r := range []float64{b.ErrorRate, b.DegradedErrorRate} {
		if !(r >= 0 && r <= 1) {
			return fmt.Errorf("replay: backend error rate %v: want a fraction in [0, 1]", r)
		}
	}
	if b.DegradeAt < 0 || b.DegradeFor < 0 {
		return fmt.Errorf("replay: backend degradation at %s for %s: want durations >= 0", b.DegradeAt, b.DegradeFor)
	}
	return nil
}

// AdaptivePoint is one second of event time of a replay with a Backend.
type AdaptivePoint struct {
	Time time.Time
	// Factor is the first region's adaptive factor at the second's first
	// request.
	Factor float64
	// Responses and Errors are the backend's answers (allowed requests) in
	// the second, and its 5xx among them.
	Responses, Errors int
	// Shed counts the requests refused by load shedding, by priority.
	Shed [rules.NumPriorities]int
}

// backendModel is a Backend in a run.
type backendModel struct {
	Backend
	rng   *rand.Rand
	start time.Time
}

// respond answers a decided request at t, if allowed, tells the enforcer,
// and records the second's point.
func (m *backendModel) respond(rep *Report, lims []regionLimiter, region int, t time.Time, d *enforcer.Decision) {
	if m.start.IsZero() {
		m.start = t
	}
	sec := t.Truncate(time.Second)
	if n := len(rep.Adaptive); n == 0 || !rep.Adaptive[n-1].Time.Equal(sec) {
		rep.Adaptive = append(rep.Adaptive, AdaptivePoint{Time: sec, Factor: lims[0].AdaptiveFactor()})
	}
	p := &rep.Adaptive[len(rep.Adaptive)-1]
	if d.Reason == decision.ReasonShed {
		p.Shed[d.Priority]++
		return
	}
	if !d.Outcome.Allow() {
		return
	}
	rate := m.ErrorRate
	if off := t.Sub(m.start); m.DegradedErrorRate > 0 && off >= m.DegradeAt && off < m.DegradeAt+m.DegradeFor {
		rate = m.DegradedErrorRate
	}
	status := 200
	if m.rng.Float64() < rate {
		status = 503
		p.Errors++
	}
	p.Responses++
	lims[region].ObserveResponse(t, status, 0)
}

// printAdaptive writes the Adaptive series every 10 s.
func (r *Report) printAdaptive(p func(string, ...any)) {
	if len(r.Adaptive) == 0 {
		return
	}
	p("Backend health, adaptive factor and load shedding (every 10 s of event time)")
	p("  %8s  %6s  %8s  %9s  %6s  %8s", "time", "factor", "5xx", "sheddable", "normal", "critical")
	start := r.Adaptive[0].Time
	for i := 0; i < len(r.Adaptive); {
		from := r.Adaptive[i].Time
		var resp, errs int
		var shed [rules.NumPriorities]int
		j := i
		for ; j < len(r.Adaptive) && r.Adaptive[j].Time.Sub(from) < 10*time.Second; j++ {
			a := &r.Adaptive[j]
			resp, errs = resp+a.Responses, errs+a.Errors
			for k := range shed {
				shed[k] += a.Shed[k]
			}
		}
		share := 0.0
		if resp > 0 {
			share = float64(errs) / float64(resp)
		}
		p("  %7.0fs  %6.3f  %7.1f%%  %9d  %6d  %8d", from.Sub(start).Seconds(), r.Adaptive[i].Factor, 100*share,
			shed[rules.Sheddable], shed[rules.Normal], shed[rules.Critical])
		i = j
	}
	p("")
}
