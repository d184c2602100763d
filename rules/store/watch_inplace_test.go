package store

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/rules"
)

// sixRules is a rule file with version v and six rules, and the length of
// its prefix that holds the first three (itself a valid file).
func sixRules(v int) (data []byte, half int) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "version: %d\ndomain: d\nrules:\n", v)
	for i := range 6 {
		if i == 3 {
			half = b.Len()
		}
		fmt.Fprintf(&b, "  - id: r%d\n    match: [{key: user}]\n    limit: %d\n    period: 1m\n", i, 10+i)
	}
	return b.Bytes(), half
}

// TestReloaderCompletesFile: a file applied half-written (its content a
// prefix of the next) is completed under the same version; an edit under
// the same version stays a conflict.
func TestReloaderCompletesFile(t *testing.T) {
	var r reloader
	var applied []int
	apply := func(s, _ *rules.Set, _ int64) { applied = append(applied, len(s.Rules)) }
	full, half := sixRules(5)
	edited := bytes.Replace(full, []byte("limit: 15"), []byte("limit: 99"), 1)
	for i, c := range []struct {
		data []byte
		want ReloadResult
	}{
		{full[:half], Applied}, // read half-written
		{full, Applied},        // the rest of the same write
		{full[:half], Conflict},
		{edited, Conflict},
	} {
		if got := r.considerFile("f.yaml", c.data, apply); got.Result != c.want || got.Version != 5 {
			t.Errorf("step %d: %v (version %d) %v, want %v (version 5)", i, got.Result, got.Version, got.Err, c.want)
		}
	}
	if len(applied) != 2 || applied[1] != 6 || len(r.applied.Rules) != 6 {
		t.Errorf("applied sets of %v rules, want [3 6]", applied)
	}
}

// TestWatchFileWrittenInPlace: a writer truncates the rule file, writes the
// first 3 of 6 rules, pauses 150 ms and writes the rest (an editor saving in
// place, kubectl cp). The half-written file is never applied; and when a
// longer pause lets it be applied, the complete file with the same version
// is applied after it, not refused as a conflict.
func TestWatchFileWrittenInPlace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	first, _ := sixRules(1)
	if err := os.WriteFile(path, first, 0o644); err != nil {
		t.Fatal(err)
	}
	o := WatchOptions{File: path, Poll: time.Hour, Apply: func(*rules.Set) {}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	w, ch := runWatcher(t, o)
	if r := w.Load(t.Context()); r.Result != Applied {
		t.Fatalf("first load: %+v", r)
	}
	<-ch
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// writeInPlace truncates the file and writes its first half; rest
	// writes the second.
	writeInPlace := func(data []byte, half int) (rest func()) {
		t.Helper()
		if err := f.Truncate(0); err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(data[:half], 0); err != nil {
			t.Fatal(err)
		}
		return func() {
			if _, err := f.WriteAt(data[half:], int64(half)); err != nil {
				t.Fatal(err)
			}
		}
	}

	for v := 2; v <= 3; v++ {
		full, half := sixRules(v)
		rest := writeInPlace(full, half)
		time.Sleep(150 * time.Millisecond)
		rest()
		if r := ch.next(t); r.Result != Applied || r.Version != int64(v) || setRules(r) != 6 {
			t.Fatalf("version %d written in place with a 150 ms pause: %v version %d with %d rules (%v); want applied with 6 rules",
				v, r.Result, r.Version, setRules(r), r.Err)
		}
	}

	// A pause long enough for the first half to be applied.
	full, half := sixRules(4)
	rest := writeInPlace(full, half)
	if r := ch.next(t); r.Result != Applied || setRules(r) != 3 {
		t.Fatalf("the first half: %+v", r)
	}
	rest()
	if r := ch.next(t); r.Result != Applied || r.Version != 4 || setRules(r) != 6 {
		t.Fatalf("the complete file after its half was applied: %v version %d (%v); want applied with 6 rules", r.Result, r.Version, r.Err)
	}
	if w.Version() != 4 {
		t.Errorf("version in force %d, want 4", w.Version())
	}
}

// setRules is how many rules r applied (0 for none).
func setRules(r Reload) int {
	if r.Set == nil {
		return 0
	}
	return len(r.Set.Rules)
}
