package crowdsec

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/rules"
)

// DecisionSource is what a Bouncer needs of the Local API; *Client has it.
type DecisionSource interface {
	Stream(ctx context.Context, q StreamQuery) (*Stream, error)
}

// RegionStore is what a Bouncer needs of a region's rule store;
// *store.Store has it.
type RegionStore interface {
	// Dynamic returns every stored dynamic rule.
	Dynamic(ctx context.Context) ([]*rules.DynamicRule, error)
	PutDynamic(ctx context.Context, now time.Time, rs []rules.Rule) (int, error)
	// DeleteDynamic deletes those of ids whose origin starts with origin.
	DeleteDynamic(ctx context.Context, origin string, ids ...string) (int, error)
	Killed(ctx context.Context) (bool, string, error)
	// Cap is the region's cap on active dynamic rules, of every origin.
	Cap() int
}

// Region is one region's rule store, by name.
type Region struct {
	Name  string
	Store RegionStore
}

// Options configure a Bouncer. Zero fields take the defaults named.
type Options struct {
	Source  DecisionSource // required: the Local API, with a bouncer's API key
	Regions []Region       // required: every region's store, by unique name
	Mapping Mapping
	// Scopes are asked of the decision stream; default DefaultScopes.
	Scopes []string
	// Interval is how often the stream is pulled; default 10 s, as
	// CrowdSec's own bouncers' update_frequency.
	Interval time.Duration
	// FullPull is how often a pull asks for every active decision
	// (startup=true) instead of the changes; default 5 min. A Local API
	// before v1.5 records a bouncer's last pull after its query, so a
	// decision committed while a pull runs is in no later answer of
	// changes: the full pull repairs that within FullPull.
	FullPull time.Duration
	// RetryMax caps the backoff between pulls while the Local API fails
	// (from 500 ms, doubling), and between writes to a failing region's
	// Redis (from 100 ms). Default 30 s.
	RetryMax time.Duration
	// Resync is how often each region is brought to the decisions even
	// when the stream brought no change: rules a restarted Redis lost are
	// written again, rules of decisions longer than rules.MaxDynamicTTL
	// are renewed, and decisions held back by the kill switch are written
	// once it is off. Default 30 s.
	Resync time.Duration
	// MaxRules caps the rules the bouncer keeps in each region's Redis;
	// past it, decisions (bans first, then in order of arrival) wait,
	// counted and logged. Every enforcer loads every dynamic rule each
	// second (sluice serve --refresh) and applies at most its
	// --dynamic-cap (default 1000) of all origins. Default 500.
	MaxRules int
	// Timeout bounds one region's sync (reading, deleting, writing its
	// rules). Default 10 s.
	Timeout time.Duration
	// Now is the clock decisions' expiries are reckoned on. Default
	// time.Now.
	Now func() time.Time

	Logger     *slog.Logger          // default slog.Default()
	Registerer prometheus.Registerer // nil registers no metrics
}

func (o *Options) defaults() error {
	if o.Source == nil {
		return errors.New("crowdsec: the bouncer needs a decision source (a Client with a bouncer's API key)")
	}
	if len(o.Regions) == 0 {
		return errors.New("crowdsec: the bouncer needs at least one region's rule store")
	}
	seen := map[string]bool{}
	for _, r := range o.Regions {
		if !rules.ValidID(r.Name) || r.Store == nil || seen[r.Name] {
			return fmt.Errorf("crowdsec: region %q: want a unique name of 1-64 letters, digits, '-', '_' and '.', with a store", r.Name)
		}
		seen[r.Name] = true
	}
	for t, l := range o.Mapping.Limits {
		if _, err := ParseLimit(l.String()); err != nil || t == TypeBan {
			return fmt.Errorf("crowdsec: the limit of type %q, %s: want a type other than ban and N >= 1 per a period >= 1ms", t, l)
		}
	}
	if d := o.Mapping.Default; d != (Limit{}) {
		if _, err := ParseLimit(d.String()); err != nil {
			return fmt.Errorf("crowdsec: the default limit %s: %w", d, err)
		}
	}
	if p := o.Mapping.IPv6Prefix; p < 0 || p > 128 {
		return fmt.Errorf("crowdsec: IPv6Prefix %d: want 1 to 128 (0: 64)", p)
	}
	if len(o.Scopes) == 0 {
		o.Scopes = DefaultScopes
	}
	for _, d := range []*time.Duration{&o.Interval, &o.FullPull, &o.RetryMax, &o.Resync, &o.Timeout} {
		if *d < 0 {
			return fmt.Errorf("crowdsec: negative duration %v in the bouncer's options", *d)
		}
	}
	if o.Interval == 0 {
		o.Interval = 10 * time.Second
	}
	if o.FullPull == 0 {
		o.FullPull = 5 * time.Minute
	}
	if o.RetryMax == 0 {
		o.RetryMax = 30 * time.Second
	}
	if o.Resync == 0 {
		o.Resync = 30 * time.Second
	}
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Second
	}
	if o.MaxRules < 0 {
		return fmt.Errorf("crowdsec: MaxRules %d: want a positive number (0: 500)", o.MaxRules)
	}
	if o.MaxRules == 0 {
		o.MaxRules = 500
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return nil
}

// Bouncer makes sluice a CrowdSec bouncer (remediation component): it
// follows a Local API's decision stream (GET /v1/decisions/stream, every
// active decision at its start and every FullPull, the changes every
// Interval in between) and keeps
// every region's Redis holding one dynamic rule per source and decision
// type, which the region's enforcers load within a second:
//
//	ban on Ip or Range       client_ip in the network (an address: its /32,
//	                         or its IPv6Prefix network), limit 0: denied
//	ban on AS                asn = the AS number, limit 0
//	any other type           the same match, with Mapping.Limits[type]
//	                         (default Mapping.Default, 60 per minute)
//	Country, Username, ...   no rule: counted and logged (RefusedScope)
//
// Each rule expires with its last decision (renewed every
// rules.MaxDynamicTTL at most), and is deleted when its decisions are. The
// dynamic-rule controls apply: Mapping.Shadow writes rules in shadow mode
// (promote and roll back with sluice rules promote / rollback), MaxRules
// and the region's cap bound them, and while a region's kill switch is on
// no new rule is written there (enforcers load none anyway) and the held
// ones are written once it is off.
//
// The regions are brought to the decisions independently, by a goroutine
// each: level-triggered, from what their Redis holds (a rule id is a hash
// of source and type, so nothing is ever written twice), on every change
// of the stream and every Resync. A region whose Redis fails holds back
// only itself, retried with backoff.
//
// While the Local API is unreachable, the rules already written stay and
// are enforced until they expire; nothing new arrives; failures are counted
// (sluice_crowdsec_stream_errors_total) and
// sluice_crowdsec_stream_age_seconds grows. The next successful pull asks
// for every active decision again (an answer lost in a failure may have
// carried changes the Local API will not send twice), which brings every
// region up to date, deletions included.
//
// Build one with NewBouncer, call Run; Close stops it. Safe for concurrent
// use.
type Bouncer struct {
	o       Options
	m       *metrics
	st      *state
	want    atomic.Pointer[desired]
	regions []*region

	lastPull atomic.Int64 // Unix ns of the last successful pull; 0: none yet
	started  time.Time

	stop   context.Context
	cancel context.CancelFunc
}

// NewBouncer checks o and registers the metrics.
func NewBouncer(o Options) (*Bouncer, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	b := &Bouncer{o: o, st: newState(o.Mapping), started: o.Now()}
	names := make([]string, len(o.Regions))
	for i, r := range o.Regions {
		names[i] = r.Name
	}
	m, err := newMetrics(o.Registerer, names, b.streamAge)
	if err != nil {
		return nil, err
	}
	b.m = m
	for _, r := range o.Regions {
		b.regions = append(b.regions, &region{b: b, name: r.Name, st: r.Store, notify: make(chan struct{}, 1), refused: map[string]string{}})
	}
	b.stop, b.cancel = context.WithCancel(context.Background())
	return b, nil
}

// streamAge is the seconds since the last successful pull, or since the
// bouncer was made when none has succeeded: how stale its decisions may be.
func (b *Bouncer) streamAge() float64 {
	last := b.started
	if t := b.lastPull.Load(); t != 0 {
		last = time.Unix(0, t)
	}
	return b.o.Now().Sub(last).Seconds()
}

// Run follows the stream and keeps the regions until ctx ends or Close is
// called; it returns nil then. Until the first successful pull it writes
// nothing: rules already in Redis stay as they are. It returns an error
// wrapping ErrUnauthorized when the first answer of the Local API refuses
// the API key (a wrong key fails at start); a key refused later, once
// pulls have succeeded, is retried and logged like any failure.
func (b *Bouncer) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(b.stop, cancel)()
	var wg sync.WaitGroup
	for _, r := range b.regions {
		wg.Go(func() { r.run(ctx) })
	}
	err := b.follow(ctx)
	cancel()
	wg.Wait()
	return err
}

// Close stops Run. Safe to call twice.
func (b *Bouncer) Close() { b.cancel() }

// follow pulls the stream until ctx ends, or returns the first answer's
// ErrUnauthorized.
func (b *Bouncer) follow(ctx context.Context) error {
	bo := &backoff.ExponentialBackOff{InitialInterval: 500 * time.Millisecond, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: b.o.RetryMax}
	bo.Reset()
	startup := true
	var failingSince, loggedAt, fullAt time.Time
	var failures int
	for {
		if !startup && b.o.Now().Sub(fullAt) >= b.o.FullPull {
			startup = true
		}
		s, err := b.o.Source.Stream(ctx, StreamQuery{Startup: startup, Scopes: b.o.Scopes})
		if ctx.Err() != nil {
			return nil
		}
		wait := b.o.Interval
		now := b.o.Now()
		if errors.Is(err, ErrUnauthorized) && b.lastPull.Load() == 0 {
			b.m.streamErrors.Inc()
			return fmt.Errorf("%w: check the bouncer's API key (cscli bouncers list)", err)
		}
		if err != nil {
			b.m.streamErrors.Inc()
			failures++
			if failingSince.IsZero() {
				failingSince = now
			}
			// The first failure, then one line a minute.
			if loggedAt.Before(failingSince) || now.Sub(loggedAt) >= time.Minute {
				loggedAt = now
				b.o.Logger.Warn("pulling CrowdSec's decision stream failed: rules already written stay until they expire, nothing new arrives; retrying",
					"failures", failures, "since", failingSince.UTC().Format(time.RFC3339), "err", err)
			}
			// The answer may have been lost after the Local API moved
			// this bouncer's last pull: ask for everything next time.
			startup = true
			wait = bo.NextBackOff()
		} else {
			if !failingSince.IsZero() {
				b.o.Logger.Info("the CrowdSec Local API answers again", "after", now.Sub(failingSince).Round(time.Millisecond), "failures", failures)
				failingSince, failures = time.Time{}, 0
			}
			bo.Reset()
			b.lastPull.Store(now.UnixNano())
			b.take(s, startup, now)
			if startup {
				fullAt = now
			}
			startup = false
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// maxLogged bounds the refused decisions logged one by one per answer.
const maxLogged = 10

// take applies one answer of the stream and tells the regions.
func (b *Bouncer) take(s *Stream, startup bool, now time.Time) {
	b.m.received[kindNew].Add(float64(len(s.New)))
	b.m.received[kindDeleted].Add(float64(len(s.Deleted)))
	refused, changed := b.st.apply(s, startup, now)
	for i, r := range refused {
		b.m.refused[r.why.reason].Inc()
		if i < maxLogged {
			b.o.Logger.Warn("a CrowdSec decision sluice cannot enforce: counted, no rule", "decision", r.d.ID,
				"type", clean(r.d.Type, 40), "scope", clean(r.d.Scope, 40), "value", clean(r.d.Value, 100),
				"origin", clean(r.d.Origin, 40), "reason", r.why.reason, "why", r.why.detail)
		}
	}
	if len(refused) > maxLogged {
		b.o.Logger.Warn("more CrowdSec decisions sluice cannot enforce in this answer", "not_logged", len(refused)-maxLogged)
	}
	if !changed && b.want.Load() != nil {
		return
	}
	d, bad := b.st.desired(now)
	for _, err := range bad {
		b.m.invalid.Inc()
		b.o.Logger.Error("a CrowdSec decision made an invalid rule: left out", "err", err)
	}
	b.m.active.Set(float64(d.decisions))
	b.want.Store(d)
	for _, r := range b.regions {
		select {
		case r.notify <- struct{}{}:
		default: // a sync is already due
		}
	}
}

// region keeps one region's Redis at the bouncer's desired rules.
type region struct {
	b      *Bouncer
	name   string
	st     RegionStore
	notify chan struct{}
	// refused holds the rules not written, with the reason, so that each is
	// counted once until it is written or its decisions go.
	refused map[string]string
}

// run syncs the region on every notification and every Resync, and
// retries a failed sync with backoff, until ctx ends.
func (r *region) run(ctx context.Context) {
	o := &r.b.o
	bo := &backoff.ExponentialBackOff{InitialInterval: 100 * time.Millisecond, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: o.RetryMax}
	bo.Reset()
	t := time.NewTimer(o.Resync)
	defer t.Stop()
	var failingSince, loggedAt time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.notify:
		case <-t.C:
		}
		d := r.b.want.Load()
		if d == nil {
			t.Reset(o.Resync)
			continue // no answer from the Local API yet: touch nothing
		}
		err := r.sync(ctx, d)
		if ctx.Err() != nil {
			return
		}
		next := o.Resync
		if err != nil {
			r.b.m.regionErrors[r.name].Inc()
			now := time.Now()
			if failingSince.IsZero() {
				failingSince = now
			}
			if loggedAt.Before(failingSince) || now.Sub(loggedAt) >= time.Minute {
				loggedAt = now
				o.Logger.Warn("writing CrowdSec's rules to the region's Redis failed; retrying", "region", r.name, "err", err)
			}
			next = bo.NextBackOff()
		} else {
			if !failingSince.IsZero() {
				o.Logger.Info("CrowdSec's rules are written to the region's Redis again", "region", r.name, "after", time.Since(failingSince).Round(time.Millisecond))
				failingSince = time.Time{}
			}
			bo.Reset()
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(next)
	}
}

// Refusal reasons of rules in a region (label reason of
// sluice_crowdsec_rules_refused_total).
const (
	refusedCap       = "cap"        // the bouncer's MaxRules
	refusedRegionCap = "region_cap" // the region's cap on all dynamic rules
	refusedKilled    = "killed"     // the region's kill switch is on
)

// expiryTolerance is how far a stored rule's expiry may be from its
// decisions' without a rewrite: their expiries are reckoned from when the
// answer arrived.
const expiryTolerance = time.Second

// renewBefore: a rule clamped at rules.MaxDynamicTTL is renewed once it has
// less than MaxDynamicTTL - renewBefore left.
const renewBefore = time.Hour

// sync brings the region's Redis to d: it deletes the bouncer's rules
// whose decisions are gone, writes new and changed ones (and renews those
// that outlive rules.MaxDynamicTTL), within MaxRules and the region's cap
// and not while the kill switch is on.
func (r *region) sync(ctx context.Context, d *desired) error {
	o := &r.b.o
	m := r.b.m
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	now := o.Now()
	stored, err := r.st.Dynamic(ctx)
	if err != nil {
		return err
	}
	mine := map[string]*rules.DynamicRule{}
	active := 0
	for _, s := range stored {
		if s.Expired(now) {
			continue
		}
		active++
		if strings.HasPrefix(s.Origin, Origin) {
			mine[s.ID] = s
		}
	}
	var del []string
	for id := range mine {
		if i, ok := d.byID[id]; !ok || !d.rules[i].rule.ExpiresAt.After(now) {
			del = append(del, id)
		}
	}
	if len(del) > 0 {
		n, err := r.st.DeleteDynamic(ctx, Origin, del...)
		if err != nil {
			return err
		}
		m.deleted[r.name].Add(float64(n))
		for _, id := range del {
			delete(mine, id)
		}
		active -= len(del)
		o.Logger.Info("CrowdSec's decisions are gone: rules deleted", "region", r.name, "rules", n)
	}
	killed, why, err := r.st.Killed(ctx)
	if err != nil {
		return err
	}
	room := r.st.Cap() - active
	quota := o.MaxRules - len(mine)
	clampAt := now.Add(rules.MaxDynamicTTL)
	var puts []rules.Rule
	var fresh []*desiredRule
	held := map[string]int{}
	for i := range d.rules {
		w := &d.rules[i]
		if !w.rule.ExpiresAt.After(now) {
			continue
		}
		rule := w.rule
		rule.ExpiresAt = minTime(rule.ExpiresAt, clampAt)
		if have, ok := mine[rule.ID]; ok {
			if !current(have, &w.rule, clampAt) {
				puts = append(puts, rule)
			}
			delete(r.refused, rule.ID)
			continue
		}
		var reason string
		switch {
		case killed:
			reason = refusedKilled
		case quota <= 0:
			reason = refusedCap
		case room <= 0:
			reason = refusedRegionCap
		}
		if reason != "" {
			if r.refused[rule.ID] != reason {
				r.refused[rule.ID] = reason
				m.rulesRefused[r.name][reason].Inc()
				held[reason]++
			}
			continue
		}
		quota--
		room--
		puts = append(puts, rule)
		fresh = append(fresh, w)
	}
	for id := range r.refused {
		if _, ok := d.byID[id]; !ok {
			delete(r.refused, id)
		}
	}
	for reason, n := range held {
		switch reason {
		case refusedKilled:
			o.Logger.Warn("the region's dynamic-rule kill switch is on: CrowdSec's new rules wait until it is off", "region", r.name, "rules", n, "why", why)
		case refusedCap:
			o.Logger.Warn("the bouncer's cap on CrowdSec rules is reached: decisions wait", "region", r.name, "rules", n, "max_rules", o.MaxRules)
		default:
			o.Logger.Warn("the region's cap on dynamic rules is reached: CrowdSec's decisions wait", "region", r.name, "rules", n, "cap", r.st.Cap())
		}
	}
	if len(puts) > 0 {
		if _, err := r.st.PutDynamic(ctx, now, puts); err != nil {
			// A cap reached here is a race with another writer: the next
			// sync, which reads the region again, counts what waits.
			return err
		}
	}
	for _, w := range fresh {
		delete(r.refused, w.rule.ID)
		m.applied[r.name].Inc()
		m.lag[r.name].Observe(max(0, now.Sub(w.received).Seconds()))
	}
	if n := len(puts) - len(fresh); n > 0 {
		m.updated[r.name].Add(float64(n))
	}
	m.rules[r.name].Set(float64(len(mine) + len(fresh)))
	return nil
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// current reports whether the stored rule have is want as the bouncer
// wrote it: the same content (for a promoted rule, its pre-promotion
// version: the mode is the operator's), and an expiry within
// expiryTolerance of want's, or, for a rule that outlives clampAt (now +
// rules.MaxDynamicTTL), one renewed within renewBefore.
func current(have *rules.DynamicRule, want *rules.Rule, clampAt time.Time) bool {
	content := have.Rule
	if have.Promoted() {
		content = *have.Previous
	}
	if want.ExpiresAt.After(clampAt) {
		if have.ExpiresAt.Before(clampAt.Add(-renewBefore)) {
			return false
		}
	} else if d := have.ExpiresAt.Sub(want.ExpiresAt); d > expiryTolerance || d < -expiryTolerance {
		return false
	}
	a, b := content, *want
	a.ExpiresAt, b.ExpiresAt = time.Time{}, time.Time{}
	return sameRule(&a, &b)
}

// sameRule compares two rules as the store keeps them (their JSON).
func sameRule(a, b *rules.Rule) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(ja, jb)
}
