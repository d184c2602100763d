package replay

import (
	"container/heap"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"github.com/sluice-rl/sluice/replay/accesslog"
	"github.com/sluice-rl/sluice/sketch"
)

// Injection is one scenario that Inject adds to background traffic: the
// attacks Botnet, CredentialStuffing, URIScan, UAFlood and Scraper, and the
// benign CGNAT and FlashCrowd. Each is a struct whose zero fields take the
// defaults named on them; DefaultInjections returns all seven.
type Injection interface {
	// check applies the defaults, validates, and returns the scenario's
	// name and window.
	check() (name string, offset, duration time.Duration, err error)
	// setup returns the scenario's label, actors and request maker for the
	// window start..end, drawing addresses and user agents from rng.
	setup(rng *rand.Rand, start, end time.Time) *scenario
}

// InjectOptions configure Inject.
type InjectOptions struct {
	// Seed makes the injected traffic: the same seed, background and
	// scenarios give the same requests, in the same order.
	Seed uint64
	// Start is the time from which the scenarios' offsets count. Zero: the
	// background's first timestamp (after Reorder), or GeneratorStart when
	// there is no background or it is empty.
	Start time.Time
	// Reorder is the horizon within which the background is put in
	// event-time order before the merge (see Reorder). Default 2 min.
	Reorder time.Duration
}

// Span is where one injected scenario lies in event time: its requests have
// Start <= Time < End.
type Span struct {
	Scenario   string
	Attack     bool
	Start, End time.Time
}

// Injector is the Source Inject returns: background traffic merged with
// labelled scenarios in event-time order. It is not safe for concurrent
// use. Most callers pass it to Run and read Spans for the evaluation.
type Injector struct {
	name      string
	bg        Source // nil: none
	o         InjectOptions
	scenarios []Injection
	windows   []window

	started  bool
	err      error                   // a background read error met reading ahead, returned by every Next
	pending  []*accesslog.ParseError // malformed background lines read ahead
	bgReq    Request
	bgOK     bool
	bgEOF    bool
	states   []*scenario
	actors   actorHeap
	injected int
	spans    []Span
}

// Inject returns a Source that yields background's requests (nil: none)
// merged in event time with those of the scenarios, which are labelled
// (Request.Label) and numbered per scenario (Request.Line counts from 1 in
// each). Each scenario's requests come from a random stream seeded by o.Seed
// and its name, so they do not change when other scenarios are added,
// removed or changed. Background requests keep their lines and their zero
// Label. Among requests at the same instant background ones come first.
// Malformed background lines are passed through, as the background returns
// them.
//
// It fails when a scenario is invalid (a negative size, rate or duration, an
// invalid JA4, more addresses than its network holds) or two scenarios have
// one name.
func Inject(background Source, o InjectOptions, scenarios ...Injection) (*Injector, error) {
	if o.Reorder <= 0 {
		o.Reorder = 2 * time.Minute
	}
	in := &Injector{o: o, scenarios: scenarios}
	names := map[string]bool{}
	for _, sc := range scenarios {
		name, off, dur, err := sc.check()
		if err != nil {
			return nil, err
		}
		if names[name] {
			return nil, fmt.Errorf("replay: two injected scenarios are named %q: give each its own Name", name)
		}
		names[name] = true
		in.windows = append(in.windows, window{name, off, dur})
	}
	bgName := "no background"
	if background != nil {
		in.bg = Reorder(background, o.Reorder)
		bgName = background.Name()
	}
	in.name = fmt.Sprintf("%s + injected(seed=%d, %s)", bgName, o.Seed, count(len(scenarios), "scenario"))
	return in, nil
}

func (in *Injector) Name() string { return in.name }

// Stats counts the background's lines, plus every injected request as one
// line and one entry.
func (in *Injector) Stats() accesslog.Stats {
	var st accesslog.Stats
	if in.bg != nil {
		st = in.bg.Stats()
	}
	st.Lines += in.injected
	st.Entries += in.injected
	return st
}

// Spans returns each scenario's place in event time, in the order given to
// Inject. Before the first Next it reads ahead to the background's first
// request, which fixes the start.
func (in *Injector) Spans() []Span {
	in.start()
	return in.spans
}

// start reads ahead to the background's first request, fixes the start and
// draws every scenario's actors.
func (in *Injector) start() {
	if in.started {
		return
	}
	in.started = true
	start := in.o.Start
	if in.bg != nil {
		for {
			r, err := in.bg.Next()
			if err == nil {
				in.bgReq, in.bgOK = r, true
				break
			}
			var pe *accesslog.ParseError
			if errors.As(err, &pe) {
				in.pending = append(in.pending, pe)
				continue
			}
			if !errors.Is(err, io.EOF) {
				in.err = err
			}
			in.bgEOF = true
			break
		}
		if start.IsZero() && in.bgOK {
			start = in.bgReq.Time
		}
	}
	if start.IsZero() {
		start = GeneratorStart
	}
	for i, sc := range in.scenarios {
		w := in.windows[i]
		// Each scenario's stream depends on the seed and its name only.
		rng := rand.New(rand.NewPCG(in.o.Seed, sketch.Hash64(w.name)))
		from, to := start.Add(w.offset), start.Add(w.offset+w.duration)
		s := sc.setup(rng, from, to)
		s.rng = rng
		s.label.Scenario = w.name
		in.states = append(in.states, s)
		in.spans = append(in.spans, Span{Scenario: w.name, Attack: s.label.Attack, Start: from, End: to})
		for _, a := range s.actors {
			a.scenario = i
			if a.next.Before(a.end) {
				in.actors = append(in.actors, a)
			}
		}
	}
	heap.Init(&in.actors)
}

// Next returns the earliest of the background's next request and the
// scenarios' next, io.EOF when both are done, or a malformed background
// line's *accesslog.ParseError.
func (in *Injector) Next() (Request, error) {
	in.start()
	if in.err != nil {
		return Request{}, in.err
	}
	if len(in.pending) > 0 {
		pe := in.pending[0]
		in.pending = in.pending[1:]
		return Request{}, pe
	}
	if !in.bgOK && !in.bgEOF && in.bg != nil {
		r, err := in.bg.Next()
		switch {
		case err == nil:
			in.bgReq, in.bgOK = r, true
		case errors.Is(err, io.EOF):
			in.bgEOF = true
		default:
			return Request{}, err // a *accesslog.ParseError, or a read error
		}
	}
	if in.bgOK && (len(in.actors) == 0 || !in.actors[0].next.Before(in.bgReq.Time)) {
		in.bgOK = false
		return in.bgReq, nil
	}
	if len(in.actors) == 0 {
		return Request{}, io.EOF
	}
	a := in.actors[0]
	s := in.states[a.scenario]
	r := s.emit(s.rng, a)
	s.seq++
	r.Time, r.Line, r.Label = a.next, s.seq, s.label
	if a.scope != nil {
		r.Label.Scope = a.scope
	}
	if r.Proto == "" {
		r.Proto = "HTTP/1.1"
	}
	in.injected++
	a.advance(s.rng)
	if a.next.Before(a.end) {
		heap.Fix(&in.actors, 0)
	} else {
		heap.Pop(&in.actors)
	}
	return r, nil
}

type window struct {
	name             string
	offset, duration time.Duration
}

// scenario is an Injection set up: its label, actors and request maker.
type scenario struct {
	label  Label // Scenario is filled in by the Injector
	actors []*actor
	// emit fills in a request of actor a: everything but Time, Line and
	// Label. An actor with a scope of its own labels its requests with it.
	emit func(rng *rand.Rand, a *actor) Request
	rng  *rand.Rand
	seq  int
}

// actor is one source of requests within a scenario (a bot, a user, a
// scanner): its requests come one mean gap apart, either as a Poisson
// process or, when jitter > 0, periodically with each gap drawn uniformly
// within ±jitter of the mean.
type actor struct {
	next, end time.Time
	gap       time.Duration
	jitter    float64
	scenario  int // index into Injector.states
	id        int // index within the scenario: ties break by it
	client    string
	ua, ja4   string
	scope     map[string]string // per-actor label scope, when the scenario has one per address
}

// newActor returns an actor active from `from` to end whose first request
// comes one random gap (or, when periodic, a random phase) after from.
func newActor(rng *rand.Rand, id int, from, end time.Time, gap time.Duration, jitter float64) *actor {
	a := &actor{end: end, gap: gap, jitter: jitter, id: id}
	if jitter > 0 {
		a.next = from.Add(time.Duration(rng.Float64() * float64(gap)))
	} else {
		a.next = from.Add(time.Duration(rng.ExpFloat64() * float64(gap)))
	}
	return a
}

func (a *actor) advance(rng *rand.Rand) {
	var d time.Duration
	if a.jitter > 0 {
		d = time.Duration(float64(a.gap) * (1 + a.jitter*(2*rng.Float64()-1)))
	} else {
		d = time.Duration(rng.ExpFloat64() * float64(a.gap))
	}
	a.next = a.next.Add(max(d, time.Nanosecond))
}

type actorHeap []*actor

func (h actorHeap) Len() int { return len(h) }
func (h actorHeap) Less(i, j int) bool {
	if c := h[i].next.Compare(h[j].next); c != 0 {
		return c < 0
	}
	if h[i].scenario != h[j].scenario {
		return h[i].scenario < h[j].scenario
	}
	return h[i].id < h[j].id
}
func (h actorHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *actorHeap) Push(x any)   { *h = append(*h, x.(*actor)) }
func (h *actorHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
