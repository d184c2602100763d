package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// docFiles are the pages whose fenced blocks TestDocsBlocks checks.
func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{"../../README.md"}, files...)
}

// fence is one fenced block of a Markdown page: its info string (yaml, go,
// or empty), its text and the line its text starts on.
type fence struct {
	info, text string
	line       int
}

var fenceRE = regexp.MustCompile("(?ms)^```([a-z]*)\n(.*?)^```")

func fences(t *testing.T, path string) []fence {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []fence
	for _, m := range fenceRE.FindAllSubmatchIndex(b, -1) {
		out = append(out, fence{
			info: string(b[m[2]:m[3]]),
			text: string(b[m[4]:m[5]]),
			line: 1 + bytes.Count(b[:m[4]], []byte("\n")),
		})
	}
	return out
}

// sluiceLine matches a command line that runs sluice, however the page
// names the binary; group 1 is what follows it (subcommand, flags, args).
var sluiceLine = regexp.MustCompile(`^(?:\$ )?(?:sluice|\./sluice|go run \./cmd/sluice|/tmp/sluice-local/sluice) ([a-z-].*)$`)

// docsSkip lists the commands of the docs' sh and console blocks that
// TestDocsBlocks does not run, by the start of the command line (with the
// binary named sluice, however the page runs it), each with the reason.
// Every other command is run (and so is every --help), so a new command in
// the docs must run or be listed here; an entry that no command starts with
// is an error too.
var docsSkip = []struct{ prefix, reason string }{
	{"sluice replay --regions", "needs deploy/local/up's Kafka and ClickHouse (its TestLocalStack runs this stack)"},
	{"sluice replay --duration 2m --clickhouse", "needs a ClickHouse (analytics' tests run one; TestReplayClickHouseDown the replay without it)"},
	{"sluice replay --html report.html", "the default replay, an hour of generated traffic: about 35 s (TestReplayHTMLFlag covers the page)"},
	{"sluice replay$", "the default replay, an hour of generated traffic: about 35 s (replay's TestReplayGeneratedScenario covers it)"},
	{"sluice serve", "a server: it runs until stopped (TestServe starts it against a redis-server and checks it)"},
	{"sluice replay --duration 5m --rules testdata/rules/backend-degrade.yaml --backend-degrade", "issue 22's backend scenario, five minutes of event time (replay's TestReplayBackendDegrades runs it and checks what the page shows)"},
	{"sluice eval", "the injected-scenario evaluation: minutes (TestEvalInjectedScenarios, TestEvalRealLogs run it)"},
	{"sluice pipeline", "needs a Kafka cluster (TestPipelineCommand runs it against kfake)"},
	{"sluice apply", "needs a Kafka cluster (TestPipelineCommand runs it against kfake)"},
	{"sluice clickhouse", "needs a ClickHouse and a Kafka cluster (TestClickHouseCommands)"},
	{"sluice report", "needs a ClickHouse with data (analytics' TestReportsMatchTheFixture runs every report)"},
	{"sluice rules push big", "docs/benchmarks.md's 100 000-rule propagation measurement, with two sidecars"},
	{"go test", "a test or benchmark of its own, run by make test or make bench"},
	{"go build", "the test runs the binary it was built as"},
	{"go version -m", "inspects a binary docs/benchmarks.md's block built"},
	{"go tool pprof", "reads a heap profile of a 1-million-line replay"},
	{"make test", "the whole suite, of which this test is part"},
	{"redis-server", "the test starts its own redis-server, and its address replaces 127.0.0.1:6379 and :6390 in the commands it runs"},
	{"redis-cli", "the test's redis-server is stopped by the test"},
	{"curl", "needs a running sluice serve (enforcer/sidecar's TestHTTP checks /v1/check and its headers)"},
	{"deploy/local/", "starts the local stack of Kafka, ClickHouse and Redis (TestLocalStack)"},
	{"kubectl", "needs a Kubernetes cluster (deploy/check's kubernetes_test.go builds the overlays with kustomize and checks them)"},
	{"clickhouse-server", "starts a ClickHouse (clickhousetest does in the tests)"},
	{"make bench-rls", "sluice beside envoyproxy/ratelimit under load, minutes (docs/benchmarks.md's request-path tables)"},
	{"ROUNDS=3 WORKERS=", "make bench-rls's unloaded runs: minutes of load against the two services it starts"},
	{"make sidecar", "builds the sidecar's binary; TestSidecarBuild builds and checks the same"},
	{"ROUNDS=1 DURATION=8s WARMUP=2s deploy/bench/rls.sh", "make bench-rls: a minute and a half of load against a sidecar it starts (docs/benchmarks.md's request-path tables)"},
	{"rlsload", "a load generator of docs/benchmarks.md: 10 to 15 s per run against a running sidecar (make bench-rls)"},
	{"SLUICE_BIGLOG=", "writes a 1- or 10-million-line log for docs/benchmarks.md's memory figures"},
	{"/usr/bin/time -v", "a memory measurement over a 1- or 10-million-line log"},
	{"uptime", "docs/benchmarks.md's cold build: the load it ran at"},
	{"GOCACHE=$(mktemp -d)", "docs/benchmarks.md's cold build: minutes of CPU on an empty build cache"},
	{"{ printf", "writes docs/benchmarks.md's 100 000-rule file"},
	{"sed 's/limit: 5/limit: 6/' big.yaml", "docs/benchmarks.md's 100 000-rule file"},
	{"time ./sluice", "a timing of docs/benchmarks.md (the file it reads is made by the block)"},
	{"cd enforcer", "an interleaved benchmark loop of docs/benchmarks.md"},
	{"../old.test", "an interleaved benchmark loop of docs/benchmarks.md"},
	{"../new.test", "an interleaved benchmark loop of docs/benchmarks.md"},
	{"done", "an interleaved benchmark loop of docs/benchmarks.md"},
	{"for i in", "an interleaved benchmark loop of docs/benchmarks.md"},
	{"./old.test", "an interleaved benchmark loop of docs/benchmarks.md"},
	{"./new.test", "an interleaved benchmark loop of docs/benchmarks.md"},
	{"benchstat", "compares the benchmark loop's results"},
	{"export REDIS_", "the variables of a production start line of sluice serve, a server that runs until stopped (TestServeTLS and TestServeACL start it with such variables)"},
	{"cscli", "needs a CrowdSec Local API (TestCrowdSecBouncer and TestCrowdSecAlertsFromReplay start Debian's, and run cscli against it)"},
	{"sluice crowdsec --lapi", "a bouncer: it runs until stopped, against a Local API (TestCrowdSecBouncer runs it with sluice serve)"},
	{"sluice replay --duration 2m --crowdsec-alerts", "needs a CrowdSec Local API (TestCrowdSecAlertsFromReplay runs this replay against Debian's)"},
	{"OTEL_EXPORTER_OTLP_ENDPOINT=", "sluice serve with tracing, a server that runs until stopped (TestServeTracing exports a check's spans to an OTLP/HTTP receiver)"},
}

// docsCommand is one command of a sh or console block: its line (with
// continuations joined, the prompt cut) and, in a console block, the output
// the page shows after it.
type docsCommand struct {
	where, line string
	output      []string
}

// commands splits a sh or console block into its commands. In a console
// block commands are the lines after a "$ " prompt and the other lines their
// output; in a sh block every line that is not a comment is a command.
func commands(where string, f fence) []docsCommand {
	var out []docsCommand
	for _, l := range joinContinued(strings.TrimSuffix(f.text, "\n")) {
		switch {
		case f.info == "console" && strings.HasPrefix(l, "$ "):
			out = append(out, docsCommand{where: where, line: strings.TrimSpace(l[2:])})
		case f.info == "console" && len(out) > 0:
			out[len(out)-1].output = append(out[len(out)-1].output, l)
		case f.info == "sh" && strings.TrimSpace(l) != "" && !strings.HasPrefix(strings.TrimSpace(l), "#"):
			out = append(out, docsCommand{where: where, line: strings.TrimSpace(l)})
		}
	}
	return out
}

// fenceInfos are the languages a fenced block may be marked with: sh and
// console blocks are commands, yaml blocks configs, the rest are read only.
var fenceInfos = map[string]bool{"sh": true, "console": true, "yaml": true, "go": true, "text": true, "json": true, "sql": true}

// TestDocsBlocks checks every fenced block of README.md and docs/, which
// must each be marked with a language:
//
//   - yaml: parses as YAML, and one with a top-level domain is a rule file
//     that rules.Parse accepts (so is every envoyproxy/ratelimit example),
//     as is a list of rules alone (in a rule file of their own; a rule that
//     needs one another names is not one: show both).
//   - sh and console: every command runs, with this test's binary as
//     sluice, from the repository's root, unless docsSkip lists it with its
//     reason. Commands run in page order, against a redis-server of the
//     page's own, whose address replaces 127.0.0.1:6379 and :6390; a file
//     a command writes (-o, --html) goes to a temporary folder. A command
//     must exit 0, or non-zero where the page shows its output ending in a
//     "sluice: " error; where a console block shows the output of a
//     command that needs no Redis, the output must be that. Every sluice
//     command line, run or not, names subcommands and flags that exist.
//
// A block whose first line is the comment "# invalid on purpose" is skipped.
func TestDocsBlocks(t *testing.T) {
	yamls, rulesFiles, sluiceLines, ran := 0, 0, 0, 0
	skipUsed := make([]bool, len(docsSkip))
	bin := sluiceOnPath(t)
	for _, path := range docFiles(t) {
		name := strings.TrimPrefix(path, "../../")
		run := docsRunner{t: t, page: name, bin: bin, tmp: t.TempDir()}
		for _, f := range fences(t, path) {
			where := name + ":" + strconv.Itoa(f.line)
			if !fenceInfos[f.info] {
				t.Errorf("%s: a fenced block marked %q: mark it sh or console (commands, which this test runs), yaml (checked), or text, go, json, sql", where, f.info)
				continue
			}
			if strings.HasPrefix(f.text, "# invalid on purpose") {
				continue
			}
			switch f.info {
			case "yaml":
				yamls++
				var top any
				if err := yaml.Unmarshal([]byte(f.text), &top); err != nil {
					t.Errorf("%s: a YAML block that is not YAML: %v", where, err)
					continue
				}
				text := f.text
				switch top := top.(type) {
				case map[string]any:
					if _, ok := top["domain"]; !ok {
						continue
					}
				case []any: // rules alone, as a rule file's rules: list
					if m, ok := top[0].(map[string]any); !ok || m["id"] == nil {
						continue
					}
					text = "domain: docs\nrules:\n" + text
				default:
					continue
				}
				rulesFiles++
				if _, err := rules.Parse(where, []byte(text)); err != nil {
					t.Errorf("a rule file in the docs that sluice refuses: %v", err)
				}
			case "sh", "console":
				for _, c := range commands(where, f) {
					line := c.line
					if m := sluiceLine.FindStringSubmatch(line); m != nil {
						sluiceLines++
						line = "sluice " + m[1]
						if err := checkCommand(m[1]); err != "" {
							t.Errorf("%s: %s: %s", where, c.line, err)
						}
					}
					skipped := false
					for i, s := range docsSkip {
						if code, _, _ := strings.Cut(line, " #"); strings.HasSuffix(strings.TrimSpace(code), " --help") {
							break // quick whatever the command: always run
						}
						p, exact := strings.CutSuffix(s.prefix, "$")
						if exact && line == p || !exact && strings.HasPrefix(line, p) {
							skipped, skipUsed[i] = true, true
							break
						}
					}
					switch {
					case skipped:
					case !strings.HasPrefix(line, "sluice "):
						t.Errorf("%s: %q is neither run nor in docsSkip with a reason: list it there, or make it a sluice command this test can run", where, c.line)
					default:
						ran++
						run.command(c, line)
					}
				}
			}
		}
	}
	for i, used := range skipUsed {
		if !used {
			t.Errorf("docsSkip lists %q, which no command of the docs starts with any longer: remove it", docsSkip[i].prefix)
		}
	}
	t.Logf("%d YAML blocks (%d rule files), %d sluice command lines, %d commands run", yamls, rulesFiles, sluiceLines, ran)
	if yamls < 10 || rulesFiles < 5 || sluiceLines < 40 || ran < 15 {
		t.Errorf("found %d YAML blocks, %d rule files, %d sluice command lines and ran %d commands: fewer than the docs hold; is the fence pattern still right?", yamls, rulesFiles, sluiceLines, ran)
	}
}

// sluiceOnPath makes this test binary the sluice that commands run (see
// TestMain: SLUICE_TEST_AS_MAIN=1 makes it run main) and returns the
// folder to put first in PATH.
func sluiceOnPath(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	script := "#!/bin/sh\nSLUICE_TEST_AS_MAIN=1 exec " + strconv.Quote(self) + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(dir, "sluice"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// docsOutputNotCompared are the console commands whose output the page
// shows but this test does not compare, by the start of the command line
// as the page writes it; each is still run and its exit status checked.
var docsOutputNotCompared = []struct{ prefix, reason string }{
	{"sluice rules list", "the page shows enforcers reporting, some differing and stale, which needs running sidecars"},
	{"sluice rules push testdata/docs/rules-new.yaml --redis 10.0.0.5:6379", "the cause of the failure depends on the network: an i/o timeout, a refusal, or a proxy's answer"},
}

// docsNormalize makes what varies from run to run the same in a page's
// output and a command's: times, user@host, and SHAs.
var docsNormalize = regexpReplacer{
	{regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`), "TIME"},
	{regexp.MustCompile(`[a-z]+@[a-z0-9.-]+`), "USER@HOST"},
	{regexp.MustCompile(`sha [0-9a-f]{12}`), "sha SHA"},
}

type regexpReplacer []struct {
	re   *regexp.Regexp
	with string
}

func (r regexpReplacer) Replace(s string) string {
	for _, x := range r {
		s = x.re.ReplaceAllString(s, x.with)
	}
	return s
}

// docsSetup are the commands run on a page's redis-server before the
// page's first command that names one, to give it the state the page's
// examples start from: docs/rules.md's set in force is version 7 of
// testdata/docs/rules.yaml, and its dynamic rule asn-64500 was promoted.
var docsSetup = map[string][]string{
	"docs/rules.md": {
		"sluice rules push testdata/docs/rules.yaml --version 7 --redis REDIS",
		"sluice rules dynamic add --id asn-64500 --match asn=64500 --match client_ip --limit 10 --period 1m --ttl 30m --reason 'scraping /v1/search' --redis REDIS",
		"sluice rules promote asn-64500 --redis REDIS",
	},
}

// docsRunner runs one page's commands, in order, against the page's own
// redis-server, started when a command first names one.
type docsRunner struct {
	t              *testing.T
	page, bin, tmp string
	redis          string
}

var (
	docsRedisAddr = regexp.MustCompile(`(?:127\.0\.0\.1|localhost):(?:6379|6390)\b`)
	docsWrites    = regexp.MustCompile(`(-o|--html|--output|--memprofile) (\S+)`)
)

// command runs line (c's command, with the binary named sluice) with bash
// from the repository's root, and checks its exit status and output.
func (r *docsRunner) command(c docsCommand, line string) {
	t := r.t
	if docsRedisAddr.MatchString(line) {
		if r.redis == "" {
			r.redis = redistest.Addr(t)
			for _, s := range docsSetup[r.page] {
				if out, err := r.bash(strings.ReplaceAll(s, "REDIS", r.redis)); err != nil {
					t.Fatalf("%s's setup: %s: %v\n%s", r.page, s, err, out)
				}
			}
		}
		line = docsRedisAddr.ReplaceAllString(line, r.redis)
	}
	line = docsWrites.ReplaceAllStringFunc(line, func(m string) string {
		flag, file, _ := strings.Cut(m, " ")
		return flag + " " + filepath.Join(r.tmp, filepath.Base(file))
	})
	start := time.Now()
	out, err := r.bash(line)
	wantFail := len(c.output) > 0 && strings.HasPrefix(c.output[len(c.output)-1], "sluice: ")
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		t.Errorf("%s: %s: still running after %v\n%s", c.where, c.line, docsCommandTimeout, out)
	case wantFail && err == nil:
		t.Errorf("%s: %s: exit 0, but the page shows it failing\n%s", c.where, c.line, out)
	case !wantFail && err != nil:
		t.Errorf("%s: %s: %v, but the page implies success\n%s", c.where, c.line, err, out)
	}
	t.Logf("%s: ran %s (%s)", c.where, line, time.Since(start).Round(time.Millisecond))
	if len(c.output) == 0 {
		return
	}
	for _, s := range docsOutputNotCompared {
		if strings.HasPrefix(c.line, s.prefix) {
			return
		}
	}
	got := docsNormalize.Replace(strings.TrimRight(string(out), "\n"))
	if want := docsNormalize.Replace(strings.Join(c.output, "\n")); got != want {
		t.Errorf("%s: %s: the output differs from the page's (times, user@host and SHAs aside)\n got:\n%s\nwant:\n%s", c.where, c.line, got, want)
	}
}

// bash runs line with bash from the repository's root, this test's binary
// first in PATH as sluice, for at most 30 s (then the error is
// context.DeadlineExceeded).
// docsCommandTimeout bounds one docs command: the real-log replay of the
// README takes about 7 s alone, several times that on a loaded machine.
const docsCommandTimeout = 2 * time.Minute

func (r *docsRunner) bash(line string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), docsCommandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", line)
	cmd.Dir = "../.."
	cmd.Env = append(environWithout("REDIS_ADDR"), "PATH="+r.bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = ctx.Err()
	}
	return out, err
}

// joinContinued joins lines ending in a backslash with the next.
func joinContinued(text string) []string {
	var out []string
	var cur strings.Builder
	for _, l := range strings.Split(text, "\n") {
		if s, ok := strings.CutSuffix(strings.TrimRight(l, " "), `\`); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(l)
		out = append(out, cur.String())
		cur.Reset()
	}
	return out
}

// checkCommand resolves a sluice command line's subcommand and checks each
// of its flags exists there; it returns what is wrong, or "". The line is
// cut at a comment, a pipe, a redirection or a background &.
func checkCommand(line string) string {
	var words []string
	for _, w := range strings.Fields(line) {
		if w == "#" || w == "|" || w == "&" || w == "&&" || w == ";" || strings.HasPrefix(w, ">") || strings.HasPrefix(w, "2>") {
			break
		}
		words = append(words, w)
	}
	cmd, rest, err := newRoot().Find(words)
	if err != nil {
		return err.Error()
	}
	if cmd.HasSubCommands() && !cmd.Runnable() {
		return "names " + cmd.CommandPath() + ", which needs a subcommand"
	}
	for _, w := range rest {
		switch {
		case w == "--":
			return ""
		case strings.HasPrefix(w, "--"):
			flag, _, _ := strings.Cut(strings.TrimPrefix(w, "--"), "=")
			if flag != "help" && cmd.Flags().Lookup(flag) == nil && cmd.InheritedFlags().Lookup(flag) == nil {
				return cmd.CommandPath() + " has no flag --" + flag
			}
		case len(w) == 2 && w[0] == '-' && w[1] != '-':
			if cmd.Flags().ShorthandLookup(w[1:]) == nil && cmd.InheritedFlags().ShorthandLookup(w[1:]) == nil {
				return cmd.CommandPath() + " has no flag " + w
			}
		}
	}
	return ""
}
