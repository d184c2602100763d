package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

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
var sluiceLine = regexp.MustCompile(`^(?:\$ )?(?:sluice|\./sluice|go run \./cmd/sluice|/tmp/sluice-local/sluice) ([a-z].*)$`)

// TestDocsBlocks checks every fenced block of README.md and docs/ that is
// sluice's to check: a YAML block parses as YAML, and one with a top-level
// domain is a rule file that rules.Parse accepts (so is every
// envoyproxy/ratelimit example), as is a list of rules alone (in a rule
// file of their own; a rule that needs one another names is not one:
// show both); every command line that runs sluice names
// subcommands and flags that exist (without running it: most need a
// Redis, Kafka or ClickHouse). A block marked with the comment
// "# invalid on purpose" as its first line is skipped.
func TestDocsBlocks(t *testing.T) {
	yamls, rulesFiles, commands := 0, 0, 0
	for _, path := range docFiles(t) {
		name := strings.TrimPrefix(path, "../../")
		for _, f := range fences(t, path) {
			where := name + ":" + strconv.Itoa(f.line)
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
			case "":
				for _, line := range joinContinued(f.text) {
					m := sluiceLine.FindStringSubmatch(strings.TrimSpace(line))
					if m == nil {
						continue
					}
					commands++
					if err := checkCommand(m[1]); err != "" {
						t.Errorf("%s: %s: %s", where, strings.TrimSpace(line), err)
					}
				}
			}
		}
	}
	t.Logf("%d YAML blocks (%d rule files), %d sluice command lines", yamls, rulesFiles, commands)
	if yamls < 10 || rulesFiles < 5 || commands < 40 {
		t.Errorf("found %d YAML blocks, %d rule files and %d command lines: fewer than the docs hold; is the fence pattern still right?", yamls, rulesFiles, commands)
	}
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
