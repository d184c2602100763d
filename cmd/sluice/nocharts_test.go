package main

import (
	"bytes"
	"debug/buildinfo"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// chartingModules are the modules of the charting stack: gonum/plot and
// what it pulls in (LaTeX for its labels, PDF, raster drawing, fonts, its
// SVG backend's helpers), none of which a sidecar needs.
var chartingModules = []string{
	"gonum.org/v1/plot",
	"codeberg.org/go-latex/",
	"codeberg.org/go-pdf/",
	"codeberg.org/go-fonts/",
	"git.sr.ht/~sbinet/gg",
	"github.com/ajstarks/svgo",
	"github.com/golang/freetype",
}

func charting(mod string) bool {
	for _, p := range chartingModules {
		if mod == p || strings.HasPrefix(mod, strings.TrimSuffix(p, "/")+"/") {
			return true
		}
	}
	return false
}

// TestNoChartsBuild: sluice built with -tags nocharts (make sidecar) links
// none of the charting stack's modules, while the full build does link
// gonum/plot; the nocharts binary still parses replay --html, failing
// with a clear error before any replay or file, as do sluice crowdsec and
// --crowdsec-alerts, whose package it leaves out; and `sluice version` prints
// the version set at link time (as make release sets it) and the commit.
func TestNoChartsBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds sluice with -tags nocharts (about 20 s uncached)")
	}
	gobin, err := exec.LookPath("go") // go test puts its GOROOT/bin first in PATH
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "sluice-nocharts")
	// The commit from the build info's vcs.revision (GOFLAGS may say
	// -buildvcs=false, as on this project's machines), where git can read
	// this checkout.
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	buildvcs := "-buildvcs=" + strconv.FormatBool(err == nil)
	if out, err := exec.Command(gobin, "build", buildvcs, "-tags", "nocharts",
		"-ldflags", "-X main.version=v0.0.0-test", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build -tags nocharts: %v\n%s", err, out)
	}
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	tagged := false
	for _, s := range info.Settings {
		tagged = tagged || (s.Key == "-tags" && strings.Contains(s.Value, "nocharts"))
	}
	if !tagged {
		t.Errorf("the binary's build settings %v have no -tags nocharts", info.Settings)
	}
	for _, d := range info.Deps {
		if charting(d.Path) {
			t.Errorf("the -tags nocharts binary links %s %s", d.Path, d.Version)
		}
	}

	// The full build's modules, without linking a second binary.
	out, err := exec.Command(gobin, "list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	if !strings.Contains("\n"+string(out), "\ngonum.org/v1/plot\n") {
		t.Errorf("the full build does not depend on gonum.org/v1/plot: replay --html's charts are gone\n%s", out)
	}

	// What the build recorded (nothing in a git worktree, whose .git is a
	// file: go build does not stamp those), which must be git's HEAD.
	var revision string
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" {
			revision = s.Value
		}
	}
	if head := strings.TrimSpace(string(head)); revision != "" && revision != head {
		t.Errorf("the build recorded commit %s, git rev-parse HEAD says %s", revision, head)
	}
	checkVersion(t, bin, revision)

	page := filepath.Join(dir, "report.html")
	cmd := exec.Command(bin, "replay", "--duration", "1s", "--html", page)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	if _, ok := err.(*exec.ExitError); !ok {
		t.Fatalf("nocharts replay --html: %v, want a failure", err)
	}
	if !strings.Contains(stderr.String(), "built with -tags nocharts") || strings.Contains(stdout.String(), "sluice replay report") {
		t.Errorf("nocharts replay --html: want the nocharts error and no replay; stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	}
	if _, err := os.Stat(page); !os.IsNotExist(err) {
		t.Errorf("nocharts replay --html created %s (%v)", page, err)
	}

	// Nor package crowdsec, which the full build has: its command and flags
	// fail with the reason.
	for tags, want := range map[string]bool{"nocharts": false, "": true} {
		out, err := exec.Command(gobin, "list", "-deps", "-tags", tags, ".").Output()
		if err != nil {
			t.Fatalf("go list -deps -tags %q: %v", tags, err)
		}
		if has := strings.Contains("\n"+string(out), "\ngithub.com/sluice-rl/sluice/crowdsec\n"); has != want {
			t.Errorf("-tags %q: the build links package crowdsec: %v, want %v", tags, has, want)
		}
	}
	for _, args := range [][]string{{"crowdsec", "--lapi", "http://127.0.0.1:1"}, {"replay", "--duration", "1s", "--crowdsec-alerts", "http://127.0.0.1:1"}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "without the CrowdSec client") {
			t.Errorf("nocharts %v: %v, want the nocharts error:\n%s", args, err, out)
		}
	}
}

// checkVersion runs `bin version` (built with -X main.version=v0.0.0-test)
// and checks its lines: the version, the commit head (the build's
// vcs.revision; "unknown" when head is empty: none recorded) and Go's version.
func checkVersion(t *testing.T, bin, head string) {
	t.Helper()
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("sluice version: %v\n%s", err, out)
	}
	got := string(out)
	if !strings.HasPrefix(got, "sluice v0.0.0-test\n") {
		t.Errorf("sluice version: want the first line %q, got\n%s", "sluice v0.0.0-test", got)
	}
	if !strings.Contains(got, "\ngo: "+runtime.Version()+" "+runtime.GOOS+"/"+runtime.GOARCH+"\n") {
		t.Errorf("sluice version: no line go: %s; got\n%s", runtime.Version(), got)
	}
	want := head
	if want == "" {
		want = "unknown"
	}
	if !strings.Contains(got, "\ncommit: "+want) {
		t.Errorf("sluice version: want the commit %s (git rev-parse HEAD), got\n%s", want, got)
	}
}
