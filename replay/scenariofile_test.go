package replay_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/replay"
)

// The shipped scenario file loads; a bad one is refused with an error that
// names the file, the scenario and what is wrong.
func TestLoadScenarioFile(t *testing.T) {
	xs, err := replay.LoadScenarioFile(filepath.Join("..", "testdata", "eval", "scenarios", "rotating-env-prober.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(xs) != 3 || xs[0].Name != "env-prober" || xs[0].Duration != 4*time.Minute || xs[1].Name != "exploit-burst" {
		t.Fatalf("loaded %+v", xs)
	}
	in, err := replay.Inject(nil, replay.InjectOptions{Seed: 1}, xs[1].At(time.Minute, 3*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for r, err := in.Next(); err == nil; r, err = in.Next() {
		if !r.Label.Attack || r.Label.Scenario != "exploit-burst" || r.Client != "198.51.100.77" {
			t.Errorf("request %+v: want the list's, labelled exploit-burst", r)
		}
		n++
	}
	if n != 5 {
		t.Errorf("%d requests from the list, want 5", n)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "one.log"), []byte(`192.0.2.1 - - [01/Dec/2026:10:00:00 +0000] "GET / HTTP/1.1" 200 1 "-" "x"`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ yaml, want string }{
		{"scenarios: []\n", "no scenarios"},
		{"scenarios:\n  - name: a\n    kind: botnet\n    colour: red\n", "colour"},
		{"scenarios:\n  - name: a\n    kind: uri-scan\n    rotate: 40s\n", "rotate is not a parameter of kind uri-scan"},
		{"scenarios:\n  - name: a\n    kind: dos\n", `kind "dos"`},
		{"scenarios:\n  - kind: botnet\n", "a name"},
		{"scenarios:\n  - name: botnet\n    kind: botnet\n", "taken"},
		{"scenarios:\n  - name: a\n    kind: botnet\n  - name: a\n    kind: scraper\n", "taken"},
		{"scenarios:\n  - name: a\n    kind: requests\n    file: one.log\n", "attack"},
		{"scenarios:\n  - name: a\n    kind: requests\n    file: none.log\n    attack: true\n", "none.log"},
		{"scenarios:\n  - name: a\n    kind: rotating-prober\n    ja4: nope\n", "not a JA4"},
		{"scenarios:\n  - name: a\n    kind: uri-scan\n    rate: -1\n", "negative"},
	} {
		p := filepath.Join(dir, "s.yaml")
		if err := os.WriteFile(p, []byte(c.yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := replay.LoadScenarioFile(p)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "s.yaml") {
			t.Errorf("%q: error %v, want one naming s.yaml and %q", c.yaml, err, c.want)
		}
	}
}
