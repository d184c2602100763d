package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/syncbuf"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// TestReloaderStore: the I/O-free core on sets from the store, whose
// versions are authoritative.
func TestReloaderStore(t *testing.T) {
	var r reloader
	var applied []int64
	apply := func(s, _ *rules.Set, _ int64) { applied = append(applied, s.Version) }
	bad := []byte("domain: d\nrules: [oops\n")
	for i, c := range []struct {
		e    Entry
		want ReloadResult
	}{
		{Entry{Version: 2, YAML: ruleFile(1)}, Applied},
		{Entry{Version: 2, YAML: ruleFile(1)}, unchanged}, // read again: not a new candidate
		{Entry{Version: 3, YAML: bad}, Invalid},
		{Entry{Version: 3, YAML: bad}, unchanged}, // counted and logged once
		{Entry{Version: 1, YAML: ruleFile(5)}, Stale},
		{Entry{Version: 2, YAML: ruleFile(6)}, Conflict},  // same version, other content
		{Entry{Version: 2, YAML: ruleFile(1)}, Duplicate}, // same version, same content
		{Entry{Version: 2, YAML: ruleFile(6)}, unchanged}, // a conflict is counted once per content
		{Entry{Version: 2, YAML: ruleFile(8)}, Conflict},
		{Entry{Version: 4, YAML: ruleFile(7)}, Applied},
	} {
		if got := r.considerEntry(&c.e, apply); got.Result != c.want {
			t.Errorf("step %d (version %d): %v %v, want %v", i, c.e.Version, got.Result, got.Err, c.want)
		}
	}
	if len(applied) != 2 || applied[0] != 2 || applied[1] != 4 || r.current != 4 || r.applied.Rules[0].Limit != 7 {
		t.Errorf("applied %v, current %d", applied, r.current)
	}
}

// TestReloaderFile: a file's declared version, or the version in force + 1
// for new content.
func TestReloaderFile(t *testing.T) {
	var r reloader
	var applied []int64
	apply := func(s, _ *rules.Set, _ int64) { applied = append(applied, s.Version) }
	for i, c := range []struct {
		data    []byte
		want    ReloadResult
		version int64
	}{
		{ruleFile(1), Applied, 1},
		{ruleFile(2), Applied, 2},
		{[]byte("domain: d\n"), Invalid, 0},
		{ruleFile(2), Duplicate, 2}, // back to the content in force
		{ruleFile(3), Applied, 3},
		{versioned(60, 3), Applied, 60},
		{versioned(60, 300), Conflict, 60}, // edited, keeping version 60
		{versioned(60, 3), Duplicate, 60},  // back to the content in force
		{versioned(61, 300), Applied, 61},
	} {
		got := r.considerFile("f.yaml", c.data, apply)
		if got.Result != c.want || got.Version != c.version {
			t.Errorf("step %d: %v (version %d) %v, want %v (version %d)", i, got.Result, got.Version, got.Err, c.want, c.version)
		}
	}
	if len(applied) != 5 || r.current != 61 {
		t.Errorf("applied %v", applied)
	}
}

// versioned is ruleFile(limit) with a top-level version.
func versioned(version, limit int) []byte {
	return append(fmt.Appendf(nil, "version: %d\n", version), ruleFile(limit)...)
}

// TestWatchConflict: a set stored under the version in force but with other
// content (a raw HSET) is refused, counted as a conflict and logged at WARN
// once per distinct content, with the fix; the set in force stays.
func TestWatchConflict(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	log := new(syncbuf.Buffer)
	reg := prometheus.NewRegistry()
	w, err := NewWatcher(WatchOptions{Redis: rdb, Apply: func(*rules.Set) {}, Registerer: reg, Logger: slog.New(slog.NewTextHandler(log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	raw := func(limit int) {
		t.Helper()
		y := ruleFile(limit)
		if err := rdb.HSet(ctx, RuleSetKey, "version", 9, "yaml", y, "sha", SHA(y)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	raw(3)
	if r := w.Load(ctx); r.Result != Applied || r.Version != 9 {
		t.Fatalf("first load: %+v", r)
	}
	for i, c := range []struct {
		limit int
		want  ReloadResult
	}{
		{300, Conflict},
		{300, unchanged}, // the next poll
		{3, Duplicate},   // back to the content in force
		{300, unchanged}, // the same conflicting content again: not counted again
		{301, Conflict},  // other content again
	} {
		raw(c.limit)
		if r := w.check(ctx, false); r.Result != c.want {
			t.Errorf("step %d (limit %d): %v %v, want %v", i, c.limit, r.Result, r.Err, c.want)
		}
	}
	if w.Version() != 9 || w.applied.Rules[0].Limit != 3 {
		t.Errorf("in force: version %d, limit %d; want version 9's first content (limit 3)", w.Version(), w.applied.Rules[0].Limit)
	}
	if got := testutil.ToFloat64(w.reloads.WithLabelValues("redis", "conflict")); got != 2 {
		t.Errorf("conflict reloads %v, want 2", got)
	}
	out := log.String()
	if n := strings.Count(out, "level=WARN msg=\"rule set refused: same version as the one in force, other content"); n != 2 {
		t.Errorf("%d conflict warnings, want 2 (one per distinct content):\n%s", n, out)
	}
	if !strings.Contains(out, "bump the version") || !strings.Contains(out, "version=9") {
		t.Errorf("the warning does not say the fix:\n%s", out)
	}
}

// reloads collects a watcher's reports for a test.
type reloads chan Reload

func (c reloads) next(t *testing.T) Reload {
	t.Helper()
	select {
	case r := <-c:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no reload within 10 s")
		return Reload{}
	}
}

func runWatcher(t *testing.T, o WatchOptions) (*Watcher, reloads) {
	t.Helper()
	ch := make(reloads, 16)
	o.OnReload = func(r Reload) { ch <- r }
	w, err := NewWatcher(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	select {
	case <-w.ready:
	case <-time.After(10 * time.Second):
		t.Fatal("the watcher did not follow its source within 10 s")
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return w, ch
}

// TestWatchFile: a new valid file is applied, also when saved by rename; a
// broken one is refused, counted and logged once, and the set in force
// stays.
func TestWatchFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(path, ruleFile(1), 0o644); err != nil {
		t.Fatal(err)
	}
	var inForce *rules.Set
	var mu sync.Mutex
	reg := prometheus.NewRegistry()
	log := new(syncbuf.Buffer)
	o := WatchOptions{File: path, Registerer: reg, Logger: slog.New(slog.NewTextHandler(log, nil)),
		Apply: func(s *rules.Set) { mu.Lock(); inForce = s; mu.Unlock() }}
	// A long poll: the changes below must come through file events.
	o.Poll = time.Hour
	w, ch := runWatcher(t, o)
	if r := w.Load(context.Background()); r.Result != Applied || r.Version != 1 {
		t.Fatalf("first load: %+v", r)
	}
	<-ch

	// An editor's save: write a temporary file, rename it over the old one.
	tmp := filepath.Join(dir, ".rules.yaml.swp")
	if err := os.WriteFile(tmp, ruleFile(2), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	if r := ch.next(t); r.Result != Applied || r.Version != 2 || r.Set.Rules[0].Limit != 2 {
		t.Fatalf("after rename-on-save: %+v", r)
	}

	if err := os.WriteFile(path, []byte("domain: d\nrules:\n  - id: x\n    limit: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := ch.next(t)
	if r.Result != Invalid || !strings.Contains(r.Err.Error(), "rules.yaml:3:5") {
		t.Fatalf("after a broken write: %+v; want Invalid naming rules.yaml:3:5", r)
	}
	mu.Lock()
	if inForce.Version != 2 || inForce.Rules[0].Limit != 2 || w.Version() != 2 {
		t.Errorf("after a broken write the set in force is version %d, want 2", inForce.Version)
	}
	mu.Unlock()
	if got := testutil.ToFloat64(w.reloads.WithLabelValues("file", "invalid")); got != 1 {
		t.Errorf("invalid reloads %v, want 1", got)
	}
	if got := testutil.ToFloat64(w.version); got != 2 {
		t.Errorf("sluice_rules_version %v, want 2", got)
	}
	if n := strings.Count(log.String(), "rule set refused: invalid"); n != 1 {
		t.Errorf("%d warnings for one broken file, want 1:\n%s", n, log)
	}
	if n, err := testutil.GatherAndCount(reg, "sluice_rules_reloads_total", "sluice_rules_version"); err != nil || n != 7 {
		t.Errorf("registered series: %d %v; want 6 results and the version", n, err)
	}

	if err := os.WriteFile(path, ruleFile(3), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := ch.next(t); r.Result != Applied || r.Version != 3 {
		t.Fatalf("after fixing the file: %+v", r)
	}
	if !strings.Contains(log.String(), "rule set applied") || !strings.Contains(log.String(), "version=3 previous=2") {
		t.Errorf("no readable line for the applied version:\n%s", log)
	}
}

// TestWatchFilePoll: without file events (a missed one), the re-stat finds
// the change.
func TestWatchFilePoll(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, ruleFile(1), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := NewWatcher(WatchOptions{File: path, Apply: func(*rules.Set) {}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if r := w.Load(context.Background()); r.Result != Applied {
		t.Fatal(r)
	}
	if r := w.check(context.Background(), false); r.Result != unchanged {
		t.Errorf("unchanged file: %v", r.Result)
	}
	if err := os.WriteFile(path, ruleFile(22), 0o644); err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(time.Hour)
	if err := os.Chtimes(path, future, future); err != nil {
		t.Fatal(err)
	}
	if r := w.check(context.Background(), false); r.Result != Applied || r.Version != 2 {
		t.Errorf("re-stat after a change: %+v", r)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if r := w.check(context.Background(), false); r.Result != Failed || !errors.Is(r.Err, os.ErrNotExist) || w.Version() != 2 {
		t.Errorf("missing file: %+v", r)
	}
}

func TestWatcherOptions(t *testing.T) {
	for _, o := range []WatchOptions{
		{Apply: func(*rules.Set) {}},
		{File: "f", Redis: redistest.Server(t), Apply: func(*rules.Set) {}},
		{File: "f"},
		{File: "f", Apply: func(*rules.Set) {}, Poll: -1},
	} {
		if _, err := NewWatcher(o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}
