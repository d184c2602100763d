package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/sluice-rl/sluice/rules"
)

// ReloadResult is what a Watcher did with one candidate rule set.
type ReloadResult uint8

const (
	// Applied: valid and newer than the set in force: handed to Apply.
	Applied ReloadResult = iota
	// Invalid: it does not parse or validate (or its declared version
	// contradicts its stored one); the set in force stays.
	Invalid
	// Stale: its version is below the one in force; ignored.
	Stale
	// Duplicate: its version is the one in force; ignored.
	Duplicate
	// Failed: the source could not be read (a missing file, Redis down); the
	// set in force stays.
	Failed
	// Conflict: its version is the one in force but its content (SHA-256)
	// differs: refused, since enforcers that read it at different times
	// would hold different sets under one version. The fix is a new version.
	// A file whose content in force is a strict prefix of the new content
	// is not a conflict: the one in force was read half-written, and the
	// complete file is applied under the same version.
	Conflict
	// unchanged: the source holds what was seen last; not counted.
	unchanged
)

var reloadResultNames = [...]string{"applied", "invalid", "stale", "duplicate", "error", "conflict"}

func (r ReloadResult) String() string {
	if int(r) < len(reloadResultNames) {
		return reloadResultNames[r]
	}
	return "unchanged"
}

// Reload reports one candidate rule set a Watcher considered.
type Reload struct {
	Source  string // "file" or "redis"
	Result  ReloadResult
	Version int64 // the candidate's version (for a file without version:, the one it would get)
	// Set is the set applied (Applied only).
	Set *rules.Set
	// Err says why the candidate was refused or the source failed.
	Err error
}

// WatchOptions configure a Watcher. Exactly one of File and Redis is set.
type WatchOptions struct {
	// File is a rule file to follow: its directory is watched (fsnotify), so
	// that an editor's rename-on-save and a Kubernetes ConfigMap's symlink
	// swap are seen, and the file is re-statted every Poll in case an event
	// is missed. A file with a top-level version: has that version; one
	// without gets the version in force + 1 at each change of its content.
	File string
	// Redis is the region's Redis holding the rule-set store (SetStore): the
	// watcher subscribes to RuleSetChannel and also polls the stored version
	// every Poll, in case a message is lost or the subscription drops. The
	// stored version is authoritative.
	Redis redis.UniversalClient
	// NoSubscribe turns the subscription off, leaving the poll (to measure
	// it, or where PUBLISH is not delivered).
	NoSubscribe bool
	// Instance names this enforcer among those following the same Redis
	// (e.g. its pod name; unique in the region). With Redis, each poll
	// records the version and SHA it holds under this name in
	// RuleSetEnforcersKey, which pushes read (versions keep growing after
	// Redis lost its data) and `sluice rules list` shows. Default "":
	// nothing recorded.
	Instance string
	// Apply receives each new valid set, with Version set, from the
	// goroutine that runs Load or Run (one at a time). Required. For an
	// enforcer: Limiter.SetRules, which swaps the whole set at once.
	Apply func(*rules.Set)
	// Version is the version in force when the watcher starts: only higher
	// versions are applied. Default 0 (any).
	Version int64
	// Poll is how often the source is re-checked besides events: a read of
	// the stored version (two short fields; with Instance, in a script that
	// also records what this enforcer holds) or the file's stat. Default
	// 1 s, so a lost message still reaches every enforcer within about a
	// second.
	Poll time.Duration
	// Debounce is how long file events must be quiet before the file is
	// read, so that a write in several steps is read whole. Default 50 ms.
	Debounce time.Duration
	// Settle is how long a file's content must stay the same before Run
	// considers it: after the events are quiet (or a poll sees a new stat)
	// the file is read, read again Settle later, and only a content that
	// both reads agree on is a candidate; any event in between starts over.
	// A writer that truncates the file and pauses mid-write (an editor
	// writing in place, kubectl cp) is thus not applied half-written unless
	// it pauses longer than Debounce + Settle; if it does, the complete file
	// is applied after it even under the same version (see Conflict).
	// Default 250 ms. Load reads once, without settling.
	Settle time.Duration
	// OnReload, when set, is called after every counted candidate, from the
	// same goroutine as Apply.
	OnReload func(Reload)
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Registerer for the metrics below; nil registers none.
	//
	//	sluice_rules_reloads_total{source,result}  counter: candidates by result (applied, invalid, stale, duplicate, conflict, error)
	//	sluice_rules_version                       gauge: the version in force
	Registerer prometheus.Registerer
}

// Watcher follows a rule set's source, a file or the region's Redis, and
// hands each new valid version to Apply: invalid, older and repeated
// versions are counted and logged, and the set in force stays. Build one
// with NewWatcher; call Load once for the first set, then Run in a
// goroutine the caller owns. Load and Run are safe to call concurrently.
type Watcher struct {
	o     WatchOptions
	src   string
	store *SetStore

	mu sync.Mutex // the fields below, and calls to Apply
	reloader
	lastStored fileKey // Redis: the (version, sha) last read; file: its stat
	failing    bool

	reloads *prometheus.CounterVec
	version prometheus.Gauge

	ready     chan struct{} // closed once Run follows its source's events (for tests)
	readyOnce sync.Once
}

// fileKey identifies what a source held when last read.
type fileKey struct {
	version int64
	sha     string
	mod     time.Time
	size    int64
}

// NewWatcher returns a Watcher; it does nothing until Load or Run.
func NewWatcher(o WatchOptions) (*Watcher, error) {
	if (o.File == "") == (o.Redis == nil) {
		return nil, errors.New("rules: a watcher needs exactly one of File and Redis")
	}
	if o.Apply == nil {
		return nil, errors.New("rules: a watcher needs Apply")
	}
	if o.Poll < 0 || o.Debounce < 0 || o.Settle < 0 || o.Version < 0 {
		return nil, fmt.Errorf("rules: watcher Poll %v, Debounce %v, Settle %v and Version %d must not be negative", o.Poll, o.Debounce, o.Settle, o.Version)
	}
	if o.Poll == 0 {
		o.Poll = time.Second
	}
	if o.Debounce == 0 {
		o.Debounce = 50 * time.Millisecond
	}
	if o.Settle == 0 {
		o.Settle = 250 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	w := &Watcher{o: o, src: "file", ready: make(chan struct{})}
	w.current = o.Version
	if o.Redis != nil {
		w.src = "redis"
		w.store = NewSetStore(o.Redis)
	}
	w.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_rules_reloads_total",
		Help: "Rule-set candidates the watcher considered, by source (file, redis) and result: applied, invalid (kept the set in force), stale (older version), duplicate (same version and content), conflict (same version, other content: refused), error (source unreadable).",
	}, []string{"source", "result"})
	w.version = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_rules_version",
		Help: "Version of the static rule set in force.",
	})
	w.version.Set(float64(o.Version))
	for r := Applied; r <= Conflict; r++ {
		w.reloads.WithLabelValues(w.src, r.String())
	}
	if o.Registerer != nil {
		for _, c := range []prometheus.Collector{w.reloads, w.version} {
			if err := o.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("rules: registering watcher metrics: %w", err)
			}
		}
	}
	return w, nil
}

// Version returns the version in force (the last applied, or
// WatchOptions.Version).
func (w *Watcher) Version() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.current
}

// Load reads the source once and applies its set if it is new and valid. It
// returns what happened; a source that holds what was last read returns
// Duplicate without counting it, and Redis without a stored set returns
// Failed with ErrNoRuleSet, not counted either.
func (w *Watcher) Load(ctx context.Context) Reload {
	r := w.check(ctx, true)
	if r.Result == unchanged {
		r.Result = Duplicate
		if r.Err != nil {
			r.Result = Failed
		}
	}
	return r
}

// Run follows the source until ctx ends, then returns nil. Each change is
// handled as Load does.
func (w *Watcher) Run(ctx context.Context) error {
	if w.store != nil {
		w.runRedis(ctx)
	} else {
		w.runFile(ctx)
	}
	return nil
}

func (w *Watcher) setReady() { w.readyOnce.Do(func() { close(w.ready) }) }

func (w *Watcher) runRedis(ctx context.Context) {
	var msgs <-chan any
	if w.o.NoSubscribe {
		w.setReady()
	} else {
		ps := w.o.Redis.Subscribe(ctx, RuleSetChannel)
		defer ps.Close()
		// Subscription confirmations come through too: one after each
		// reconnect, when what was published meanwhile must be read.
		msgs = ps.ChannelWithSubscriptions()
	}
	t := time.NewTicker(w.o.Poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-msgs:
			if !ok {
				msgs = nil // closed: the poll goes on
				continue
			}
			if s, ok := m.(*redis.Subscription); ok {
				if s.Kind != "subscribe" {
					continue
				}
				w.setReady()
			}
			w.check(ctx, false)
		case <-t.C:
			w.check(ctx, false)
		}
	}
}

func (w *Watcher) runFile(ctx context.Context) {
	path := filepath.Clean(w.o.File)
	dir, base := filepath.Dir(path), filepath.Base(path)
	var events <-chan fsnotify.Event
	var errs <-chan error
	fw, err := fsnotify.NewWatcher()
	if err == nil {
		if err = fw.Add(dir); err != nil {
			fw.Close()
		}
	}
	if err != nil {
		w.o.Logger.Warn("cannot watch the rule file's folder: changes are seen by re-reading it every poll only",
			"dir", dir, "poll", w.o.Poll.String(), "err", err)
	} else {
		defer fw.Close()
		events, errs = fw.Events, fw.Errors
	}
	w.setReady()
	t := time.NewTicker(w.o.Poll)
	defer t.Stop()
	quiet := time.NewTimer(w.o.Debounce)
	quiet.Stop()
	defer quiet.Stop()
	// settle runs while a content read waits for its second read.
	settle := time.NewTimer(w.o.Settle)
	settle.Stop()
	defer settle.Stop()
	var pending *fileSample
	sample := func(force bool) {
		p, r := w.sampleFile(force)
		if p == nil {
			w.report(ctx, r) // unreadable (counted) or unchanged (not)
			return
		}
		pending = p
		settle.Reset(w.o.Settle)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-events:
			// The file itself, or a Kubernetes ConfigMap's ..data swap.
			if n := filepath.Base(ev.Name); n == base || strings.HasPrefix(n, "..") {
				quiet.Reset(w.o.Debounce)
				settle.Stop()
				pending = nil
			}
		case err := <-errs:
			w.o.Logger.Warn("rule file events", "dir", dir, "err", err)
		case <-quiet.C:
			sample(true)
		case <-t.C:
			if pending == nil {
				sample(false)
			}
		case <-settle.C:
			first := pending
			pending = nil
			p, r := w.sampleFile(true)
			switch {
			case p == nil:
				w.report(ctx, r)
			case bytes.Equal(p.data, first.data):
				w.considerSample(ctx, p)
			default: // still being written
				pending = p
				settle.Reset(w.o.Settle)
			}
		}
	}
}

// fileSample is a rule file's content and its stat when read.
type fileSample struct {
	key  fileKey
	data []byte
}

// sampleFile reads the file when its stat differs from the last candidate's
// (or when force). It returns nil and a Reload (Failed, or unchanged) when
// there is nothing to consider.
func (w *Watcher) sampleFile(force bool) (*fileSample, Reload) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.readFile(force)
}

// readFile is sampleFile with w.mu held.
func (w *Watcher) readFile(force bool) (*fileSample, Reload) {
	st, err := os.Stat(w.o.File)
	if err != nil {
		w.lastStored = fileKey{}
		return nil, Reload{Result: Failed, Err: err}
	}
	k := fileKey{mod: st.ModTime(), size: st.Size()}
	if !force && k == w.lastStored {
		return nil, Reload{Result: unchanged}
	}
	data, err := os.ReadFile(w.o.File)
	if err != nil {
		return nil, Reload{Result: Failed, Err: err}
	}
	return &fileSample{key: k, data: data}, Reload{}
}

// considerSample decides on a settled file content.
func (w *Watcher) considerSample(ctx context.Context, p *fileSample) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lastStored = p.key
	w.reportLocked(ctx, w.considerFile(w.o.File, p.data, w.apply))
}

// report counts, logs and hands on r as check does.
func (w *Watcher) report(ctx context.Context, r Reload) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.reportLocked(ctx, r)
}

// check reads the source; force reads a file even if its stat is unchanged.
func (w *Watcher) check(ctx context.Context, force bool) Reload {
	w.mu.Lock()
	defer w.mu.Unlock()
	var r Reload
	if w.store != nil {
		r = w.checkRedis(ctx)
	} else {
		r = w.checkFile(force)
	}
	return w.reportLocked(ctx, r)
}

// reportLocked counts a candidate's result, logs it and calls OnReload;
// called with w.mu held.
func (w *Watcher) reportLocked(ctx context.Context, r Reload) Reload {
	r.Source = w.src
	if r.Result == Failed && ctx.Err() != nil {
		return Reload{Source: w.src, Result: unchanged, Err: ctx.Err()} // shutting down: not the source's fault
	}
	if r.Result == Failed {
		switch {
		case w.failing:
		case w.applied == nil:
			w.o.Logger.Warn("cannot read the rule set; none is in force yet", "source", w.src, "err", r.Err)
		default:
			w.o.Logger.Warn("cannot read the rule set; keeping the one in force", "source", w.src, "version", w.current, "err", r.Err)
		}
		w.failing = true
	} else if w.failing {
		w.o.Logger.Info("reading the rule set works again", "source", w.src)
		w.failing = false
	}
	if r.Result == unchanged {
		return r
	}
	w.reloads.WithLabelValues(w.src, r.Result.String()).Inc()
	w.logRefusal(r)
	if w.o.OnReload != nil {
		w.o.OnReload(r)
	}
	return r
}

func (w *Watcher) checkRedis(ctx context.Context) Reload {
	ctx, cancel := context.WithTimeout(ctx, max(w.o.Poll, time.Second))
	defer cancel()
	var v int64
	var sha string
	var err error
	if w.o.Instance != "" {
		v, sha, err = w.store.poll(ctx, w.o.Instance, w.current, w.appliedSHA)
	} else {
		v, sha, err = w.store.currentVersion(ctx)
	}
	if err != nil {
		return Reload{Result: Failed, Err: err}
	}
	if v == 0 {
		return Reload{Result: unchanged, Err: ErrNoRuleSet} // not pushed yet: nothing to count
	}
	k := fileKey{version: v, sha: sha}
	if k == w.lastStored {
		return Reload{Result: unchanged, Version: v}
	}
	e, err := w.store.Current(ctx)
	if err != nil {
		return Reload{Result: Failed, Err: err}
	}
	w.lastStored = k
	r := w.considerEntry(&e, w.apply)
	if r.Result == Applied && w.o.Instance != "" {
		// Record the new version now rather than at the next poll. A
		// failure is the next poll's to report.
		_, _, _ = w.store.poll(ctx, w.o.Instance, w.current, w.appliedSHA)
	}
	return r
}

// checkFile reads the file once, without settling (Load, and tests);
// called with w.mu held.
func (w *Watcher) checkFile(force bool) Reload {
	p, r := w.readFile(force)
	if p == nil {
		return r
	}
	w.lastStored = p.key
	return w.considerFile(w.o.File, p.data, w.apply)
}

// apply hands s to Apply and logs it; called with w.mu held.
func (w *Watcher) apply(s *rules.Set, prev *rules.Set, from int64) {
	w.o.Apply(s)
	w.version.Set(float64(s.Version))
	args := []any{"source", w.src, "version", s.Version, "previous", w.prevVersion, "domain", s.Domain, "rules", len(s.Rules)}
	if prev != nil {
		d := rules.Diff(prev, s)
		args = append(args, "changes", d.Summary())
	}
	if from != 0 {
		args = append(args, "rollback_to", from)
	}
	if prev != nil && prev.Domain != s.Domain {
		// Requests for the old domain now match no rule: every limit off
		// for a gateway that still sends it.
		w.o.Logger.Warn("rule set applied with another domain: checks for the previous domain now match no rule and are allowed", append(args, "previous_domain", prev.Domain)...)
		return
	}
	w.o.Logger.Info("rule set applied", args...)
}

// reloader is the watcher's I/O-free core: given candidate sets, in order,
// it decides which to apply. It is not safe for concurrent use.
type reloader struct {
	current     int64
	prevVersion int64 // the version before current, for the log
	appliedSHA  string
	applied     *rules.Set
	// appliedData is the content in force when it came from a file (nil
	// from the store), for completes.
	appliedData []byte
	last        fileKey // the last candidate considered: version and SHA
	// conflicts are the SHAs of the contents refused as conflicts with the
	// version in force: each is counted and logged once. Cleared at each
	// new version.
	conflicts map[string]bool
}

// maxConflicts bounds reloader.conflicts: past it, the map starts over (a
// content seen again is then reported again).
const maxConflicts = 64

// sameVersion decides on a candidate whose version is the one in force:
// Duplicate for the content in force (or when it is unknown: a version given
// by WatchOptions.Version), else Conflict, once per distinct content.
func (r *reloader) sameVersion(res *Reload, sha string) {
	if r.appliedSHA == "" || sha == r.appliedSHA {
		res.Result, res.Err = Duplicate, fmt.Errorf("version %d is already in force", res.Version)
		return
	}
	if r.conflicts[sha] {
		res.Result = unchanged
		return
	}
	if r.conflicts == nil || len(r.conflicts) >= maxConflicts {
		r.conflicts = map[string]bool{}
	}
	r.conflicts[sha] = true
	res.Result = Conflict
	res.Err = fmt.Errorf("version %d is in force with content sha256 %s; this set has the same version and content sha256 %s: bump the version to replace the set in force",
		res.Version, shortSHA(r.appliedSHA), shortSHA(sha))
}

// shortSHA is the first 12 hex digits of a SHA-256, as logs and the CLI show it.
func shortSHA(sha string) string {
	if len(sha) > 12 {
		return sha[:12]
	}
	return sha
}

// considerEntry decides on a set read from the store, whose version is
// authoritative.
func (r *reloader) considerEntry(e *Entry, apply func(s, prev *rules.Set, from int64)) Reload {
	sha := SHA(e.YAML)
	res := Reload{Version: e.Version}
	k := fileKey{version: e.Version, sha: sha}
	if k == r.last {
		res.Result = unchanged
		return res
	}
	r.last = k
	switch {
	case e.Version < r.current:
		res.Result, res.Err = Stale, fmt.Errorf("version %d is older than version %d in force", e.Version, r.current)
		return res
	case e.Version == r.current:
		r.sameVersion(&res, sha)
		return res
	}
	s, err := e.Set()
	if err != nil {
		res.Result, res.Err = Invalid, err
		return res
	}
	r.commit(s, sha, e.From, apply)
	res.Set = s
	return res
}

// considerFile decides on a file's content: its declared version, or the
// version in force + 1 when its content changed.
func (r *reloader) considerFile(name string, data []byte, apply func(s, prev *rules.Set, from int64)) Reload {
	sha := SHA(data)
	declared, derr := DeclaredVersion(data)
	k := fileKey{version: declared, sha: sha}
	var res Reload
	if k == r.last {
		res.Result = unchanged
		return res
	}
	r.last = k
	s, err := rules.Parse(name, data)
	if err == nil && derr != nil {
		err = fmt.Errorf("%s: %w", name, derr)
	}
	if err != nil {
		res.Result, res.Err = Invalid, err
		return res
	}
	v := declared
	if v == 0 {
		if sha == r.appliedSHA {
			res.Result, res.Version, res.Err = Duplicate, r.current, errors.New("the content in force")
			return res
		}
		v = r.current + 1
	}
	res.Version = v
	switch {
	case v < r.current:
		res.Result, res.Err = Stale, fmt.Errorf("version %d is older than version %d in force", v, r.current)
		return res
	case v == r.current && !r.completes(data):
		r.sameVersion(&res, sha)
		return res
	}
	s.Version = v
	r.commit(s, sha, 0, apply)
	r.appliedData = data
	res.Set = s
	return res
}

// completes reports whether data is the file in force written further: the
// content in force, read from a file, is a strict prefix of data. The file
// was then read half-written (truncated and written in place with a pause
// longer than the watcher's settling) and data is the rest of that write,
// not an edit under the same version.
func (r *reloader) completes(data []byte) bool {
	return r.appliedData != nil && len(data) > len(r.appliedData) && bytes.HasPrefix(data, r.appliedData)
}

func (r *reloader) commit(s *rules.Set, sha string, from int64, apply func(s, prev *rules.Set, from int64)) {
	prev := r.applied
	r.prevVersion, r.current, r.appliedSHA, r.applied, r.appliedData = r.current, s.Version, sha, s, nil
	r.conflicts = nil
	apply(s, prev, from)
}

// logRefusal logs a refused candidate: once, since a candidate is
// considered once.
func (w *Watcher) logRefusal(r Reload) {
	switch r.Result {
	case Invalid:
		if w.applied == nil {
			w.o.Logger.Warn("rule set refused: invalid; none is in force yet", "source", r.Source,
				"candidate", r.Version, "err", r.Err)
			break
		}
		w.o.Logger.Warn("rule set refused: invalid; keeping the one in force", "source", r.Source,
			"candidate", r.Version, "version", w.current, "err", r.Err)
	case Stale:
		w.o.Logger.Warn("rule set refused: older than the one in force", "source", r.Source,
			"candidate", r.Version, "version", w.current)
	case Duplicate:
		w.o.Logger.Debug("rule set ignored: version already in force", "source", r.Source, "version", r.Version)
	case Conflict:
		w.o.Logger.Warn("rule set refused: same version as the one in force, other content; keeping the one in force: bump the version to replace it",
			"source", r.Source, "version", r.Version, "err", r.Err)
	}
}
