package replay_test

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/replay"
	"github.com/sluice-rl/sluice/replay/accesslog"
)

// snippetRules is what the detector emits on each labelled snippet of
// ../shared/data/labelled-attacks (CrowdSec hub test data), as "origin scope";
// a snippet not listed draws no rule. docs/eval.md says why per snippet: the
// snippets are tens of lines, under most signals' floors. A change here is a
// change of the detector's results on them: update docs/eval.md with it.
var snippetRules = map[string][]string{
	// 77 requests in 10 s, 74 distinct paths (remote file inclusion
	// probes), 97% answered 404; the content signal sees the file
	// inclusions (=http://) and the 4xx share.
	"apache-http-probing": {"detector/heavy-hitter client_ip=172.17.0.1", "detector/random-uri-scan client_ip=172.17.0.1", "detector/content client_ip=172.17.0.1"},
	// 9 POST /wp-login.php in a second, answered 200: failed logins.
	"http-bf-wordpress-bf": {"detector/content client_ip=81.150.104.130"},
	// 66 requests in 10 s to 22 random paths, each 3 times, with 18 user
	// agents: too few distinct paths for the scan signal, which wants 90% of
	// requests on distinct paths; the user-agent switching signal catches
	// it, and the content signal its 4xx share (66 of 66).
	"http-dos-random-uri": {"detector/ua-switching client_ip=127.0.0.1", "detector/content client_ip=127.0.0.1"},
	// A parser test, whose lines CrowdSec does not judge: one of them is
	// masscan's user agent, a scanner the CRS names (rule 913100), which
	// one request flags.
	"apache2-logs": {"detector/content client_ip=164.68.112.178"},
	// 4 WordPress plugin files per client, all 404 (CMS probes).
	"http-wordpress-scan": {"detector/content client_ip=127.0.0.1", "detector/content client_ip=192.168.1.1"},
	// 2 requests from Nikto (scanner user agent).
	"ipv6-postoverflow": {"detector/content client_ip=2001:db8:85a3::/64"},
	// 6 POST /client answered 401: failed logins.
	"nginx-http-generic-bf": {"detector/content client_ip=127.0.0.1"},
	// 12 binary request lines, all 400: the 4xx share over 12 paths.
	"nginx-http-malformed": {"detector/content client_ip=1.2.3.4"},
}

// The detector on the labelled snippets. The whitelist cases (benign
// Jellyfin and Nextcloud clients whose requests look like probing: 404s on
// odd paths) must draw no rule; the others are compared with snippetRules,
// and each snippet's result is logged beside the alerts CrowdSec expects.
func TestEvalLabelledSnippets(t *testing.T) {
	dir := filepath.Join(sharedData(t), "labelled-attacks")
	index := readSnippetIndex(t, filepath.Join(dir, "INDEX.tsv"))
	if len(index) == 0 {
		t.Fatal("INDEX.tsv lists no snippet")
	}
	for _, s := range index {
		t.Run(s.dir, func(t *testing.T) {
			ctx, cancel := hangGuard(t)
			defer cancel()
			rep, err := replay.Run(ctx, replay.Options{DataDir: filepath.Dir(dir)}, openSnippet(t, filepath.Join(dir, s.dir, s.log)))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range rep.DynamicRules {
				got = append(got, r.Origin+" "+scopeOf(&r))
				t.Logf("rule %s: %s", r.Origin, r.Reason)
			}
			st := rep.Sources[0].Stats
			t.Logf("%d lines: %d entries, %d malformed, %d blank; CrowdSec %s (%s log): expected_alert_count %s, sources %v; sluice: %v",
				st.Lines, st.Entries, st.Malformed, st.Blank, s.scenarios, s.logType, s.alerts, expectedSources(t, filepath.Join(dir, s.dir)), got)
			for _, e := range rep.Sources[0].Malformed {
				t.Logf("malformed line %d: %v", e.Line, e.Err)
			}
			if strings.HasSuffix(s.dir, "-whitelist") && len(got) > 0 {
				t.Errorf("whitelist case drew rules %v: want none", got)
			}
			if want := snippetRules[s.dir]; !slices.Equal(got, want) {
				t.Errorf("rules %v, want %v (update docs/eval.md with a change)", got, want)
			}
		})
	}
}

// snippet is one row of INDEX.tsv.
type snippet struct {
	dir, log, logType, scenarios, alerts string
}

func readSnippetIndex(t *testing.T, path string) []snippet {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []snippet
	for i, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 6 {
			t.Fatalf("%s:%d: %d fields, want 6 (test_dir, log_file, lines, log_type, scenarios_under_test, expected_alert_count)", path, i+1, len(f))
		}
		if i == 0 {
			continue // header
		}
		out = append(out, snippet{dir: f[0], log: f[1], logType: f[3], scenarios: f[4], alerts: f[5]})
	}
	return out
}

var assertSource = regexp.MustCompile(`Sources\["[^"]+"\]\.GetValue\(\) == "([^"]+)"`)

// expectedSources lists the alert sources a snippet's scenario.assert names.
func expectedSources(t *testing.T, dir string) []string {
	b, err := os.ReadFile(filepath.Join(dir, "scenario.assert"))
	if err != nil {
		return nil // parser-only tests have none
	}
	var out []string
	for _, m := range assertSource.FindAllStringSubmatch(string(b), -1) {
		out = append(out, m[1])
	}
	return out
}

// syslogHeader is the header rsyslog puts before a forwarded nginx line
// ("Sep 15 16:13:46 host nginx[2869]: "). The access-log parser would take
// the month for the client's host name, so the snippets' lines are read
// without it, as a log shipper would deliver them.
var syslogHeader = regexp.MustCompile(`^[A-Z][a-z]{2} [ 0-9]\d \d\d:\d\d:\d\d \S+ [^\s:]+: `)

// snippetSource is a Source over a snippet, its lines without syslog headers.
type snippetSource struct {
	name string
	r    *accesslog.Reader
}

func openSnippet(t *testing.T, path string) *snippetSource {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		b.WriteString(syslogHeader.ReplaceAllLiteralString(sc.Text(), ""))
		b.WriteByte('\n')
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return &snippetSource{name: path, r: accesslog.NewReader(strings.NewReader(b.String()), accesslog.FormatAuto)}
}

func (s *snippetSource) Name() string           { return s.name }
func (s *snippetSource) Stats() accesslog.Stats { return s.r.Stats() }
func (s *snippetSource) Next() (replay.Request, error) {
	e, err := s.r.Next()
	return replay.Request{Entry: e}, err
}
