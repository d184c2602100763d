package replay

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluice-rl/sluice/analytics"
	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/pipeline"
	"github.com/sluice-rl/sluice/replay/accesslog"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/sketch"
)

const (
	maxMalformedListed = 20
	topKeys            = 5
	// DeniedKeysTracked is how many keys per rule the report counts
	// denials of (Space-Saving, sketch.TopK): the heaviest are exact or
	// overestimated by at most the rule's denials over DeniedKeysTracked.
	DeniedKeysTracked = 64
	// MaxEntityTags is how many entity tags the report remembers the
	// entity values of (the first seen), for naming shares.
	MaxEntityTags = 4096
	// MaxShareLog and MaxDynamicRules bound Report.ShareLog and
	// Report.DynamicRules (the first written are kept); MaxShareKeys bounds
	// the rule|key pairs LatestShares knows (the first written).
	MaxShareLog     = 10_000
	MaxDynamicRules = 10_000
	MaxShareKeys    = 10_000
)

// SourceReport accounts for every line of one source.
type SourceReport struct {
	Name  string
	Stats accesslog.Stats // Lines = Entries + Malformed + Header + Blank
	// Malformed lists the first malformed lines (line number and why).
	Malformed []*accesslog.ParseError
	// Rejected counts parsed requests the limiter refused to decide.
	Rejected int
}

// RuleCounts are one rule's decisions.
type RuleCounts struct {
	Matched, Allowed, Denied, ShadowDenied int
	// Degraded counts decisions taken by the failure modes (Redis failed);
	// they are not in Allowed or Denied.
	Degraded int
}

// KeyCount is one limit key and a count.
type KeyCount struct {
	Key string
	N   int
}

// Effect is one decision that a pipeline output changed.
type Effect struct {
	RequestID string
	Rule      string
	Outcome   decision.Outcome
	At        time.Time
}

// Report is what a replay did.
type Report struct {
	Regions                  []string
	Rules                    *rules.Set
	Redis, Kafka, Enrichment string
	Sources                  []*SourceReport
	Requests                 int
	Outcomes                 map[decision.Outcome]int
	// TopDenied lists, per rule id, the keys it denied most (at most 5).
	TopDenied map[string][]KeyCount
	// DynamicRules are the rules the detector emitted, in order: the first
	// MaxDynamicRules of DynamicRulesEmitted.
	DynamicRules        []rules.Rule
	DynamicRulesEmitted int
	// Labels are the injected scenarios' labels, by scenario name (see
	// Inject); Score compares DynamicRules with them.
	Labels map[string]Label
	// ShareLog is the shares the aggregator wrote, in order: the first
	// MaxShareLog of SharesWritten.
	ShareLog      []rules.Share
	SharesWritten int
	// ShareSeries are the shares over event time of each global rule's
	// default split and of the MaxShareSeries rule|key pairs with the most
	// shares written, by "rule|key", for the charts.
	ShareSeries map[string]*ShareSeries
	// Adaptive is the backend's health, the adaptive factor and the load
	// sheds per second of event time, in a replay with Options.Backend.
	Adaptive []AdaptivePoint
	// Timeline is the per-rule counts over event time (as in Rule), for
	// the charts of the HTML page (package replay/htmlreport).
	Timeline Timeline
	// Effects of pipeline output on later decisions.
	DynamicDenied, DynamicShadowDenied int
	FirstDynamicEffect                 *Effect
	SharedDecisions                    int // decisions whose global rules used an aggregator share
	Producer                           pipeline.ProducerStats
	Consumer                           pipeline.ConsumerStats
	Merger                             pipeline.MergerStats
	Punctuations                       int64 // watermark records written to the decision topic, one per partition at each barrier
	Barriers                           int
	Elapsed                            time.Duration
	// Problems are what went wrong without stopping the replay (or, last,
	// what stopped it): the figures above them are partial.
	Problems []string
	// ClickHouse names the ClickHouse the run was written to ("" when
	// none, see Options.ClickHouse); Sink is what its sink did.
	ClickHouse string
	Sink       *analytics.SinkStats

	byRule   map[string]*RuleCounts
	denied   map[string]*sketch.TopK // rule id -> the keys it denied most
	tags     map[string]string       // entity tag -> entity value, for global rules; at most MaxEntityTags
	latest   map[string]map[string]rules.Share
	series   shareSeries
	rejected []string
	// releaseErrors counts concurrency slots that could not be given back.
	releaseErrors int
}

// Rule returns the counts of one rule.
func (r *Report) Rule(id string) RuleCounts {
	if c := r.byRule[id]; c != nil {
		return *c
	}
	return RuleCounts{}
}

// EntityValue returns the entity value (for example api_key=abc) behind the
// entity tag that keys a global rule's shares (rules.Share.Key), as seen in
// the replayed requests; "" if no request had it, or if it came after
// MaxEntityTags others.
func (r *Report) EntityValue(tag string) string { return r.tags[tag] }

// DeniedKeys returns the keys a rule denied most, at most DeniedKeysTracked
// of them, with their counts: exact while the rule denied no more than
// DeniedKeysTracked keys, else overestimates by at most the rule's denials
// over DeniedKeysTracked (Space-Saving). Nil if the rule denied nothing.
func (r *Report) DeniedKeys(id string) map[string]int {
	tk := r.denied[id]
	if tk == nil {
		return nil
	}
	out := map[string]int{}
	for _, it := range tk.List() {
		out[it.Key] = int(it.Count)
	}
	return out
}

func (r *Report) tally(region int, req *enforcer.Request, d *enforcer.Decision) {
	r.Requests++
	if r.Outcomes == nil {
		r.Outcomes = map[decision.Outcome]int{}
		r.tags = map[string]string{}
	}
	r.Outcomes[d.Outcome]++
	if d.Shared {
		r.SharedDecisions++
	}
	for i := range d.Statuses {
		id := d.Statuses[i].Rule.ID
		c := r.byRule[id]
		if c == nil {
			c = &RuleCounts{}
			r.byRule[id] = c
		}
		series := id
		if d.Statuses[i].Rule.Dynamic() {
			series = DynamicSeries
		}
		for _, c := range []*RuleCounts{c, r.Timeline.bucket(series, d.Now)} {
			c.Matched++
			switch {
			case d.Outcome == decision.DegradedOpen || d.Outcome == decision.DegradedClosed:
				c.Degraded++
			case d.Rule != nil && d.Rule.ID == id && d.Outcome == decision.Denied:
				c.Denied++
			case d.Rule != nil && d.Rule.ID == id && d.Outcome == decision.ShadowDenied:
				c.ShadowDenied++
				c.Allowed++
			case d.Outcome.Allow():
				c.Allowed++
			}
		}
	}
	for _, rule := range r.Rules.Rules {
		if rule.Global && rule.Matches(&req.Descriptors) {
			if len(r.tags) >= MaxEntityTags {
				break
			}
			tag := rules.EntityTag(rule, &req.Descriptors)
			if _, ok := r.tags[tag]; !ok {
				r.tags[tag] = rules.EntityValue(rule, &req.Descriptors)
			}
		}
	}
	if d.Rule == nil || (d.Outcome != decision.Denied && d.Outcome != decision.ShadowDenied) {
		return
	}
	if d.Outcome == decision.Denied {
		tk := r.denied[d.Rule.ID]
		if tk == nil {
			tk = sketch.NewTopK(DeniedKeysTracked)
			r.denied[d.Rule.ID] = tk
		}
		tk.Add(rules.EntityValue(d.Rule, &req.Descriptors), 1)
	}
	if d.Rule.Dynamic() {
		if d.Outcome == decision.Denied {
			r.DynamicDenied++
		} else {
			r.DynamicShadowDenied++
		}
		if r.FirstDynamicEffect == nil {
			r.FirstDynamicEffect = &Effect{RequestID: req.RequestID, Rule: d.Rule.ID, Outcome: d.Outcome, At: d.Now}
		}
	}
}

func (r *Report) finish() {
	if n := r.Outcomes[decision.DegradedOpen] + r.Outcomes[decision.DegradedClosed]; n > 0 {
		r.Problems = append(r.Problems, fmt.Sprintf("%d decisions were degraded: Redis failed or timed out, and the rules' failure modes decided", n))
	}
	rejected := 0
	for _, s := range r.Sources {
		rejected += s.Rejected
		switch st := s.Stats; {
		case st.Entries == 0 && st.Malformed > 0:
			r.Problems = append(r.Problems, fmt.Sprintf("%s: none of its %d lines parsed: not a log sluice reads (Apache or nginx combined or common, or the NASA TSV)", s.Name, st.Lines))
		case st.Entries == 0:
			r.Problems = append(r.Problems, fmt.Sprintf("%s: no request: the log is empty (%d lines, blank or a header)", s.Name, st.Lines))
		}
	}
	if rejected > 0 {
		r.Problems = append(r.Problems, fmt.Sprintf("%d requests were not decided: the limiter refused them (see the inputs above)", rejected))
	}
	if r.releaseErrors > 0 {
		r.Problems = append(r.Problems, fmt.Sprintf("%d concurrency slots could not be released: they free themselves when their lease ends", r.releaseErrors))
	}
	if pr := r.Producer; pr.Dropped > 0 || pr.Failed > 0 {
		r.Problems = append(r.Problems, fmt.Sprintf("%d decision records never reached Kafka (%d dropped by a full buffer, %d failed): the detector and the aggregator did not see them", pr.Dropped+pr.Failed, pr.Dropped, pr.Failed))
	}
	r.series.prune()
	r.ShareSeries = r.series.series
	r.TopDenied = map[string][]KeyCount{}
	for id := range r.denied {
		var ks []KeyCount
		for k, n := range r.DeniedKeys(id) {
			ks = append(ks, KeyCount{k, n})
		}
		slices.SortFunc(ks, func(a, b KeyCount) int { return cmp.Or(b.N-a.N, strings.Compare(a.Key, b.Key)) })
		r.TopDenied[id] = ks[:min(len(ks), topKeys)]
	}
}

// LatestShares returns, per "rule|key", the newest share of each region by
// region name, for the first MaxShareKeys rule|key pairs written. The maps
// are the report's: treat them as read-only.
func (r *Report) LatestShares() map[string]map[string]rules.Share {
	if r.latest == nil {
		return map[string]map[string]rules.Share{}
	}
	return r.latest
}

// addShare records one share the aggregator wrote.
func (r *Report) addShare(s rules.Share) {
	r.SharesWritten++
	r.series.add(s)
	if len(r.ShareLog) < MaxShareLog {
		r.ShareLog = append(r.ShareLog, s)
	}
	if r.latest == nil {
		r.latest = map[string]map[string]rules.Share{}
	}
	k := s.RuleID + "|" + s.Key
	m := r.latest[k]
	if m == nil {
		if len(r.latest) >= MaxShareKeys {
			return
		}
		m = map[string]rules.Share{}
		r.latest[k] = m
	}
	if old, ok := m[s.Region]; !ok || s.Version >= old.Version {
		m[s.Region] = s
	}
}

// addRule records one rule the detector emitted.
func (r *Report) addRule(x rules.Rule) {
	r.DynamicRulesEmitted++
	if len(r.DynamicRules) < MaxDynamicRules {
		r.DynamicRules = append(r.DynamicRules, x)
	}
}

// Print writes the report as text.
func (r *Report) Print(w io.Writer) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format+"\n", a...) }
	p("sluice replay report")
	p("")
	r.printProblems(p)
	r.printAdaptive(p)
	p("Input")
	for _, s := range r.Sources {
		st := s.Stats
		p("  %s: %d lines: %d parsed, %d malformed, %d header, %d blank", s.Name, st.Lines, st.Entries, st.Malformed, st.Header, st.Blank)
		for _, e := range s.Malformed {
			p("    malformed line %d: %v", e.Line, e.Err)
		}
		if st.Malformed > len(s.Malformed) {
			p("    ... and %d more malformed lines", st.Malformed-len(s.Malformed))
		}
		if s.Rejected > 0 {
			p("    %d requests the limiter refused to decide, e.g.:", s.Rejected)
		}
	}
	for _, e := range r.rejected {
		p("      %s", e)
	}
	p("")
	p("Environment")
	p("  regions:    %s (region = hash of the client address)", strings.Join(r.Regions, ", "))
	p("  redis:      %s", r.Redis)
	p("  kafka:      %s", r.Kafka)
	p("  enrichment: %s", r.Enrichment)
	if n := localOnly(r.Rules); n != "" {
		p("  global:     %s hold per region in a replay: the regions do not check a home region (pinned) or exchange counts (g_counter); deploy/local/up runs both", n)
	}
	if r.ClickHouse != "" {
		p("  clickhouse: %s", r.ClickHouse)
		if st := r.Sink; st != nil {
			p("              %d decisions, %d rule versions, %d shares written in %d batches; %d failed inserts (retried)",
				st.Rows[analytics.TableDecisions], st.Rows[analytics.TableRules], st.Rows[analytics.TableShares], st.Batches, st.InsertFailures)
		}
	}
	p("")
	p("Decisions: %d", r.Requests)
	for o := decision.Allowed; o <= decision.DegradedClosed; o++ {
		if n := r.Outcomes[o]; n > 0 || o <= decision.Denied {
			p("  %-16s %d", o.String()+":", n)
		}
	}
	p("")
	p("Per rule")
	p("  MATCHED = ALLOWED + DENIED + DEGRADED + denied by another rule (which consumes nothing here);")
	p("  SHADOW-DENIED requests are allowed, and counted in ALLOWED too; DEGRADED were decided by the failure modes.")
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  RULE\tMATCHED\tALLOWED\tDENIED\tSHADOW-DENIED\tDEGRADED\tLIMIT")
	ids := make([]string, 0, len(r.byRule))
	for _, rule := range r.Rules.Rules {
		ids = append(ids, rule.ID)
	}
	for _, id := range slices.Sorted(maps.Keys(r.byRule)) {
		if r.Rules.Rule(id) == nil {
			ids = append(ids, id)
		}
	}
	for _, id := range ids {
		c := r.Rule(id)
		lim := ""
		if rule := r.RuleByID(id); rule != nil {
			lim = rule.Describe()
		}
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%d\t%d\t%s\n", id, c.Matched, c.Allowed, c.Denied, c.ShadowDenied, c.Degraded, lim)
	}
	tw.Flush()
	p("")
	p("Top denied keys")
	if len(r.TopDenied) == 0 {
		p("  none")
	}
	for _, id := range slices.Sorted(maps.Keys(r.TopDenied)) {
		for _, k := range r.TopDenied[id] {
			p("  %-14s %-40s %d denied", id, k.Key, k.N)
		}
	}
	p("")
	distinct := r.DistinctDynamicRules()
	p("Dynamic rules emitted by the detector: %d (%s)", len(distinct), count(r.DynamicRulesEmitted, "emission"))
	if r.DynamicRulesEmitted > len(r.DynamicRules) {
		p("  (the rules of the first %s listed)", count(len(r.DynamicRules), "emission"))
	}
	for _, e := range distinct {
		d := e.Rule
		again := ""
		if e.N > 1 {
			again = fmt.Sprintf(", emitted %d times (the detector still saw it; the latest shown)", e.N)
		}
		p("  %s (%s): %s, expires %s%s", d.ID, d.Origin, d.Describe(), d.ExpiresAt.UTC().Format(time.RFC3339), again)
		p("    %s", d.Reason)
		var ev []string
		for _, k := range slices.Sorted(maps.Keys(d.Evidence)) {
			ev = append(ev, k+"="+d.Evidence[k])
		}
		p("    evidence: %s", strings.Join(ev, " "))
	}
	p("")
	p("Effect of pipeline output on later decisions")
	p("  shadow-denied by detector rules: %d", r.DynamicShadowDenied)
	p("  denied by detector rules:        %d", r.DynamicDenied)
	if e := r.FirstDynamicEffect; e != nil {
		p("  first: request %s at %s, %s by %s", e.RequestID, e.At.UTC().Format(time.RFC3339), e.Outcome, e.Rule)
	}
	p("  decided with an aggregator share: %d", r.SharedDecisions)
	p("")
	latest := r.LatestShares()
	p("Shares per region (latest of %d written)", r.SharesWritten)
	if len(latest) == 0 {
		p("  none: no global rule matched")
	} else {
		tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "  RULE\tKEY\t%s\tCOMPUTED AT\n", strings.ToUpper(strings.Join(r.Regions, "\t")))
		keys := slices.Sorted(maps.Keys(latest))
		shown := 0
		for _, k := range keys {
			if shown == 12 {
				fmt.Fprintf(tw, "  ... %d more keys\n", len(keys)-shown)
				break
			}
			shown++
			m := latest[k]
			rule, tag, _ := strings.Cut(k, "|")
			name := "(default split)"
			if tag != "" {
				name = r.tags[tag]
				if name == "" {
					name = tag
				}
			}
			var cols []string
			var at time.Time
			for _, reg := range r.Regions {
				s, ok := m[reg]
				if !ok {
					cols = append(cols, "-")
					continue
				}
				cols = append(cols, fmt.Sprintf("%.3f", s.Fraction))
				at = s.ComputedAt
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", rule, name, strings.Join(cols, "\t"), at.UTC().Format(time.RFC3339))
		}
		tw.Flush()
	}
	p("")
	pr, c, m := r.Producer, r.Consumer, r.Merger
	p("Pipeline")
	p("  decision records: %d logged, %d produced, %d dropped (buffer full), %d failed", pr.Logged, pr.Produced, pr.Dropped, pr.Failed)
	p("  consumed %d (%d punctuations, bad %d, late %d); windows merged %d from %d partials; outputs written %d (write errors %d); barriers %d",
		c.Consumed, r.Punctuations, c.BadRecord, c.Late, m.Windows, m.Partials, m.Outputs, m.WriteErrs, r.Barriers)
	p("")
	secs := r.Elapsed.Seconds()
	p("Throughput: %d records in %.2f s = %.0f records/s", r.Requests, secs, float64(r.Requests)/max(secs, 1e-9))
	if len(r.Problems) > 0 {
		p("")
		r.printProblems(p)
	}
}

func (r *Report) printProblems(p func(string, ...any)) {
	if len(r.Problems) == 0 {
		return
	}
	p("PROBLEMS: the figures are partial or degraded")
	for _, x := range r.Problems {
		p("  - %s", x)
	}
	p("")
}

// RuleByID returns the rule with id: a rule of the rule file, else the
// latest emission of one the detector emitted (as DistinctDynamicRules
// lists it: a re-emitted rule may change its limit or expiry); nil if none.
func (r *Report) RuleByID(id string) *rules.Rule {
	if x := r.Rules.Rule(id); x != nil {
		return x
	}
	for i := len(r.DynamicRules) - 1; i >= 0; i-- {
		if r.DynamicRules[i].ID == id {
			return &r.DynamicRules[i]
		}
	}
	return nil
}

// localOnly names the pinned and G-Counter rules of set, which a replay
// enforces in each region alone; "" if none.
func localOnly(set *rules.Set) string {
	if set == nil {
		return ""
	}
	var ids []string
	for _, r := range set.Rules {
		if r.Pinned || r.GCounter {
			ids = append(ids, r.ID)
		}
	}
	return strings.Join(ids, ", ")
}

// RuleEmissions is one detector rule and how many times it was emitted.
type RuleEmissions struct {
	Rule rules.Rule // the latest emission
	N    int
}

// DistinctDynamicRules groups DynamicRules by id, in the order each id was
// first emitted. A detector re-emits a rule while it still sees the abuse
// (with a later expiry): that is one rule, not several.
func (r *Report) DistinctDynamicRules() []RuleEmissions {
	at := make(map[string]int, len(r.DynamicRules))
	var out []RuleEmissions
	for _, d := range r.DynamicRules {
		if i, ok := at[d.ID]; ok {
			out[i].Rule = d
			out[i].N++
			continue
		}
		at[d.ID] = len(out)
		out = append(out, RuleEmissions{Rule: d, N: 1})
	}
	return out
}

// count writes n with the noun, singular for 1: "1 rule", "2 rules". noun
// is the singular; an s makes the plural.
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
