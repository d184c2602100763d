package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// `sluice replay --html FILE` prints the text report and writes the page,
// with its charts; a FILE that cannot be created fails before the replay.
func TestReplayHTMLFlag(t *testing.T) {
	dir := t.TempDir()
	page := filepath.Join(dir, "report.html")
	var out, errOut bytes.Buffer
	root := newRoot()
	root.SetArgs([]string{"replay", "--duration", "90s", "--html", page})
	root.SetOut(&out)
	root.SetErr(&errOut)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := root.ExecuteContext(ctx); err != nil {
		t.Fatalf("replay: %v\n%s", err, errOut.String())
	}
	if !strings.Contains(out.String(), "sluice replay report") || strings.Contains(out.String(), "report page written") {
		t.Errorf("want the text report alone on stdout:\n%s", out.String())
	}
	if got, want := errOut.String(), "report page written to "+page+"\n"; got != want {
		t.Errorf("stderr is not a terminal: want only %q on it (no progress bar), got:\n%s", want, got)
	}
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<!DOCTYPE html>", `<h2 id="rules">`, "<svg", "per-ip", "</html>"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the page has no %q", want)
		}
	}
	if st, err := os.Stat(page); err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("the page's mode: %v %v, want -rw-r--r--", st.Mode(), err)
	}

	// A replay that fails before its report leaves the page it would have
	// replaced as it was, and no temporary file beside it.
	root = newRoot()
	root.SetArgs([]string{"replay", "--html", page, filepath.Join(dir, "no-such.log")})
	root.SetOut(&bytes.Buffer{})
	root.SetErr(&bytes.Buffer{})
	if err := root.ExecuteContext(ctx); err == nil {
		t.Error("a replay of a missing log: no error")
	}
	if after, err := os.ReadFile(page); err != nil || !bytes.Equal(after, b) {
		t.Errorf("a failed replay changed the earlier page (%d bytes, was %d): %v", len(after), len(b), err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("files beside the page: %v, want the page alone", ents)
	}

	// An --html path that is a log to replay is refused, the log untouched.
	root = newRoot()
	root.SetArgs([]string{"replay", "--html", page, page})
	root.SetOut(&bytes.Buffer{})
	root.SetErr(&bytes.Buffer{})
	if err := root.ExecuteContext(ctx); err == nil || !strings.Contains(err.Error(), "also a log to replay") {
		t.Errorf("--html naming the replayed log: %v, want a refusal", err)
	}
	if after, err := os.ReadFile(page); err != nil || !bytes.Equal(after, b) {
		t.Errorf("--html naming the replayed log changed it: %v", err)
	}

	root = newRoot()
	root.SetArgs([]string{"replay", "--duration", "90s", "--html", filepath.Join(dir, "missing", "report.html")})
	root.SetOut(&out)
	root.SetErr(&errOut)
	err = root.ExecuteContext(ctx)
	if err == nil || !strings.Contains(err.Error(), "--html") {
		t.Errorf("an --html path in a missing folder: error %v, want one naming --html", err)
	}
}

// A generated replay longer than replay.MaxGenerateDuration is refused
// before it builds anything (it once took the machine's memory); a log none
// of whose lines parse is a problem of the report.
func TestReplayRefusesWhatItCannotHold(t *testing.T) {
	root := newRoot()
	root.SetArgs([]string{"replay", "--duration", "1000000h"})
	root.SetOut(&bytes.Buffer{})
	root.SetErr(&bytes.Buffer{})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "at most 2h") {
		t.Errorf("--duration 1000000h: %v", err)
	}
	junk := filepath.Join(t.TempDir(), "junk.log")
	if err := os.WriteFile(junk, []byte("\x00\x01 not a log\nnor this\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	root = newRoot()
	root.SetArgs([]string{"replay", junk})
	root.SetOut(&out)
	root.SetErr(&bytes.Buffer{})
	err := root.Execute()
	if err == nil || !strings.Contains(out.String(), "none of its 2 lines parsed") {
		t.Errorf("a log of junk: err %v, report:\n%s", err, out.String())
	}
}

// TestReplayShareFloor: replay's --share-floor reaches the aggregator, and
// the error for too many regions names the flag that fixes it.
func TestReplayShareFloor(t *testing.T) {
	for args, want := range map[string]string{
		"--regions a,b --share-floor 0.5":  "every region keeps a floor share of 0.500, so 2 regions take 1.00",
		"--regions " + manyRegions(20):     "use at most 19 regions or a smaller floor (--share-floor)",
		"--regions a,b --share-floor -0.1": "floor share of -0.100",
	} {
		root := newRoot()
		root.SetArgs(append([]string{"replay", "--duration", "1s"}, strings.Fields(args)...))
		root.SetOut(&bytes.Buffer{})
		root.SetErr(&bytes.Buffer{})
		if err := root.Execute(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("replay %s: %v, want an error with %q", args, err, want)
		}
	}
}

// manyRegions names n regions, r0 to r(n-1), comma-separated.
func manyRegions(n int) string {
	names := make([]string, n)
	for i := range names {
		names[i] = "r" + strconv.Itoa(i)
	}
	return strings.Join(names, ",")
}
