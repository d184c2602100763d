package crowdsec

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
)

// Alert is a CrowdSec alert as POST /v1/alerts takes it (models.Alert of
// the Local API's swagger): every field a Local API since 1.0 requires,
// and the optional ones sluice fills.
type Alert struct {
	Scenario        string `json:"scenario"`
	ScenarioHash    string `json:"scenario_hash"`
	ScenarioVersion string `json:"scenario_version"`
	Message         string `json:"message"`
	// EventsCount is the requests behind the detection (the evidence's
	// count); Events holds one summary event with the evidence.
	EventsCount int32   `json:"events_count"`
	Events      []Event `json:"events"`
	// Capacity and Leakspeed describe a leaky bucket, which sluice's
	// signals are not: 0 and the rule's period.
	Capacity  int32  `json:"capacity"`
	Leakspeed string `json:"leakspeed"`
	StartAt   string `json:"start_at"`
	StopAt    string `json:"stop_at"`
	Source    Source `json:"source"`
	Meta      []Meta `json:"meta,omitempty"`
	// Simulated marks a shadow rule's alert (CrowdSec's simulation mode).
	Simulated bool `json:"simulated"`
	// Remediation lets the Local API's profiles (profiles.yaml) turn the
	// alert into decisions; Decisions is always empty.
	Remediation bool       `json:"remediation"`
	Decisions   []struct{} `json:"decisions"`
}

// Event is one event of an Alert.
type Event struct {
	Timestamp string `json:"timestamp"`
	Meta      []Meta `json:"meta"`
}

// Meta is a key and value of an Alert or Event.
type Meta struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// Source is what an Alert is about: Scope and Value, and for the scopes
// CrowdSec knows, IP, Range or AsNumber.
type Source struct {
	Scope    string `json:"scope"`
	Value    string `json:"value"`
	IP       string `json:"ip,omitempty"`
	Range    string `json:"range,omitempty"`
	AsNumber string `json:"as_number,omitempty"`
}

// ScenarioPrefix starts the scenario of every alert sluice pushes:
// "sluice/heavy-hitter" for a rule of origin "detector/heavy-hitter".
const ScenarioPrefix = "sluice/"

// maxSources bounds the alerts one rule makes (one per network of a
// client_ip match).
const maxSources = 16

// AlertsFor returns the alerts of one dynamic rule: one per source it
// limits (its client_ip address or each of its networks, up to 16; else
// its AS number; else the value of its first match, an api_key as a hash),
// with scenario ScenarioPrefix + its origin past "detector/", the rule's
// reason as message, its evidence in the meta of the alert and of its one
// event, the evidence's count as events count (1 without one), and its
// window (evidence window_start, window_end) as start and stop. A shadow
// rule's alerts are Simulated. It returns none for a rule without a match.
func AlertsFor(r *rules.Rule, remediation bool, version string) []Alert {
	sources, more := sourcesOf(r)
	if len(sources) == 0 {
		return nil
	}
	meta := []Meta{
		{"sluice_rule", r.ID},
		{"sluice_origin", r.Origin},
		{"sluice_mode", r.Mode.String()},
		{"sluice_limit", r.Describe()},
		{"sluice_match", matchText(r)},
	}
	if !r.ExpiresAt.IsZero() {
		meta = append(meta, Meta{"sluice_expires_at", r.ExpiresAt.UTC().Format(time.RFC3339)})
	}
	if more > 0 {
		meta = append(meta, Meta{"sluice_more_networks", strconv.Itoa(more)})
	}
	for _, k := range slices.Sorted(maps.Keys(r.Evidence)) {
		meta = append(meta, Meta{k, r.Evidence[k]})
	}
	start, stop := window(r)
	msg := r.Reason
	if msg == "" {
		msg = r.Describe()
	}
	period := r.Period.String()
	out := make([]Alert, 0, len(sources))
	for _, s := range sources {
		out = append(out, Alert{
			Scenario:        ScenarioPrefix + strings.TrimPrefix(r.Origin, "detector/"),
			ScenarioHash:    "",
			ScenarioVersion: version,
			Message:         msg,
			EventsCount:     eventsCount(r.Evidence),
			Events:          []Event{{Timestamp: stop, Meta: meta}},
			Leakspeed:       period,
			StartAt:         start,
			StopAt:          stop,
			Source:          s,
			Meta:            meta,
			Simulated:       r.Mode == rules.Shadow,
			Remediation:     remediation,
			Decisions:       []struct{}{},
		})
	}
	return out
}

// sourcesOf returns the sources a rule limits, and how many networks past
// maxSources it left out.
func sourcesOf(r *rules.Rule) ([]Source, int) {
	var first *rules.Match
	for i := range r.Match {
		m := &r.Match[i]
		switch {
		case m.Key == rules.KeyClientIP && len(m.CIDR) > 0:
			var out []Source
			for _, p := range m.CIDR[:min(len(m.CIDR), maxSources)] {
				if p.IsSingleIP() {
					a := p.Addr().String()
					out = append(out, Source{Scope: ScopeIP, Value: a, IP: a})
				} else {
					out = append(out, Source{Scope: ScopeRange, Value: p.String(), Range: p.String()})
				}
			}
			return out, max(0, len(m.CIDR)-maxSources)
		case m.Key == rules.KeyClientIP && m.Value != "":
			if strings.Contains(m.Value, "/") { // an IPv6 client keyed by its network
				return []Source{{Scope: ScopeRange, Value: m.Value, Range: m.Value}}, 0
			}
			return []Source{{Scope: ScopeIP, Value: m.Value, IP: m.Value}}, 0
		case m.Key == rules.KeyASN && m.Value != "":
			return []Source{{Scope: ScopeAS, Value: m.Value, AsNumber: m.Value}}, 0
		}
		if first == nil && (m.Value != "" || len(m.Values) > 0) {
			first = m
		}
	}
	if first == nil {
		if len(r.Match) == 0 {
			return nil, 0
		}
		return []Source{{Scope: r.Match[0].KeyName(), Value: r.Match[0].Condition()}}, 0
	}
	v := first.Value
	if v == "" {
		v = strings.Join(first.Values, ",")
	}
	if first.Key == rules.KeyAPIKey { // a secret: its hash only
		h := sha256.Sum256([]byte(v))
		v = "sha256:" + hex.EncodeToString(h[:8])
	}
	return []Source{{Scope: first.KeyName(), Value: v}}, 0
}

// matchText writes a rule's match in words, e.g. "asn = 64500; route =
// /v1/search", with api_key values hidden.
func matchText(r *rules.Rule) string {
	ms := make([]string, len(r.Match))
	for i := range r.Match {
		m := &r.Match[i]
		if m.Key == rules.KeyAPIKey {
			ms[i] = m.KeyName() + " (hidden)"
			continue
		}
		ms[i] = m.KeyName() + " " + m.Condition()
	}
	return strings.Join(ms, "; ")
}

// eventsCount is the evidence's request count, else 1.
func eventsCount(ev map[string]string) int32 {
	for _, k := range []string{"count", "requests", "failed_logins"} {
		if n, err := strconv.ParseUint(ev[k], 10, 64); err == nil && n > 0 {
			return int32(min(n, 1<<31-1))
		}
	}
	return 1
}

// window returns the detection's window from the evidence, else the
// rule's version (the window's end in Unix ms), RFC 3339.
func window(r *rules.Rule) (start, stop string) {
	parse := func(k string) (time.Time, bool) {
		t, err := time.Parse(time.RFC3339, r.Evidence[k])
		return t, err == nil
	}
	end, ok := parse("window_end")
	if !ok {
		end = time.UnixMilli(r.Version)
		if r.Version <= 0 {
			end = time.Now()
		}
	}
	begin, ok := parse("window_start")
	if !ok {
		begin = end
	}
	return begin.UTC().Format(time.RFC3339), end.UTC().Format(time.RFC3339)
}

// AlertOptions configure an AlertPusher. Zero fields take the defaults
// named.
type AlertOptions struct {
	// Client is the Local API, with a machine's id and password
	// (required).
	Client *Client
	// Origins are the rule origins that become alerts: an entry ending in
	// "/" matches every origin it prefixes. Default ["detector/"].
	Origins []string
	// Remediation lets the Local API's profiles make decisions of the
	// alerts (for CrowdSec's other bouncers); by default they are only
	// alerts. With it, a profile may ban the sources of sluice's shadow
	// rules, which the Bouncer then enforces.
	Remediation bool
	// Version is every alert's scenario_version (sluice's version).
	Version string
	// Queue bounds the alerts waiting to be pushed; past it, new ones are
	// dropped and counted. Default 1024.
	Queue int
	// Batch is the most alerts per POST. Default 64.
	Batch int
	// RetryMax caps the backoff between pushes while the Local API fails
	// (from 500 ms, doubling). Default 30 s.
	RetryMax time.Duration

	Logger     *slog.Logger          // default slog.Default()
	Registerer prometheus.Registerer // nil registers no metrics
}

// AlertPusher pushes the dynamic rules the detector emits to a CrowdSec
// Local API as alerts (AlertsFor), as a registered machine, so that cscli
// alerts list, the console and CrowdSec's notifications show them.
//
// It is a stage.Writer: Write (or the writer Wrap returns, after the
// pipeline's own) queues the alerts of the rules it is given and returns at
// once, never failing, so that the Local API never holds back the
// pipeline; Run pushes them in batches, retrying with backoff while the
// Local API fails; past Queue, alerts are dropped and counted. A rule
// version already pushed is not pushed again (a pipeline that restarts
// writes its output again). Build one with NewAlertPusher, call Run, Flush
// before Close to push what is queued. Safe for concurrent use.
type AlertPusher struct {
	o AlertOptions
	q chan Alert
	m alertMetrics

	mu      sync.Mutex
	pending int           // queued or being pushed
	idle    chan struct{} // closed while pending is 0
	seen    map[string]bool
	ring    []string // seen's keys, oldest first, for its bound
	next    int

	stop   context.Context
	cancel context.CancelFunc
}

// Results of alerts (label result of sluice_crowdsec_alerts_total).
const (
	alertSent    = "sent"    // the Local API took it
	alertDropped = "dropped" // the queue was full
	alertRefused = "refused" // the Local API refused it (400: its validation), logged
)

type alertMetrics struct {
	results map[string]prometheus.Counter
	errors  prometheus.Counter
	// the results again, for Stats
	sent, dropped, refused atomic.Int64
}

// AlertStats count what an AlertPusher did with its alerts.
type AlertStats struct {
	Sent, Dropped, Refused int64
}

// Stats returns the pusher's counts since it was made.
func (p *AlertPusher) Stats() AlertStats {
	return AlertStats{Sent: p.m.sent.Load(), Dropped: p.m.dropped.Load(), Refused: p.m.refused.Load()}
}

// seenBound bounds the rule versions remembered as pushed.
const seenBound = 4096

// NewAlertPusher checks o and registers the metrics.
func NewAlertPusher(o AlertOptions) (*AlertPusher, error) {
	if o.Client == nil {
		return nil, errors.New("crowdsec: the alert pusher needs a Client with a machine's id and password")
	}
	if o.Client.o.MachineID == "" || o.Client.o.Password == "" {
		return nil, fmt.Errorf("%w: pushing alerts needs a machine id and password (cscli machines add)", ErrNoCredentials)
	}
	if o.Origins == nil {
		o.Origins = []string{"detector/"}
	}
	if o.Queue <= 0 {
		o.Queue = 1024
	}
	if o.Batch <= 0 {
		o.Batch = 64
	}
	if o.RetryMax <= 0 {
		o.RetryMax = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	results := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_crowdsec_alerts_total",
		Help: "Alerts of the detector's rules for the CrowdSec Local API, by result: sent, dropped (the queue was full while the Local API failed), refused (the Local API's validation refused them; logged)."}, []string{"result"})
	errs := prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_crowdsec_alert_push_errors_total",
		Help: "Failed pushes of alerts to the Local API (unreachable, refusing the machine's login, or an error); retried with backoff."})
	c := &collectors{reg: o.Registerer}
	c.add(results, errs)
	if c.err != nil {
		return nil, c.err
	}
	p := &AlertPusher{o: o, q: make(chan Alert, o.Queue), idle: make(chan struct{}), seen: map[string]bool{},
		m: alertMetrics{results: counters(results, alertSent, alertDropped, alertRefused), errors: errs}}
	close(p.idle)
	p.stop, p.cancel = context.WithCancel(context.Background())
	return p, nil
}

// Write queues the alerts of out's rules whose origin is one of Origins.
// It never blocks and never fails.
func (p *AlertPusher) Write(_ context.Context, out stage.Output) error {
	for i := range out.Rules {
		r := &out.Rules[i]
		if !p.origin(r.Origin) || !p.first(r.ID+"@"+strconv.FormatInt(r.Version, 10)) {
			continue
		}
		for _, a := range AlertsFor(r, p.o.Remediation, p.o.Version) {
			p.mu.Lock()
			select {
			case p.q <- a:
				if p.pending == 0 {
					p.idle = make(chan struct{})
				}
				p.pending++
			default:
				p.m.results[alertDropped].Inc()
				p.m.dropped.Add(1)
			}
			p.mu.Unlock()
		}
	}
	return nil
}

// Wrap returns a writer that writes to next and, when next succeeded, to p.
func (p *AlertPusher) Wrap(next stage.Writer) stage.Writer { return &tee{next: next, p: p} }

type tee struct {
	next stage.Writer
	p    *AlertPusher
}

func (t *tee) Write(ctx context.Context, o stage.Output) error {
	if err := t.next.Write(ctx, o); err != nil {
		return err
	}
	return t.p.Write(ctx, o)
}

func (p *AlertPusher) origin(o string) bool {
	for _, x := range p.o.Origins {
		if x == o || (strings.HasSuffix(x, "/") && strings.HasPrefix(o, x)) {
			return true
		}
	}
	return false
}

// first reports whether key is new, remembering the last seenBound keys.
func (p *AlertPusher) first(key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.seen[key] {
		return false
	}
	if len(p.ring) < seenBound {
		p.ring = append(p.ring, key)
	} else {
		delete(p.seen, p.ring[p.next])
		p.ring[p.next] = key
		p.next = (p.next + 1) % seenBound
	}
	p.seen[key] = true
	return true
}

// done marks n alerts as handled.
func (p *AlertPusher) done(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pending -= n
	if p.pending == 0 {
		close(p.idle)
	}
}

// Run pushes queued alerts until ctx ends or Close; it returns nil then.
func (p *AlertPusher) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(p.stop, cancel)()
	bo := &backoff.ExponentialBackOff{InitialInterval: 500 * time.Millisecond, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: p.o.RetryMax}
	var loggedAt time.Time
	for {
		var batch []Alert
		select {
		case <-ctx.Done():
			return nil
		case a := <-p.q:
			batch = append(batch, a)
		}
	more:
		for len(batch) < p.o.Batch {
			select {
			case a := <-p.q:
				batch = append(batch, a)
			default:
				break more
			}
		}
		bo.Reset()
		for {
			_, err := p.o.Client.PushAlerts(ctx, batch)
			if ctx.Err() != nil {
				return nil
			}
			var se *StatusError
			if err == nil {
				p.m.results[alertSent].Add(float64(len(batch)))
				p.m.sent.Add(int64(len(batch)))
				break
			}
			if errors.As(err, &se) && se.Status == 400 {
				p.m.results[alertRefused].Add(float64(len(batch)))
				p.m.refused.Add(int64(len(batch)))
				p.o.Logger.Error("the CrowdSec Local API refused sluice's alerts: dropped", "alerts", len(batch), "scenario", batch[0].Scenario, "err", err)
				break
			}
			p.m.errors.Inc()
			if time.Since(loggedAt) >= time.Minute {
				loggedAt = time.Now()
				p.o.Logger.Warn("pushing alerts to the CrowdSec Local API failed; retrying", "alerts", len(batch), "queued", len(p.q), "err", err)
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(bo.NextBackOff()):
			}
		}
		p.done(len(batch))
	}
}

// Flush waits until every queued alert is pushed (or refused), or ctx
// ends (then it returns ctx's error).
func (p *AlertPusher) Flush(ctx context.Context) error {
	p.mu.Lock()
	idle := p.idle
	p.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("crowdsec: %d alerts not pushed: %w", p.Pending(), ctx.Err())
	}
}

// Pending returns the alerts queued or being pushed.
func (p *AlertPusher) Pending() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pending
}

// Close stops Run; alerts still queued are not pushed (Flush first).
// Safe to call twice.
func (p *AlertPusher) Close() { p.cancel() }
