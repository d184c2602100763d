package detector

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
)

// ErrBadOptions is wrapped by the error of every signal's constructor: an
// option out of its range, which the error names.
var ErrBadOptions = errors.New("detector: bad options")

// Bounds of the options every signal checks.
const (
	// MaxWindow is the longest event-time window: a window's state is held
	// until it closes.
	MaxWindow = time.Hour
	// MaxK bounds the top-k sizes (K), whose tables are allocated whole per
	// window and partition.
	MaxK = 1 << 16
	// MaxBaseline bounds the windows a baseline or history keeps.
	MaxBaseline = 10_000
)

// orDefault sets *v to d when it is zero: an option left unset.
func orDefault[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}

// optCheck collects what is wrong with a signal's options, after their
// defaults are filled in: zero fields take defaults, so any value left
// non-positive was set so.
type optCheck struct {
	signal string
	errs   []string
}

func (c *optCheck) fail(format string, a ...any) {
	c.errs = append(c.errs, fmt.Sprintf(format, a...))
}

// window checks an event-time window: positive, whole milliseconds (window
// ends are rule versions in Unix ms), at most MaxWindow.
func (c *optCheck) window(w time.Duration) {
	if w <= 0 || w%time.Millisecond != 0 || w > MaxWindow {
		c.fail("Window %v: want whole milliseconds, more than 0 and at most %v", w, MaxWindow)
	}
}

// ttl checks a rule's TTL: at least the window, whole milliseconds, at
// most rules.MaxDynamicTTL (the rule store refuses longer).
func (c *optCheck) ttl(ttl, window time.Duration) {
	if ttl < window || ttl%time.Millisecond != 0 || ttl > rules.MaxDynamicTTL {
		c.fail("TTL %v: want whole milliseconds, at least the window (%v) and at most %v", ttl, window, rules.MaxDynamicTTL)
	}
}

// count checks a positive integer option against its bound.
func (c *optCheck) count(name string, v, most int) {
	if v <= 0 || v > most {
		c.fail("%s %d: want 1 to %d", name, v, most)
	}
}

// baseline fills in and checks the options of a judgement against a
// baseline (see judge): z-scores Trigger (default 8) above Clear (3), for
// hysteresis; Persist (2) anomalous windows in a row; Baseline (60) windows
// kept, of which Warmup (6) are needed.
func (c *optCheck) baseline(trigger, clear *float64, persist, baseline, warmup *int) {
	orDefault(trigger, 8)
	orDefault(clear, 3)
	orDefault(persist, 2)
	orDefault(baseline, 60)
	orDefault(warmup, 6)
	c.positive("Trigger", *trigger)
	c.positive("Clear", *clear)
	if *clear > *trigger {
		c.fail("Clear %v above Trigger %v: want Clear at most Trigger (hysteresis)", *clear, *trigger)
	}
	c.count("Persist", *persist, MaxBaseline)
	c.count("Baseline", *baseline, MaxBaseline)
	c.count("Warmup", *warmup, *baseline)
}

// longWindows checks a signal's further time scales: each a valid window,
// at most 4.
func (c *optCheck) longWindows(ws []time.Duration) {
	if len(ws) > 4 {
		c.fail("LongWindows %v: want at most 4", ws)
	}
	for _, w := range ws {
		c.window(w)
	}
}

// defaultLongWindows are the time scales beyond a signal's own window that
// the heavy-hitter and entropy signals also run at.
var defaultLongWindows = []time.Duration{time.Minute, 10 * time.Minute}

// longWindows returns the windows of ws (default defaultLongWindows; none
// with off) longer than base, sorted, without repeats.
func longWindows(base time.Duration, ws []time.Duration, off bool) []time.Duration {
	if off {
		return nil
	}
	if len(ws) == 0 {
		ws = defaultLongWindows
	}
	var out []time.Duration
	for _, w := range slices.Sorted(slices.Values(ws)) {
		if w > base && (len(out) == 0 || out[len(out)-1] != w) {
			out = append(out, w)
		}
	}
	return out
}

// ScaleFloor scales a volume floor set for window base to window w: floor
// times (w/base)^0.4, rounded up. A floor grows with its window, but
// slower than the window, so the rate it asks for falls: the entropy
// signals' 50 requests in 10 s (5/s) become 103 in a minute (1.7/s) and 264
// in 10 minutes (0.44/s), which a scanner at 0.5/s passes; the heavy
// hitters' 30 become 62 and 159. The exponent is our choice, between a
// count floor (0) and a rate floor (1).
func ScaleFloor(floor float64, base, w time.Duration) float64 {
	if base <= 0 || w <= base {
		return floor
	}
	return math.Ceil(floor * math.Pow(float64(w)/float64(base), 0.4))
}

// positive checks a finite factor above 0.
func (c *optCheck) positive(name string, v float64) {
	if !(v > 0) || math.IsInf(v, 0) {
		c.fail("%s %v: want a finite number above 0", name, v)
	}
}

// fraction checks a share in (0, 1].
func (c *optCheck) fraction(name string, v float64) {
	if !(v > 0 && v <= 1) {
		c.fail("%s %v: want a fraction above 0 and at most 1", name, v)
	}
}

// maxLimit bounds a rule's limit option, well inside what a rule holds.
const maxLimit = 1 << 40

// limit checks a rule limit.
func (c *optCheck) limit(name string, v int64) {
	if v <= 0 || v > maxLimit {
		c.fail("%s %d: want 1 to 2^40", name, v)
	}
}

func (c *optCheck) err() error {
	if len(c.errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s: %s", ErrBadOptions, c.signal, strings.Join(c.errs, "; "))
}

// Options configure every signal, for Signals.
type Options struct {
	HeavyHitters  HeavyHitterOptions
	Clusters      ClusterOptions
	Entropy       EntropyOptions
	FakeCrawlers  FakeCrawlerOptions
	NewIdentities NewIdentityOptions
	Content       ContentOptions
}

// Signals returns the detector's signals as pipeline stages, in a fixed
// order: heavy hitters (one stage per time scale), clusters, entropy (one
// per time scale), fake crawlers, new identities, content (one per window).
// It errors (wrapping ErrBadOptions) when any signal's options are bad.
func Signals(o Options) ([]stage.Stage, error) {
	hh, err := NewHeavyHitterScales(o.HeavyHitters)
	if err != nil {
		return nil, err
	}
	cl, err := NewCluster(o.Clusters)
	if err != nil {
		return nil, err
	}
	en, err := NewEntropyScales(o.Entropy)
	if err != nil {
		return nil, err
	}
	fc, err := NewFakeCrawlers(o.FakeCrawlers)
	if err != nil {
		return nil, err
	}
	ni, err := NewNewIdentities(o.NewIdentities)
	if err != nil {
		return nil, err
	}
	ct, err := NewContent(o.Content)
	if err != nil {
		return nil, err
	}
	if o.FakeCrawlers.Ranges != nil {
		// Verified crawlers never draw a volume, shape or content rule:
		// a search engine following dead links is not probing.
		for _, h := range hh {
			h.exempt = fc.Verified
		}
		for _, e := range en {
			e.exempt = fc.Verified
		}
		for _, c := range ct {
			c.exempt = fc.Verified
		}
	}
	var out []stage.Stage
	for _, h := range hh {
		out = append(out, h)
	}
	out = append(out, cl)
	for _, e := range en {
		out = append(out, e)
	}
	out = append(out, fc, ni)
	for _, c := range ct {
		out = append(out, c)
	}
	return out, nil
}
