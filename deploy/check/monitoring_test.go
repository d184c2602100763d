package check

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/sluice-rl/sluice/aggregator"
	"github.com/sluice-rl/sluice/crowdsec"
	"github.com/sluice-rl/sluice/detector"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/enforcer/sidecar"
	"github.com/sluice-rl/sluice/pipeline"
	"github.com/sluice-rl/sluice/pipeline/gcounter"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

const (
	alertsFile    = "../prometheus/alerts.yaml"
	dashboardFile = "../grafana/sluice.json"
)

// descRecorder is a Registerer that forwards to a Registry and records the
// name of every metric a collector describes: vectors with no series yet
// are not in Gather's answer, but they are registered.
type descRecorder struct {
	*prometheus.Registry
	names map[string]bool
}

var fqName = regexp.MustCompile(`fqName: "([^"]*)"`)

func (d *descRecorder) Register(c prometheus.Collector) error {
	if err := d.Registry.Register(c); err != nil {
		return err
	}
	ch := make(chan *prometheus.Desc, 64)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		m := fqName.FindStringSubmatch(desc.String())
		if m == nil {
			panic("cannot read a metric name from " + desc.String())
		}
		d.names[m[1]] = true
	}
	return nil
}

func (d *descRecorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := d.Register(c); err != nil {
			panic(err)
		}
	}
}

// registeredMetrics builds what `sluice serve`, `sluice pipeline` and
// `sluice apply` register on their /metrics registries (the limiter, the
// sidecar server, the rule watcher, the decision-record producer and status
// join, the pipeline's consumer and merger with their stages, and the
// applier), and returns every metric name with its registry for linting.
func registeredMetrics(t *testing.T) (map[string]bool, []*prometheus.Registry) {
	t.Helper()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, pipeline.DefaultTopic, pipeline.DefaultOutputTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	brokers := kc.ListenAddrs()
	names := map[string]bool{}
	log := slog.New(slog.DiscardHandler)
	rdb := redisClient(t)

	// sluice serve: one registry for the limiter, the watcher, the producer,
	// the status join and the server.
	serve := &descRecorder{prometheus.NewRegistry(), names}
	dir := t.TempDir()
	rulesPath := dir + "/rules.yaml"
	if err := os.WriteFile(rulesPath, []byte("domain: d\nrules: [{id: r, match: [{key: user}], limit: 10, period: 1m}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	set, err := rules.Load(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	_, err = store.NewWatcher(store.WatchOptions{File: rulesPath, Apply: func(*rules.Set) {}, Logger: log, Registerer: serve})
	if err != nil {
		t.Fatal(err)
	}
	prod, err := pipeline.NewProducer(pipeline.ProducerOptions{Brokers: brokers, Logger: log, Registerer: serve})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prod.Close)
	join, err := sidecar.NewStatusJoin(prod, sidecar.StatusJoinOptions{Registerer: serve})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(join.Close)
	lim, err := enforcer.New(rdb, set, enforcer.Options{Registerer: serve, Logger: log, Sink: join, Budget: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	qp, err := gcounter.NewQuotaPublisher(gcounter.QuotaPublisherOptions{Brokers: brokers, Source: lim, Logger: log, Registerer: serve})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(qp.Close)
	// sluice serve's readiness probe and its maxmemory-policy reader.
	mem, err := enforcer.NewMemoryPolicy(enforcer.MemoryPolicyOptions{Logger: log, Registerer: serve})
	if err != nil {
		t.Fatal(err)
	}
	probe, err := enforcer.NewProbe(rdb, enforcer.ProbeOptions{Memory: mem, Logger: log, Registerer: serve})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := sidecar.New(lim, sidecar.Options{Registry: serve.Registry, Logger: log, Probe: probe})
	if err != nil {
		t.Fatal(err)
	}
	// The server registers on the Registry itself: one check over HTTP
	// gives its vectors a series each, so that Gather names them.
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/check",
		strings.NewReader(`{"domain":"d","descriptors":[{"entries":[{"key":"user","value":"u"}]}]}`)))
	if rec.Code != http.StatusOK {
		t.Fatalf("/v1/check: %d %s", rec.Code, rec.Body)
	}
	mfs, err := serve.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}

	// sluice pipeline: the consumer and the merger with the command's stages.
	pipe := &descRecorder{prometheus.NewRegistry(), names}
	ag, err := aggregator.New(aggregator.Options{Regions: []string{"a", "b"}, Rules: set.Rules, Interval: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	signals, err := detector.Signals(detector.Options{HeavyHitters: detector.HeavyHitterOptions{Window: 10 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	o := pipeline.Options{Brokers: brokers, Logger: log, Registerer: pipe, Writer: pipeline.NewRegionWriter(nil),
		Stages: append(signals, ag, detector.NewShadowTally())}
	c, err := pipeline.NewConsumer(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	m, err := pipeline.NewMerger(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)

	// sluice apply.
	apply := &descRecorder{prometheus.NewRegistry(), names}
	a, err := pipeline.NewApplier(pipeline.ApplierOptions{Brokers: brokers, Region: "a", Store: store.NewStore(rdb), Logger: log, Registerer: apply})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	qa, err := gcounter.NewQuotaApplier(gcounter.QuotaApplierOptions{Brokers: brokers, Region: "a", Redis: rdb, Merge: enforcer.MergeQuotaCounts, Logger: log, Registerer: apply})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(qa.Close)

	// sluice crowdsec: the bouncer (its client contacts nothing until Run).
	cs := &descRecorder{prometheus.NewRegistry(), names}
	cl, err := crowdsec.NewClient(crowdsec.ClientOptions{URL: "http://127.0.0.1:1", APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := crowdsec.NewBouncer(crowdsec.Options{Source: cl, Regions: []crowdsec.Region{{Name: "a", Store: store.NewStore(rdb)}}, Logger: log, Registerer: cs}); err != nil {
		t.Fatal(err)
	}
	return names, []*prometheus.Registry{serve.Registry, pipe.Registry, apply.Registry, cs.Registry}
}

// TestMetricNames: every metric the processes register is named
// sluice_<subsystem>_<what>_<unit|total> (STYLE.md) and passes Prometheus's
// own linter (promlint: counters end in _total, base units, help text).
func TestMetricNames(t *testing.T) {
	names, regs := registeredMetrics(t)
	style := regexp.MustCompile(`^sluice_(enforcer|sidecar|pipeline|apply|rules|quota|crowdsec)_[a-z0-9_]+$`)
	n := 0
	for name := range names {
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
			continue
		}
		n++
		if !style.MatchString(name) {
			t.Errorf("metric %s: want sluice_<subsystem>_<what>_<unit|total> (STYLE.md)", name)
		}
	}
	if n < 40 {
		t.Errorf("%d sluice metrics registered: fewer than the packages' docs list; is a registry missing?", n)
	}
	for _, reg := range regs {
		problems, err := promlint.NewWithMetricFamilies(mustGather(t, reg)).Lint()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
	}
}

func mustGather(t *testing.T, reg *prometheus.Registry) []*dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// promqlParser parses alert and panel expressions as Prometheus does.
var promqlParser = parser.NewParser(parser.Options{})

// metricsIn returns the metric names expr selects.
func metricsIn(expr parser.Expr) []string {
	var out []string
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			name := vs.Name
			for _, m := range vs.LabelMatchers {
				if m.Name == model.MetricNameLabel {
					name = m.Value
				}
			}
			out = append(out, name)
		}
		return nil
	})
	return out
}

// checkMetric reports whether name is registered, or is the _bucket, _sum
// or _count series of a registered histogram.
func checkMetric(names map[string]bool, name string) bool {
	if names[name] {
		return true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suf); ok && names[base] {
			return true
		}
	}
	return false
}

// TestAlertRules parses deploy/prometheus/alerts.yaml with Prometheus's rule
// parser (unknown fields are errors; exprs, durations and templates are
// checked), and checks that it has the alerts the operations doc promises
// and that every metric they name is registered by a sluice process.
func TestAlertRules(t *testing.T) {
	names, _ := registeredMetrics(t)
	groups, errs := rulefmt.ParseFile(alertsFile, false, model.UTF8Validation, promqlParser, slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Error(err)
	}
	if groups == nil {
		t.FailNow()
	}
	var alerts []string
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s: a recording rule %s; this file holds alerts only", g.Name, r.Record)
				continue
			}
			alerts = append(alerts, r.Alert)
			expr, err := promqlParser.ParseExpr(r.Expr)
			if err != nil {
				t.Errorf("%s: %v", r.Alert, err)
				continue
			}
			ms := metricsIn(expr)
			if len(ms) == 0 {
				t.Errorf("%s: selects no metric", r.Alert)
			}
			for _, name := range ms {
				if !checkMetric(names, name) {
					t.Errorf("%s: metric %s is not registered by any sluice process", r.Alert, name)
				}
			}
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: want a severity label and summary and description annotations", r.Alert)
			}
			if time.Duration(r.For) <= 0 {
				t.Errorf("%s: no 'for': a single bad scrape would page", r.Alert)
			}
		}
	}
	for _, want := range []string{"SluiceDegradedDecisions", "SluiceCircuitBreakerOpen", "SluiceSidecarShedding", "SluiceConsumerLag",
		"SluiceStaleShares", "SluiceDecisionRecordDrops", "SluiceDynamicRuleCapReached",
		"SluiceRedisAuthFailing", "SluiceRedisPermissionDenied", "SluiceRedisOutOfMemory", "SluiceRedisTLSFailing", "SluiceRedisEvictingPolicy"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("no alert %s in %s", want, alertsFile)
		}
	}
}

// dashboard is the part of a Grafana dashboard the test reads.
type dashboard struct {
	Title  string `json:"title"`
	UID    string `json:"uid"`
	Panels []struct {
		ID      int     `json:"id"`
		Type    string  `json:"type"`
		Title   string  `json:"title"`
		GridPos gridPos `json:"gridPos"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// grafanaVars are the Grafana variables the panels use, with the values
// the parse check puts in their place.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m")

// TestDashboard checks deploy/grafana/sluice.json: valid JSON with a title
// and uid, panels with unique ids that do not overlap, every target's PromQL
// parses, and every metric it names is registered; and it has a panel for
// each alert's subject.
// gridPos is a Grafana panel's place: height, width, column and row.
type gridPos struct{ H, W, X, Y int }

// panelLayout checks a dashboard's panels one by one, as Grafana lays them
// out: ids unique, a type, a title and targets each, inside the 24 columns,
// and no two overlapping.
type panelLayout struct {
	ids   map[int]bool
	cells map[[2]int]string
}

func (l *panelLayout) check(t *testing.T, id int, typ, title string, targets int, g gridPos) {
	t.Helper()
	if l.ids == nil {
		l.ids, l.cells = map[int]bool{}, map[[2]int]string{}
	}
	if l.ids[id] {
		t.Errorf("panel id %d twice", id)
	}
	l.ids[id] = true
	if typ == "" || title == "" || targets == 0 {
		t.Errorf("panel %d %q: want a type, a title and targets", id, title)
	}
	if g.W <= 0 || g.H <= 0 || g.X+g.W > 24 {
		t.Errorf("panel %q: gridPos %+v outside Grafana's 24 columns", title, g)
	}
	for x := g.X; x < g.X+g.W; x++ {
		for y := g.Y; y < g.Y+g.H; y++ {
			if other, ok := l.cells[[2]int{x, y}]; ok {
				t.Errorf("panels %q and %q overlap at %d,%d", other, title, x, y)
			}
			l.cells[[2]int{x, y}] = title
		}
	}
}

func TestDashboard(t *testing.T) {
	names, _ := registeredMetrics(t)
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.Title == "" || d.UID == "" || len(d.Panels) == 0 {
		t.Fatalf("%s: want a title, a uid and panels", dashboardFile)
	}
	var layout panelLayout
	used := map[string]bool{}
	for _, p := range d.Panels {
		layout.check(t, p.ID, p.Type, p.Title, len(p.Targets), p.GridPos)
		for _, tg := range p.Targets {
			expr, err := promqlParser.ParseExpr(grafanaVars.Replace(tg.Expr))
			if err != nil {
				t.Errorf("panel %q target %s: %v", p.Title, tg.RefID, err)
				continue
			}
			for _, name := range metricsIn(expr) {
				used[name] = true
				if !checkMetric(names, name) {
					t.Errorf("panel %q: metric %s is not registered by any sluice process", p.Title, name)
				}
			}
		}
	}
	for _, want := range []string{"sluice_enforcer_degraded_decisions_total", "sluice_enforcer_breaker_state",
		"sluice_pipeline_consumer_lag_records", "sluice_enforcer_share_newest_timestamp_seconds",
		"sluice_pipeline_producer_records_total", "sluice_enforcer_dynamic_rules_over_cap", "sluice_enforcer_load_shed_total",
		"sluice_enforcer_adaptive_factor"} {
		if !used[want] {
			t.Errorf("no panel shows %s (an alert's subject)", want)
		}
	}
}

// TestMetricCheckFails: the checks above catch a metric that no process
// registers, in an alert or a panel.
func TestMetricCheckFails(t *testing.T) {
	names := map[string]bool{"sluice_x_duration_seconds": true}
	for name, want := range map[string]bool{
		"sluice_x_duration_seconds_bucket": true, "sluice_x_duration_seconds_count": true,
		"sluice_x_duration_seconds": true, "sluice_y_total": false, "sluice_x_duration": false,
	} {
		if got := checkMetric(names, name); got != want {
			t.Errorf("checkMetric(%s) = %v, want %v", name, got, want)
		}
	}
	expr, err := promqlParser.ParseExpr(`sum(rate(a_total[5m])) / on() {__name__="b"} > 0 and c`)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(metricsIn(expr)); got != "[a_total b c]" {
		t.Errorf("metricsIn = %s, want [a_total b c]", got)
	}
}

// TestServedMetricsAreKnown runs the real `sluice serve`, `sluice pipeline`
// and `sluice apply` (the binary built from cmd/sluice) and scrapes their
// /metrics: every sluice family they serve is one registeredMetrics knows,
// so the alert and dashboard checks above see what the processes serve.
func TestServedMetricsAreKnown(t *testing.T) {
	names, _ := registeredMetrics(t)
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, pipeline.DefaultTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	broker := kc.ListenAddrs()[0]
	addr := redisAddr(t)

	_, serveHTTP, _ := serve(t, "--redis", addr, "--rules", "../../testdata/rules/per-ip-60.yaml", "--brokers", broker)
	metricsAt := regexp.MustCompile(`metrics=(127\.0\.0\.1:\d+)`)
	started := func(log *syncBuffer) string {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if m := metricsAt.FindStringSubmatch(log.String()); m != nil {
				return m[1]
			}
		}
		t.Fatalf("no metrics address in the log:\n%s", log)
		return ""
	}
	pipeLog, _ := runSluice(t, []string{"pipeline", "--brokers", broker, "--region", "eu", "--metrics", "127.0.0.1:0"}, "pipeline stopped", 20*time.Second)
	pipeHTTP := started(pipeLog)
	applyLog, _ := runSluice(t, []string{"apply", "--brokers", broker, "--region", "eu", "--redis", addr, "--metrics", "127.0.0.1:0"}, "applier stopped", 20*time.Second)
	applyHTTP := started(applyLog)

	family := regexp.MustCompile(`(?m)^# TYPE (sluice_[a-z0-9_]+) `)
	for cmd, c := range map[string]struct{ addr, prefix string }{
		"serve":    {serveHTTP, "sluice_enforcer_"},
		"pipeline": {pipeHTTP, "sluice_pipeline_"},
		"apply":    {applyHTTP, "sluice_apply_"},
	} {
		r, err := http.Get("http://" + c.addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		served := family.FindAllStringSubmatch(string(b), -1)
		own := 0
		for _, m := range served {
			if !names[m[1]] {
				t.Errorf("sluice %s serves %s, which the test's registries lack: add its constructor to registeredMetrics", cmd, m[1])
			}
			if strings.HasPrefix(m[1], c.prefix) {
				own++
			}
		}
		if r.StatusCode != http.StatusOK || own == 0 {
			t.Errorf("sluice %s /metrics: %d, %d %s* families", cmd, r.StatusCode, own, c.prefix)
		}
	}
}

// floatSample is one sample of a synthetic series.
type floatSample struct {
	t int64
	f float64
}

func (s floatSample) T() int64                      { return s.t }
func (s floatSample) ST() int64                     { return 0 }
func (s floatSample) F() float64                    { return s.f }
func (s floatSample) H() *histogram.Histogram       { return nil }
func (s floatSample) FH() *histogram.FloatHistogram { return nil }
func (s floatSample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s floatSample) Copy() chunks.Sample           { return s }

// seriesList is a storage.SeriesSet over a slice.
type seriesList struct {
	s []storage.Series
	i int
}

func (l *seriesList) Next() bool                        { l.i++; return l.i <= len(l.s) }
func (l *seriesList) At() storage.Series                { return l.s[l.i-1] }
func (l *seriesList) Err() error                        { return nil }
func (l *seriesList) Warnings() annotations.Annotations { return nil }

// loadSeries returns a Queryable over series written one a line in
// Prometheus's series notation (`name{labels} 0+100x20`, as promtool's rule
// tests write them), one sample a minute from time 0, parsed by
// promql/parser's ParseSeriesDesc; it answers through Prometheus's
// storage.MockQueryable, without a TSDB.
func loadSeries(t *testing.T, text string) storage.Queryable {
	t.Helper()
	var all []storage.Series
	for _, line := range strings.Split(text, "\n") {
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		lset, vals, err := promqlParser.ParseSeriesDesc(line)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		var samples []chunks.Sample
		for i, v := range vals {
			if !v.Omitted {
				samples = append(samples, floatSample{t: int64(i) * time.Minute.Milliseconds(), f: v.Value})
			}
		}
		all = append(all, storage.NewListSeries(lset, samples))
	}
	q := &storage.MockQuerier{SelectMockFunction: func(_ bool, _ *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
		var out []storage.Series
	series:
		for _, s := range all {
			for _, m := range ms {
				if !m.Matches(s.Labels().Get(m.Name)) {
					continue series
				}
			}
			out = append(out, s)
		}
		slices.SortFunc(out, func(a, b storage.Series) int { return labels.Compare(a.Labels(), b.Labels()) })
		return &seriesList{s: out}
	}}
	return &storage.MockQueryable{MockQuerier: q}
}

// TestAlertsFire evaluates each alert's expression with Prometheus's own
// engine over synthetic series (one sample a minute for 20 minutes): it
// fires for the pod that is in trouble and not for the healthy one. ("for"
// is left to Prometheus: the parser checked it.)
func TestAlertsFire(t *testing.T) {
	groups, errs := rulefmt.ParseFile(alertsFile, false, model.UTF8Validation, promqlParser, slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	exprs := map[string]string{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			exprs[r.Alert] = r.Expr
		}
	}
	cases := map[string]struct {
		series string
		firing []string // the pods it fires for
	}{
		"SluiceDegradedDecisions": {`
			sluice_enforcer_decisions_total{pod="bad"} 0+100x20
			sluice_enforcer_degraded_decisions_total{pod="bad"} 0+2x20
			sluice_enforcer_decisions_total{pod="ok"} 0+100x20
			sluice_enforcer_degraded_decisions_total{pod="ok"} 0+0.5x20`, []string{"bad"}},
		"SluiceCircuitBreakerOpen": {`
			sluice_enforcer_breaker_state{pod="bad"} 2x20
			sluice_enforcer_breaker_state{pod="ok"} 1x20`, []string{"bad"}},
		"SluiceSidecarShedding": {`
			sluice_enforcer_decisions_total{pod="bad"} 0+100x20
			sluice_enforcer_shed_total{pod="bad"} 0+1x20
			sluice_enforcer_decisions_total{pod="ok"} 0+100x20
			sluice_enforcer_shed_total{pod="ok"} 0+0.01x20`, []string{"bad"}},
		"SluiceSidecarCPUStalled": {`
			sluice_enforcer_stalled_seconds_total{pod="bad"} 0+15x20
			sluice_enforcer_stalled_seconds_total{pod="ok"} 0+3x20`, []string{"bad"}},
		"SluiceLoadSheddingBeyondSheddable": {`
			sluice_enforcer_load_shed_total{pod="bad",priority="normal"} 0+1x20
			sluice_enforcer_load_shed_total{pod="ok",priority="sheddable"} 0+50x20
			sluice_enforcer_load_shed_total{pod="ok",priority="normal"} 3x20`, []string{"bad"}},
		"SluiceAdaptiveLimitsCut": {`
			sluice_enforcer_adaptive_factor{pod="bad"} 0.3x20
			sluice_enforcer_adaptive_factor{pod="ok"} 0.8x20`, []string{"bad"}},
		"SluiceRedisAuthFailing": {`
			sluice_enforcer_redis_down_cause{pod="bad",cause="wrongpass"} 1x20
			sluice_enforcer_redis_down_cause{pod="bad",cause="noperm"} 0x20
			sluice_enforcer_redis_down_cause{pod="ok",cause="wrongpass"} 0x20
			sluice_enforcer_redis_down_cause{pod="ok",cause="timeout"} 1x20`, []string{"bad"}},
		"SluiceRedisPermissionDenied": {`
			sluice_enforcer_redis_down_cause{pod="bad",cause="noperm"} 1x20
			sluice_enforcer_redis_down_cause{pod="ok",cause="noperm"} 0x20
			sluice_enforcer_redis_down_cause{pod="ok",cause="noauth"} 1x20`, []string{"bad"}},
		"SluiceRedisOutOfMemory": {`
			sluice_enforcer_redis_down_cause{pod="bad",cause="oom"} 1x20
			sluice_enforcer_redis_down_cause{pod="ok",cause="oom"} 0x20`, []string{"bad"}},
		"SluiceRedisReadOnly": {`
			sluice_enforcer_redis_down_cause{pod="bad",cause="readonly"} 1x20
			sluice_enforcer_redis_down_cause{pod="ok",cause="readonly"} 0x20
			sluice_enforcer_redis_down_cause{pod="ok",cause="loading"} 1x20`, []string{"bad"}},
		"SluiceRedisWritesRefused": {`
			sluice_enforcer_redis_down_cause{pod="bad",cause="misconf"} 1x20
			sluice_enforcer_redis_down_cause{pod="ok",cause="misconf"} 0x20`, []string{"bad"}},
		"SluiceRedisLoading": {`
			sluice_enforcer_redis_down_cause{pod="bad",cause="loading"} 1x20
			sluice_enforcer_redis_down_cause{pod="ok",cause="loading"} 0x20`, []string{"bad"}},
		"SluiceRedisTLSFailing": {`
			sluice_enforcer_redis_down_cause{pod="bad",cause="tls"} 1x20
			sluice_enforcer_redis_down_cause{pod="ok",cause="tls"} 0x20
			sluice_enforcer_redis_down_cause{pod="ok",cause="unreachable"} 1x20`, []string{"bad"}},
		"SluiceRedisEvictingPolicy": {`
			sluice_enforcer_redis_maxmemory_policy{pod="bad",policy="allkeys-lru"} 1x20
			sluice_enforcer_redis_maxmemory_policy{pod="bad",policy="noeviction"} 0x20
			sluice_enforcer_redis_maxmemory_policy{pod="ok",policy="noeviction"} 1x20
			sluice_enforcer_redis_maxmemory_policy{pod="ok",policy="allkeys-lru"} 0x20`, []string{"bad"}},
		"SluiceHomeRegionUnreachable": {`
			sluice_enforcer_home_breaker_state{pod="bad"} 2x20
			sluice_enforcer_home_breaker_state{pod="ok"} 0x20`, []string{"bad"}},
		"SluiceStaleShares": {`
			sluice_enforcer_share_newest_timestamp_seconds{pod="bad"} 1100x20
			sluice_enforcer_share_newest_timestamp_seconds{pod="ok"} 1150x20
			sluice_enforcer_share_newest_timestamp_seconds{pod="fresh"} 0+60x20
			sluice_enforcer_share_newest_timestamp_seconds{pod="no-global-rules"} 0x20`, []string{"bad"}},
		"SluiceDynamicRuleCapReached": {`
			sluice_enforcer_dynamic_rules_over_cap{pod="bad"} 3x20
			sluice_enforcer_dynamic_rules_over_cap{pod="ok"} 0x20`, []string{"bad"}},
		"SluiceDecisionRecordDrops": {`
			sluice_pipeline_producer_records_total{pod="bad",result="dropped"} 0+5x20
			sluice_pipeline_producer_records_total{pod="bad",result="produced"} 0+100x20
			sluice_pipeline_producer_records_total{pod="ok",result="dropped"} 7x20
			sluice_pipeline_producer_records_total{pod="ok",result="produced"} 0+100x20`, []string{"bad"}},
		"SluiceConsumerLag": {`
			sluice_pipeline_consumer_lag_records{pod="bad",tier="partition"} 200000x20
			sluice_pipeline_consumer_lag_records{pod="ok",tier="merge"} 10x20`, []string{"bad"}},
		"SluiceApplyLag": {`
			sluice_apply_lag_records{pod="bad",region="eu"} 5000x20
			sluice_apply_lag_records{pod="ok",region="us"} 0x20`, []string{"bad"}},
		"SluiceCrowdSecStreamStale": {`
			sluice_crowdsec_stream_age_seconds{pod="bad"} 0+60x20
			sluice_crowdsec_stream_age_seconds{pod="ok"} 5x20`, []string{"bad"}},
		"SluiceCrowdSecRulesWaiting": {`
			sluice_crowdsec_rules_refused_total{pod="bad",region="eu",reason="cap"} 0+1x20
			sluice_crowdsec_rules_refused_total{pod="ok",region="eu",reason="cap"} 4x20`, []string{"bad"}},
	}
	for alert := range exprs {
		if _, ok := cases[alert]; !ok {
			t.Errorf("alert %s has no case here", alert)
		}
	}
	for alert, c := range cases {
		t.Run(alert, func(t *testing.T) {
			expr, ok := exprs[alert]
			if !ok {
				t.Fatalf("no alert %s", alert)
			}
			engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 1_000_000, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
			q, err := engine.NewInstantQuery(context.Background(), loadSeries(t, c.series), nil, expr, time.Unix(0, 0).Add(20*time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			res := q.Exec(context.Background())
			if res.Err != nil {
				t.Fatal(res.Err)
			}
			vec, err := res.Vector()
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, s := range vec {
				got = append(got, s.Metric.Get("pod"))
			}
			slices.Sort(got)
			if !slices.Equal(got, c.firing) {
				t.Errorf("fires for %v, want %v: %s", got, c.firing, vec)
			}
		})
	}
}
