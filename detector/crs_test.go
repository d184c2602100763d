package detector

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	coreruleset "github.com/corazawaf/coraza-coreruleset/v4"
	crstests "github.com/corazawaf/coraza-coreruleset/v4/tests"
	"github.com/corazawaf/coraza/v3"
	"go.yaml.in/yaml/v3"
)

// The reference: the same CRS files run by the Coraza WAF engine, as the
// detector did before its native evaluator. Test only.
const crsDirectives = `
SecRuleEngine DetectionOnly
SecRequestBodyAccess Off
SecResponseBodyAccess Off
SecAuditEngine Off
Include @crs-setup.conf.example
SecAction "id:900000,phase:1,pass,nolog,setvar:tx.blocking_paranoia_level=1"
Include @owasp_crs/REQUEST-901-INITIALIZATION.conf
`

var corazaWAF = sync.OnceValues(func() (coraza.WAF, error) {
	d := crsDirectives
	for _, f := range crsFiles {
		d += "Include @owasp_crs/" + f + "\n"
	}
	return coraza.NewWAF(coraza.NewWAFConfig().WithRootFS(coreruleset.FS).WithDirectives(d))
})

// corazaVerdict is what Coraza's CRS says of a request line and user
// agent, classified as the native evaluator classifies (crsClass).
func corazaVerdict(t testing.TB, method, target, ua string) Verdict {
	waf, err := corazaWAF()
	if err != nil {
		t.Fatal(err)
	}
	tx := waf.NewTransaction()
	defer func() {
		tx.ProcessLogging()
		_ = tx.Close()
	}()
	tx.ProcessConnection("192.0.2.1", 0, "192.0.2.2", 80)
	tx.ProcessURI(target, method, "HTTP/1.1")
	tx.AddRequestHeader("Host", "localhost")
	tx.AddRequestHeader("Accept", "*/*")
	if ua != "" {
		tx.AddRequestHeader("User-Agent", ua)
	}
	tx.ProcessRequestHeaders()
	_, _ = tx.ProcessRequestBody()
	var v Verdict
	for _, m := range tx.MatchedRules() {
		id := uint32(max(m.Rule().ID(), 0))
		if id/1000 == 913 && id%1000 >= 100 {
			v.Scanner = true
			continue
		}
		if c := crsClass(id); c > v.Class {
			v.Class, v.Rule = c, id
		}
	}
	return v
}

type crsCase struct{ method, target, ua string }

// crsRegressionCases are the requests of the CRS's own regression tests
// (go-ftw YAML, coraza-coreruleset/v4/tests) for the files the evaluator
// runs: each stage's request line and user agent, and its body, when it
// has one, as a query.
func crsRegressionCases(t testing.TB) []crsCase {
	var out []crsCase
	for _, f := range crsFiles {
		dir := strings.TrimSuffix(f, ".conf")
		err := fs.WalkDir(crstests.FS, dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") {
				return err
			}
			b, err := fs.ReadFile(crstests.FS, p)
			if err != nil {
				return err
			}
			var doc struct {
				Tests []struct {
					Stages []struct {
						Input struct {
							Method  string            `yaml:"method"`
							URI     string            `yaml:"uri"`
							Headers map[string]string `yaml:"headers"`
							Data    string            `yaml:"data"`
						} `yaml:"input"`
					} `yaml:"stages"`
				} `yaml:"tests"`
			}
			if err := yaml.Unmarshal(b, &doc); err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			for _, tc := range doc.Tests {
				for _, st := range tc.Stages {
					in := st.Input
					method, uri := cmpOr(in.Method, "GET"), cmpOr(in.URI, "/")
					ua := in.Headers["User-Agent"]
					out = append(out, crsCase{method, uri, ua})
					if in.Data != "" {
						sep := "?"
						if strings.Contains(uri, "?") {
							sep = "&"
						}
						out = append(out, crsCase{"GET", uri + sep + strings.TrimRight(in.Data, "\r\n"), "Mozilla/5.0"})
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

var requestLine = regexp.MustCompile(`"([A-Z]+) (\S+)(?: HTTP/[0-9.]+)?" \d+ \S+(?: "[^"]*" "((?:[^"\\]|\\.)*)")?`)

// logCases are the distinct targets that need a check (NeedsCheck) and the
// distinct user agents of the shared real logs and CrowdSec's snippets.
func logCases(t testing.TB) []crsCase {
	files, _ := filepath.Glob("../../shared/data/access-logs/*")
	snippets, _ := filepath.Glob("../../shared/data/labelled-attacks/*/*.log")
	files = append(files, snippets...)
	if len(files) < 5 {
		t.Skip("no shared access logs (../shared/data)")
	}
	seen := map[crsCase]bool{}
	var out []crsCase
	add := func(c crsCase) {
		if !seen[c] {
			seen[c] = true
			out = append(out, c)
		}
	}
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var method, target, ua string
			if strings.HasSuffix(f, ".tsv") {
				x := strings.Split(sc.Text(), "\t")
				if len(x) < 9 {
					continue
				}
				method, target, ua = x[3], x[4], x[8]
			} else if m := requestLine.FindStringSubmatch(sc.Text()); m != nil {
				method, target, ua = m[1], m[2], m[3]
			} else {
				continue
			}
			if NeedsCheck(target, 0) {
				add(crsCase{method, target, "Mozilla/5.0"})
			}
			if ua != "" && ua != "-" {
				add(crsCase{"GET", "/", ua})
			}
		}
		fh.Close()
	}
	return out
}

// The native evaluator agrees with Coraza running the same CRS files: on
// every request of the CRS's regression tests for those files, and on
// every target the detector would check and every user agent of the shared
// real logs and CrowdSec's snippets. A verdict is the scanner flag, the
// class and the first rule of that class.
func TestCRSNativeAgreesWithCoraza(t *testing.T) {
	if testing.Short() {
		t.Skip("about 20 s of Coraza evaluations")
	}
	e, err := newCRSEngine(coreruleset.FS)
	if err != nil {
		t.Fatal(err)
	}
	cases := crsRegressionCases(t)
	nreg := len(cases)
	cases = append(cases, logCases(t)...)
	var classes [4]int
	var bad []string
	for _, c := range cases {
		want := corazaVerdict(t, c.method, c.target, c.ua)
		got := e.eval(c.method, c.target, c.ua)
		classes[want.Class]++
		if got != want {
			bad = append(bad, fmt.Sprintf("%s %q UA %q: native %+v, Coraza %+v", c.method, c.target, c.ua, got, want))
		}
	}
	t.Logf("%d requests (%d from the CRS's regression tests); Coraza's classes none/probe/weak/exploit: %v", len(cases), nreg, classes)
	if classes[SigExploit] < 1000 {
		t.Errorf("only %d exploits among the cases: the corpus is not what it was", classes[SigExploit])
	}
	for i, b := range bad {
		if i == 30 {
			t.Errorf("... and %d more", len(bad)-30)
			break
		}
		t.Error(b)
	}
}

// Fuzzed requests get the same verdicts from both.
func FuzzCRSNativeAgreesWithCoraza(f *testing.F) {
	for _, c := range []string{"/", "/?id=1%27%20or%201=1--", "/a/.env", "/?q=<script>alert(1)</script>", "/x?a=%u0027", "/%C3%A9t%C3%A9?x=\\u0041"} {
		f.Add("GET", c, "Mozilla/5.0")
	}
	// U+017F and U+212A, which a (?i) expression folds to s and k and
	// @pm does not: the fuzzer found the native evaluator calling every
	// @pm rule matched on a user agent of one long s.
	f.Add("GET", "/?q=\u212aill", "\u017f")
	e, err := newCRSEngine(coreruleset.FS)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, method, target, ua string) {
		if method == "" || strings.ContainsAny(method, " \r\n") || strings.ContainsAny(target, " \r\n") || strings.ContainsAny(ua, "\r\n") {
			return
		}
		want := corazaVerdict(t, method, target, ua)
		if got := e.eval(method, target, ua); got != want {
			t.Errorf("%s %q UA %q: native %+v, Coraza %+v", method, target, ua, got, want)
		}
	})
}

// Every rule of the files the evaluator runs at paranoia level 1 loads:
// nothing is dropped for want of an operator or a transformation.
func TestCRSNativeLoadsEveryRule(t *testing.T) {
	e, err := newCRSEngine(coreruleset.FS)
	if err != nil {
		t.Fatal(err)
	}
	var ids []uint32
	for _, r := range e.rules {
		ids = append(ids, r.id)
	}
	for _, id := range []uint32{913100, 921110, 930100, 930120, 930130, 931100, 932160, 933150, 934100, 941100, 941310, 942100, 944100} {
		if !slices.Contains(ids, id) {
			t.Errorf("rule %d not loaded", id)
		}
	}
	if len(ids) < 100 {
		t.Errorf("%d rules loaded, want 100 or more", len(ids))
	}
}
