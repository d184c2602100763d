package replay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluice-rl/sluice/replay/accesslog"
	"github.com/sluice-rl/sluice/rules"
)

// TruePositiveShare is the share of attack requests among those a rule
// matches (see RuleScore) at or above which Score counts the rule as a
// true positive.
const TruePositiveShare = 0.95

// BackgroundAttack names abusive clients inside the background traffic (the
// generated scraper, a log-archive script in a real log): a background
// request that carries every descriptor of Scope, with exactly that value,
// is an attack request of the pseudo-scenario Name. A client_ip value may be
// a network in CIDR form (98.159.226.0/24), which every address in it
// matches: a prober rotating through a network. Background attacks of one
// Name are one attacker (its networks, say): scored, and counted in recall,
// as one. Every other background request is benign.
type BackgroundAttack struct {
	Name  string
	Scope map[string]string // by rules.Key name, as Label.Scope
}

// GeneratedAttacks are the abusive clients of Generate's traffic: its
// python-requests scraper.
var GeneratedAttacks = []BackgroundAttack{{Name: "background-scraper", Scope: map[string]string{rules.KeyClientIP.String(): ScraperIP}}}

// ScoreOptions configure Score. They must describe the replay that made the
// report, so that the requests are enriched as the replay enriched them.
type ScoreOptions struct {
	DataDir string   // as Options.DataDir
	Regions []string // as Options.Regions; default DefaultRegions
	Reorder time.Duration
	// BackgroundAttacks label the abusive clients of the background; nil:
	// every background request is benign.
	BackgroundAttacks []BackgroundAttack
}

// RuleScore is one dynamic rule judged against the labelled requests.
//
// A rule is judged on the requests it matches (rules.Rule.Matches, on the
// descriptors the replay gave the enforcer) from the start of the window
// that drew it (its evidence's window_start; its Version when absent) until
// it expires: the requests that made the detector emit it and those it
// would then have limited. It is a true positive when at least
// TruePositiveShare of them are attack requests, a false positive
// otherwise (also when it matched none).
//
// Active is the part of that span from its emission (Version, the end of
// its window) to ExpiresAt. Collateral counts the benign requests (of a
// benign scenario, with or without a scope, or of the background) it would
// deny while active: its token bucket (Limit per Period, capacity Burst, a
// request taking its cost, a denied request taking nothing) is simulated
// per region (one bucket: detector rules match exact values), with the
// full limit in each region, or Limit/regions for a Global rule; a rule
// with Limit 0 denies every request it matches. In shadow mode those are
// the requests it would shadow-deny. The enforcer loads a rule at the
// first barrier after the pipeline emits it, up to Options.Lateness +
// Options.Barrier later than Version, so Collateral may overcount slightly.
type RuleScore struct {
	ID, Origin, Reason string
	Match              []rules.Match
	Mode               rules.Mode
	Emitted, Expires   time.Time
	// Attack and Benign count the requests the rule is judged on.
	Attack, Benign int
	// Active counts the requests it matched while active, by label: the
	// scenario's name, a background attack's, or "" for benign background.
	Active map[string]int
	// Denied counts the requests it would deny while active; Collateral
	// the benign ones among them.
	Denied, Collateral int
	TruePositive       bool
}

// AttackShare is Attack / (Attack + Benign): 0 when the rule matched nothing.
func (r *RuleScore) AttackShare() float64 {
	if n := r.Attack + r.Benign; n > 0 {
		return float64(r.Attack) / float64(n)
	}
	return 0
}

// ScenarioScore is how the detector did on one labelled scenario: an
// injected one, or a background attack.
type ScenarioScore struct {
	Scenario string
	Attack   bool
	Scope    map[string]string
	Requests int // the scenario's requests in the replay
	// Rules counts the rules that matched any of its requests from the
	// window that drew them to their expiry (as RuleScore judges): for an
	// attack, those on it (TruePositives of them true positives); for a
	// benign scenario, false positives.
	Rules, TruePositives int
	// Detected: some true-positive rule matched the attack's requests, in
	// the window that drew it or later: a prober that sent its three
	// requests in one minute and left is detected by the rule that minute
	// drew, though the rule outlives it. TimeToDetect is event time from
	// the attack's start to the earliest such rule's emission (0 when it
	// was emitted before, and for a background attack, whose start is not
	// known).
	Detected     bool
	TimeToDetect time.Duration
	// Covered counts its requests some rule matched while active;
	// Collateral, for a benign scenario, those some rule would deny.
	Covered, Collateral int
}

// Score is a replay's dynamic rules judged against every labelled request
// of the replay (see RuleScore for the definitions).
type Score struct {
	Scenarios []ScenarioScore
	Rules     []RuleScore
	// TruePositives and FalsePositives count rules. Precision is
	// TruePositives / (TruePositives + FalsePositives), 1 when no rule was
	// emitted; Recall is the fraction of attack scenarios detected,
	// background attacks included (1 when there is none).
	TruePositives, FalsePositives int
	Precision, Recall             float64
	// Requests is every request scored; Benign the benign ones; Collateral
	// the benign requests some rule would deny while active, of which
	// BackgroundCollateral are the background's.
	Requests, Benign                 int
	Collateral, BackgroundCollateral int
}

// bucket is one rule's token bucket in one region.
type bucket struct {
	tokens float64
	last   time.Time
	init   bool
}

func (b *bucket) take(r *rules.Rule, regions int, t time.Time, cost int) (denied bool) {
	if r.Limit == 0 {
		return true
	}
	limit, burst := float64(r.Limit), float64(r.Burst)
	if burst <= 0 {
		burst = limit
	}
	if r.Global && regions > 1 {
		limit, burst = limit/float64(regions), burst/float64(regions)
	}
	if !b.init {
		b.tokens, b.last, b.init = burst, t, true
	}
	if r.Period > 0 && t.After(b.last) {
		b.tokens = math.Min(burst, b.tokens+limit*float64(t.Sub(b.last))/float64(r.Period))
		b.last = t
	}
	if b.tokens < float64(cost) {
		return true
	}
	b.tokens -= float64(cost)
	return false
}

// ScoreRules judges the dynamic rules of rep against every request of src,
// which must yield the requests the replay read (a fresh copy of its
// sources: Generate and Inject with the same seeds, the same log), labelled
// by Inject and by o.BackgroundAttacks; spans are the injected scenarios
// (Injector.Spans). It reads src to the end, keeping counts per rule and
// label only. Malformed lines are skipped, as the replay skips them; it
// fails on a read error.
func ScoreRules(rep *Report, spans []Span, src Source, o ScoreOptions) (Score, error) {
	if len(o.Regions) == 0 {
		o.Regions = DefaultRegions
	}
	if o.Reorder <= 0 {
		o.Reorder = 2 * time.Minute
	}
	domain := ""
	if rep.Rules != nil {
		domain = rep.Rules.Domain
	}
	// Labels: 0 is benign background, then the spans, then background attacks.
	type label struct {
		sc    ScenarioScore
		start time.Time
	}
	labels := []*label{{sc: ScenarioScore{}}}
	byName := map[string]int{}
	for _, sp := range spans {
		byName[sp.Scenario] = len(labels)
		labels = append(labels, &label{sc: ScenarioScore{Scenario: sp.Scenario, Attack: sp.Attack, Scope: rep.Labels[sp.Scenario].Scope}, start: sp.Start})
	}
	type bgAttack struct {
		keys []rules.Key
		vals []string
		nets []netip.Prefix // per key: valid for a client_ip network
		idx  int
	}
	var bgAttacks []bgAttack
	bgIdx := map[string]int{}
	for _, ba := range o.BackgroundAttacks {
		idx, seen := bgIdx[ba.Name]
		if !seen {
			idx = len(labels)
			bgIdx[ba.Name] = idx
		}
		a := bgAttack{idx: idx}
		for k, v := range ba.Scope {
			key, ok := rules.KeyFor(k)
			if !ok {
				return Score{}, fmt.Errorf("replay: background attack %q: scope key %q is no descriptor key", ba.Name, k)
			}
			var n netip.Prefix
			if key == rules.KeyClientIP && strings.Contains(v, "/") {
				var err error
				if n, err = netip.ParsePrefix(v); err != nil {
					return Score{}, fmt.Errorf("replay: background attack %q: client_ip %q: %w", ba.Name, v, err)
				}
				n = n.Masked()
			}
			a.keys, a.vals, a.nets = append(a.keys, key), append(a.vals, v), append(a.nets, n)
		}
		bgAttacks = append(bgAttacks, a)
		if !seen {
			labels = append(labels, &label{sc: ScenarioScore{Scenario: ba.Name, Attack: true, Scope: ba.Scope}})
		}
	}

	type ruleState struct {
		r            *rules.Rule
		from         time.Time // judged from
		judged       []int     // per label, from..expiry
		active       []int     // per label, emission..expiry
		buckets      []bucket  // per region
		denied, coll int
	}
	rs := make([]*ruleState, len(rep.DynamicRules))
	for i := range rep.DynamicRules {
		r := &rep.DynamicRules[i]
		from := time.UnixMilli(r.Version)
		if ws, err := time.Parse(time.RFC3339, r.Evidence["window_start"]); err == nil && ws.Before(from) {
			from = ws
		}
		rs[i] = &ruleState{r: r, from: from, judged: make([]int, len(labels)), active: make([]int, len(labels)), buckets: make([]bucket, len(o.Regions))}
	}
	// Rules in order of their judged start, so that the loop below looks
	// only at rules begun.
	slices.SortStableFunc(rs, func(a, b *ruleState) int { return a.from.Compare(b.from) })

	en, _ := OpenEnricher(o.DataDir, o.Regions)
	defer en.Close()
	var s Score
	src = Reorder(src, o.Reorder)
	begun := 0
	var live []*ruleState
	for {
		req, err := src.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			var pe *accesslog.ParseError
			if errors.As(err, &pe) {
				continue
			}
			return Score{}, fmt.Errorf("replay: scoring: reading %s: %w", src.Name(), err)
		}
		region, q := en.Request(domain, "", &req)
		d := &q.Descriptors
		li := 0
		if req.Label.Injected() {
			li = byName[req.Label.Scenario]
		} else {
			for _, a := range bgAttacks {
				hit := true
				for j, k := range a.keys {
					v := d.Get(k, "")
					if a.nets[j].IsValid() {
						ip, err := netip.ParseAddr(v)
						if err != nil || !a.nets[j].Contains(ip) {
							hit = false
							break
						}
						continue
					}
					if v != a.vals[j] {
						hit = false
						break
					}
				}
				if hit {
					li = a.idx
					break
				}
			}
		}
		l := labels[li]
		l.sc.Requests++
		s.Requests++
		benign := !l.sc.Attack
		if benign {
			s.Benign++
		}
		t := req.Time
		for begun < len(rs) && !rs[begun].from.After(t) {
			live = append(live, rs[begun])
			begun++
		}
		live = slices.DeleteFunc(live, func(st *ruleState) bool { return !t.Before(st.r.ExpiresAt) })
		covered, denied := false, false
		cost := max(1, int(req.Cost))
		for _, st := range live {
			if !st.r.Matches(d) {
				continue
			}
			st.judged[li]++
			if t.Before(time.UnixMilli(st.r.Version)) {
				continue
			}
			st.active[li]++
			covered = true
			if st.buckets[region].take(st.r, len(o.Regions), t, cost) {
				st.denied++
				denied = true
				if benign {
					st.coll++
				}
			}
		}
		if covered {
			l.sc.Covered++
		}
		if denied && benign {
			l.sc.Collateral++
			s.Collateral++
			if li == 0 {
				s.BackgroundCollateral++
			}
		}
	}

	slices.SortStableFunc(rs, func(a, b *ruleState) int { return cmp.Compare(a.r.Version, b.r.Version) })
	for _, st := range rs {
		r := st.r
		sc := RuleScore{ID: r.ID, Origin: r.Origin, Reason: r.Reason, Match: r.Match, Mode: r.Mode,
			Emitted: time.UnixMilli(r.Version), Expires: r.ExpiresAt, Active: map[string]int{},
			Denied: st.denied, Collateral: st.coll}
		for li, l := range labels {
			if l.sc.Attack {
				sc.Attack += st.judged[li]
			} else {
				sc.Benign += st.judged[li]
			}
			if st.active[li] > 0 {
				sc.Active[l.sc.Scenario] = st.active[li]
			}
		}
		sc.TruePositive = sc.Attack+sc.Benign > 0 && sc.AttackShare() >= TruePositiveShare
		if sc.TruePositive {
			s.TruePositives++
		} else {
			s.FalsePositives++
		}
		for li, l := range labels {
			if li == 0 || st.judged[li] == 0 {
				continue
			}
			l.sc.Rules++
			if !sc.TruePositive || !l.sc.Attack {
				continue
			}
			l.sc.TruePositives++
			ttd := max(0, sc.Emitted.Sub(l.start))
			if l.start.IsZero() { // a background attack: no start known
				ttd = 0
			}
			if !l.sc.Detected || ttd < l.sc.TimeToDetect {
				l.sc.Detected, l.sc.TimeToDetect = true, ttd
			}
		}
		s.Rules = append(s.Rules, sc)
	}
	attacks, detected := 0, 0
	for li, l := range labels {
		if li == 0 {
			continue
		}
		if li > len(spans) && l.sc.Requests == 0 {
			continue // a background attack absent from this background
		}
		if l.sc.Attack {
			attacks++
			if l.sc.Detected {
				detected++
			}
		}
		s.Scenarios = append(s.Scenarios, l.sc)
	}
	s.Recall = 1
	if attacks > 0 {
		s.Recall = float64(detected) / float64(attacks)
	}
	s.Precision = 1
	if n := s.TruePositives + s.FalsePositives; n > 0 {
		s.Precision = float64(s.TruePositives) / float64(n)
	}
	return s, nil
}

// Print writes the score as two tables: the scenarios, then the rules.
func (s Score) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tKIND\tSCOPE\tREQUESTS\tRULES\tTP RULES\tCOVERED\tDETECTED\tTIME TO DETECT\tCOLLATERAL")
	for _, sc := range s.Scenarios {
		kind, det, ttd := "benign", "-", "-"
		if sc.Attack {
			kind, det = "attack", "no"
			if sc.Detected {
				det, ttd = "yes", sc.TimeToDetect.String()
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%v\t%d\t%d\t%d\t%d\t%s\t%s\t%d\n", sc.Scenario, kind, sc.Scope, sc.Requests, sc.Rules, sc.TruePositives, sc.Covered, det, ttd, sc.Collateral)
	}
	tw.Flush()
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RULE\tORIGIN\tMATCH\tEMITTED\tATTACK\tBENIGN\tVERDICT\tDENIED\tCOLLATERAL\tACTIVE ON")
	for _, r := range s.Rules {
		verdict := "FP"
		if r.TruePositive {
			verdict = "TP"
		}
		var ms []string
		for _, m := range r.Match {
			ms = append(ms, m.KeyName()+"="+m.Value)
		}
		fmt.Fprintf(tw, "%s\t%s\t%v\t%s\t%d\t%d\t%s\t%d\t%d\t%v\n", r.ID, r.Origin, ms, r.Emitted.UTC().Format(time.TimeOnly), r.Attack, r.Benign, verdict, r.Denied, r.Collateral, r.Active)
	}
	tw.Flush()
	fmt.Fprintf(w, "precision %.3f (%d true, %d false positive rules), recall %.3f, collateral %d of %d benign requests (%d of the background's)\n",
		s.Precision, s.TruePositives, s.FalsePositives, s.Recall, s.Collateral, s.Benign, s.BackgroundCollateral)
}

// Scenarios are the names of the injected scenarios, in DefaultInjections'
// order.
var Scenarios = []string{ScenarioBotnet, ScenarioCredentialStuffing, ScenarioURIScan, ScenarioUAFlood, ScenarioScraper, ScenarioCGNAT, ScenarioFlashCrowd}

// The eval's scenarios beyond DefaultInjections' seven: variants of them at
// the sizes and rates issue 18 of the project names, each a field setting
// of a scenario type (see injectionAt).
const (
	// ScenarioLowSlowBotnet is a Botnet of 20 000 addresses at one request
	// per 4 min each, on a route of its own (POST /api/v2/checkout) with a
	// JA4 of its own (JA4CobaltStrike), for 12 min.
	ScenarioLowSlowBotnet = "low-slow-botnet"
	// ScenarioSlowScan is a URIScan at 0.5 requests/s.
	ScenarioSlowScan = "slow-scan"
	// ScenarioStuffingAS29518 is a CredentialStuffing from StuffingAS29518.
	ScenarioStuffingAS29518 = "credential-stuffing-as29518"
)

// EvalScenarios are Eval's default scenarios: the seven of Scenarios, the
// CGNAT at 8 000 users behind 2 addresses and the flash crowd at 20 000
// users arriving within 30 s, and the three variants above.
var EvalScenarios = append(slices.Clone(Scenarios), ScenarioLowSlowBotnet, ScenarioSlowScan, ScenarioStuffingAS29518)

// lowSlowDuration is how long the low-and-slow botnet lasts in the eval,
// whatever EvalOptions.Duration: at one request per 4 min a bot sends a
// request or two in the eval's usual 3 min, and the target time to detect
// is 5 min.
const lowSlowDuration = 12 * time.Minute

// injectionAt returns the named scenario at the eval's size (Scenarios' with
// their defaults but the CGNAT and the flash crowd, which EvalScenarios
// describes) in its window.
func injectionAt(name string, offset, duration time.Duration) (Injection, error) {
	switch name {
	case ScenarioBotnet:
		return Botnet{Offset: offset, Duration: duration}, nil
	case ScenarioLowSlowBotnet:
		return Botnet{Name: name, Offset: offset, Duration: max(duration, lowSlowDuration), IPs: 20_000, Interval: 4 * time.Minute, Path: "/api/v2/checkout", JA4: JA4CobaltStrike}, nil
	case ScenarioCredentialStuffing:
		return CredentialStuffing{Offset: offset, Duration: duration}, nil
	case ScenarioStuffingAS29518:
		return CredentialStuffing{Name: name, Offset: offset, Duration: duration, Network: StuffingAS29518}, nil
	case ScenarioURIScan:
		return URIScan{Offset: offset, Duration: duration}, nil
	case ScenarioSlowScan:
		return URIScan{Name: name, Offset: offset, Duration: duration, Rate: 0.5}, nil
	case ScenarioUAFlood:
		return UAFlood{Offset: offset, Duration: duration}, nil
	case ScenarioScraper:
		return Scraper{Offset: offset, Duration: duration}, nil
	case ScenarioCGNAT:
		return CGNAT{Offset: offset, Duration: duration, Users: 8000, IPs: 2}, nil
	case ScenarioFlashCrowd:
		return FlashCrowd{Offset: offset, Duration: duration, Users: 20_000, Ramp: 30 * time.Second}, nil
	}
	return nil, fmt.Errorf("replay: no scenario %q: want one of %v", name, EvalScenarios)
}

// EvalOptions configure Eval. Zero fields take the defaults named on each.
type EvalOptions struct {
	// Scenarios are the built-in scenarios to inject, by name; default
	// EvalScenarios, all ten, unless Extra has some.
	Scenarios []string
	// Extra are scenarios of the user's (LoadScenarioFile), placed in the
	// slots beside Scenarios.
	Extra []EvalScenario
	// Orders is how many seeded random orders of all the scenarios
	// together to replay: order k permutes the scenarios' slots with seed
	// Seed+k. Default 3.
	Orders int
	// Alone also replays each scenario alone, in the first slot.
	Alone bool
	// Listed also replays the scenarios together in the order Scenarios
	// lists them (the order of the eval before orders were permuted).
	Listed bool
	Seed   uint64 // of the permutations, the injected traffic and the generated background; default 1
	// Background opens a fresh copy of the background traffic; it is
	// called twice per replay (once to replay, once to score), and Eval
	// closes what it returns when that is an io.Closer. Nil:
	// Generate(Scenario{Seed: Seed}) lasting the scenarios' slots, with
	// GeneratedAttacks.
	Background        func() (Source, error)
	BackgroundAttacks []BackgroundAttack
	// Slot is the event time between two scenarios' starts (default 5 min),
	// Duration each scenario's length (default 3 min); the first starts
	// 10 min into the background.
	Slot, Duration time.Duration
	Run            Options // DataDir, Regions and Reorder are used to score too
}

// EvalRun is one replay of Eval: its scenarios in their order, and the score.
type EvalRun struct {
	Name     string
	Order    []string
	Spans    []Span // where each scenario lay in event time
	Requests int
	Elapsed  time.Duration
	Score    Score
}

// ScenarioWorst is one scenario's worst case over the runs that had it.
type ScenarioWorst struct {
	Scenario string
	Attack   bool
	Runs     int
	// Injected: an injected scenario (built-in or the user's), not an
	// attacker of the background.
	Injected bool
	// Missed counts the runs that did not detect the attack; TimeToDetect
	// is the longest of those that did.
	Missed       int
	TimeToDetect time.Duration
	// Rules is the most rules that matched it in one run (false positives
	// for a benign scenario); Collateral the most of its requests denied.
	Rules, Collateral int
}

// EvalResult is every run of Eval and the worst case over them.
type EvalResult struct {
	Background string
	// BackgroundLines and BackgroundMalformed count the background log's
	// lines and those it could not read (skipped), in the first run.
	BackgroundLines, BackgroundMalformed int64
	// Redis and Enrichment say what the replays ran on (Report's).
	Redis, Enrichment string
	Runs              []EvalRun
	Scenarios         []ScenarioWorst
	// Precision and Recall are the lowest of the runs; FalsePositives
	// and Collateral the highest.
	Precision, Recall          float64
	FalsePositives, Collateral int
	// Unmatched are the background attackers that matched no request of
	// the background in any run: a typo in a key or a value, or a client
	// the log does not have. They count in neither recall nor precision.
	Unmatched []string
}

// MaxEvalOrders bounds EvalOptions.Orders: each order is a whole replay
// (minutes), and the plans are built before the first.
const MaxEvalOrders = 1000

// Eval replays the scenarios over the background, all together in
// o.Orders seeded orders (and, with o.Alone, each alone), scores each
// replay with ScoreRules, and returns the runs and the worst case over
// them. progress, when set, is called before each replay with its name.
func Eval(ctx context.Context, o EvalOptions, progress func(run string)) (*EvalResult, error) {
	if len(o.Scenarios) == 0 && len(o.Extra) == 0 {
		o.Scenarios = EvalScenarios
	}
	names := slices.Clone(o.Scenarios)
	extra := map[string]EvalScenario{}
	for _, x := range o.Extra {
		if _, dup := extra[x.Name]; dup || slices.Contains(names, x.Name) || x.At == nil {
			return nil, fmt.Errorf("replay: eval: scenario %q given twice, or without a maker", x.Name)
		}
		extra[x.Name] = x
		names = append(names, x.Name)
	}
	if o.Orders <= 0 && !o.Alone && !o.Listed {
		o.Orders = 3
	}
	if o.Orders > MaxEvalOrders {
		return nil, fmt.Errorf("replay: eval: %d orders: at most %d (each is a whole replay)", o.Orders, MaxEvalOrders)
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.Slot <= 0 {
		o.Slot = 5 * time.Minute
	}
	if o.Duration <= 0 {
		o.Duration = 3 * time.Minute
	}
	at := func(i int) time.Duration { return 10*time.Minute + time.Duration(i)*o.Slot }
	background := o.Background
	if background == nil {
		end := at(len(names))
		if slices.Contains(names, ScenarioLowSlowBotnet) {
			end = max(end, at(len(names)-1)+lowSlowDuration+o.Slot)
		}
		for _, x := range o.Extra {
			end = max(end, at(len(names)-1)+x.Duration+o.Slot)
		}
		bg := Scenario{Seed: o.Seed, Duration: end}
		background = func() (Source, error) { return Generate(bg), nil }
		if o.BackgroundAttacks == nil {
			o.BackgroundAttacks = GeneratedAttacks
		}
	}
	type plan struct {
		name  string
		order []string
	}
	var plans []plan
	if o.Listed {
		plans = append(plans, plan{"together, in the listed order", slices.Clone(names)})
	}
	for k := range max(o.Orders, 0) {
		order := slices.Clone(names)
		rng := rand.New(rand.NewPCG(o.Seed+uint64(k), 0x0de5))
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		plans = append(plans, plan{fmt.Sprintf("together, order %d (seed %d)", k+1, o.Seed+uint64(k)), order})
	}
	if o.Alone {
		for _, name := range names {
			plans = append(plans, plan{name + " alone", []string{name}})
		}
	}
	res := &EvalResult{Precision: 1, Recall: 1}
	worst := map[string]*ScenarioWorst{}
	matched := map[string]int{} // requests per scenario over the runs
	for _, p := range plans {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("replay: eval: %w", err)
		}
		var inj []Injection
		for i, name := range p.order {
			if x, ok := extra[name]; ok {
				inj = append(inj, x.At(at(i), cmp.Or(x.Duration, o.Duration)))
				continue
			}
			x, err := injectionAt(name, at(i), o.Duration)
			if err != nil {
				return nil, err
			}
			inj = append(inj, x)
		}
		var opened []Source
		inject := func() (*Injector, error) {
			bg, err := background()
			if err != nil {
				return nil, err
			}
			opened = append(opened, bg)
			return Inject(bg, InjectOptions{Seed: o.Seed, Reorder: o.Run.Reorder}, inj...)
		}
		in, err := inject()
		if err != nil {
			return nil, err
		}
		if res.Background == "" { // the first run's: all the scenarios
			res.Background = in.Name()
		}
		bgStats := func() accesslog.Stats {
			if len(opened) == 0 || opened[0] == nil {
				return accesslog.Stats{}
			}
			return opened[0].Stats()
		}
		if progress != nil {
			progress(p.name)
		}
		rep, err := Run(ctx, o.Run, in)
		if err != nil {
			return nil, fmt.Errorf("replay: eval %s: %w", p.name, err)
		}
		st := bgStats()
		if o.Background != nil && st.Entries == 0 {
			return nil, fmt.Errorf("replay: eval: the background %s has no request sluice reads (%d lines, %d malformed): not an Apache or nginx combined or common log, or the NASA TSV", opened[0].Name(), st.Lines, st.Malformed)
		}
		if len(res.Runs) == 0 {
			res.BackgroundLines, res.BackgroundMalformed = int64(st.Lines), int64(st.Malformed)
		}
		again, err := inject()
		if err != nil {
			return nil, err
		}
		s, err := ScoreRules(rep, again.Spans(), again, ScoreOptions{DataDir: o.Run.DataDir, Regions: o.Run.Regions, Reorder: o.Run.Reorder, BackgroundAttacks: o.BackgroundAttacks})
		for _, bg := range opened {
			if c, ok := bg.(io.Closer); ok {
				c.Close()
			}
		}
		if err != nil {
			return nil, err
		}
		res.Redis, res.Enrichment = rep.Redis, rep.Enrichment
		res.Runs = append(res.Runs, EvalRun{Name: p.name, Order: p.order, Spans: again.Spans(), Requests: rep.Requests, Elapsed: rep.Elapsed, Score: s})
		res.Precision, res.Recall = min(res.Precision, s.Precision), min(res.Recall, s.Recall)
		res.FalsePositives, res.Collateral = max(res.FalsePositives, s.FalsePositives), max(res.Collateral, s.Collateral)
		for _, sc := range s.Scenarios {
			matched[sc.Scenario] += sc.Requests
			w := worst[sc.Scenario]
			if w == nil {
				w = &ScenarioWorst{Scenario: sc.Scenario, Attack: sc.Attack}
				worst[sc.Scenario] = w
			}
			w.Runs++
			if sc.Attack && !sc.Detected {
				w.Missed++
			}
			w.TimeToDetect = max(w.TimeToDetect, sc.TimeToDetect)
			w.Rules, w.Collateral = max(w.Rules, sc.Rules), max(w.Collateral, sc.Collateral)
		}
	}
	for _, name := range append(slices.Clone(names), backgroundNames(o.BackgroundAttacks)...) {
		if w := worst[name]; w != nil {
			w.Injected = slices.Contains(names, name)
			res.Scenarios = append(res.Scenarios, *w)
		}
	}
	for _, name := range backgroundNames(o.BackgroundAttacks) {
		if matched[name] == 0 {
			res.Unmatched = append(res.Unmatched, name)
		}
	}
	return res, nil
}

func backgroundNames(as []BackgroundAttack) []string {
	var ns []string
	for _, a := range as {
		if !slices.Contains(ns, a.Name) {
			ns = append(ns, a.Name)
		}
	}
	return ns
}

// Print writes the worst case over the runs as a table, then each run's
// figures in a line.
func (r *EvalResult) Print(w io.Writer) {
	fmt.Fprintf(w, "background: %s; %d runs; worst case over them:\n", r.Background, len(r.Runs))
	if r.BackgroundMalformed > 0 {
		fmt.Fprintf(w, "warning: %d of the background's %d lines are malformed and were skipped (sluice replay lists them)\n", r.BackgroundMalformed, r.BackgroundLines)
	}
	if r.Redis != "" || r.Enrichment != "" {
		fmt.Fprintf(w, "redis: %s; enrichment: %s\n", r.Redis, r.Enrichment)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tKIND\tRUNS\tMISSED\tMAX TIME TO DETECT\tMAX RULES\tMAX COLLATERAL")
	for _, sc := range r.Scenarios {
		kind, ttd, missed := "benign", "-", "-"
		if sc.Attack {
			kind, ttd, missed = "attack", sc.TimeToDetect.Round(time.Second).String(), strconv.Itoa(sc.Missed)
			if sc.TimeToDetect == 0 && !sc.Injected {
				ttd = "(in the background)"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t%d\n", sc.Scenario, kind, sc.Runs, missed, ttd, sc.Rules, sc.Collateral)
	}
	tw.Flush()
	fmt.Fprintf(w, "worst: precision %.3f, recall %.3f, %d false positive rules, collateral %d benign requests\n", r.Precision, r.Recall, r.FalsePositives, r.Collateral)
	for _, name := range r.Unmatched {
		fmt.Fprintf(w, "warning: %s matched no request of the background: check its key and value (it counts in neither recall nor precision)\n", name)
	}
	for _, run := range r.Runs {
		s := run.Score
		fmt.Fprintf(w, "  %s %v: %d requests in %v: precision %.3f (%d TP, %d FP rules), recall %.3f, collateral %d\n",
			run.Name, run.Order, run.Requests, run.Elapsed.Round(time.Second), s.Precision, s.TruePositives, s.FalsePositives, s.Recall, s.Collateral)
	}
}
