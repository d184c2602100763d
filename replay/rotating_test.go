package replay_test

import (
	"errors"
	"io"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/detector/enrich"
	"github.com/sluice-rl/sluice/replay"
	"github.com/sluice-rl/sluice/rules"
)

// Issue 36's rotating .env prober (a new /24 every 40 s, its user agent,
// JA4 and ASN the same), a recorded burst of five exploit requests and a
// benign 2 000-user CGNAT, from testdata/eval/scenarios/
// rotating-env-prober.yaml, over two real backgrounds (SecRepo 2018 and
// 2022), in 3 seeded orders each: the prober is stopped within its first
// two /24s (every request it sends from its third /24 on is matched by a
// rule already emitted: one on its JA4 and ASN, which it keeps), the burst
// is detected, nothing is flagged on the CGNAT, precision 1.
func TestEvalRotatingProber(t *testing.T) {
	t.Parallel() // beside TestEvalInjectedScenarios
	data := sharedData(t)
	extra, err := replay.LoadScenarioFile(filepath.Join("..", "testdata", "eval", "scenarios", "rotating-env-prober.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// The prober's requests from its third /24 on: they depend on the seed
	// and its name only, not on its place or the background.
	var prober replay.EvalScenario
	for _, x := range extra {
		if x.Name == "env-prober" {
			prober = x
		}
	}
	in, err := replay.Inject(nil, replay.InjectOptions{Seed: 1}, prober.At(0, prober.Duration))
	if err != nil {
		t.Fatal(err)
	}
	start, late, total := in.Spans()[0].Start, 0, 0
	for {
		r, err := in.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		total++
		if r.Time.Sub(start) >= 2*40*time.Second {
			late++
		}
	}
	ranges, err := enrich.LoadCrawlerRanges(filepath.Join(data, "crawler-ips"))
	if err != nil {
		t.Fatal(err)
	}
	// The backgrounds' busiest 45 minutes, which hold the scenarios'
	// slots (10 to 25 minutes in): a whole day replayed waits for the
	// pipeline at each of its thousands of 10 s windows (3 minutes for
	// the six runs), and the prober and the CGNAT lie in these minutes.
	for _, bg := range []struct {
		file string
		from time.Time
	}{
		{"secrepo-2018-12-15.log", time.Date(2018, 12, 16, 0, 0, 0, 0, time.UTC)},
		{"secrepo-2022-12-22.log", time.Date(2022, 12, 22, 13, 0, 0, 0, time.UTC)},
	} {
		t.Run(bg.file, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(data, "access-logs", bg.file)
			attacks, err := replay.ReadBackgroundAttacks(abusiveFile(bg.file))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := hangGuard(t)
			defer cancel()
			run := replay.Options{DataDir: data}
			run.Detector.FakeCrawlers.Ranges = ranges // as TestEvalRealLogs judges these logs
			res, err := replay.Eval(ctx, replay.EvalOptions{Extra: extra, Orders: 3, Seed: 1, Run: run, BackgroundAttacks: attacks,
				Background: func() (replay.Source, error) {
					f, err := replay.OpenFile(ctx, path)
					return &window{Source: f, from: bg.from, to: bg.from.Add(45 * time.Minute)}, err
				}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, run := range res.Runs {
				s := run.Score
				t.Logf("%s %v: precision %.3f (%d TP, %d FP), recall %.3f", run.Name, run.Order, s.Precision, s.TruePositives, s.FalsePositives, s.Recall)
				if s.Precision < 1 || s.Recall < 1 {
					t.Errorf("%s: precision %.3f, recall %.3f: want 1", run.Name, s.Precision, s.Recall)
				}
				var span replay.Span
				for _, sp := range run.Spans {
					if sp.Scenario == "env-prober" {
						span = sp
					}
				}
				// The rule on what stays the same, emitted before the
				// third /24, active on every request from then on.
				stopped := slices.ContainsFunc(s.Rules, func(r replay.RuleScore) bool {
					keys := map[rules.Key]string{}
					for _, m := range r.Match {
						keys[m.Key] = m.Value
					}
					return r.TruePositive && keys[rules.KeyJA4] == replay.JA4Go && keys[rules.KeyASN] == "35994" &&
						!r.Emitted.After(span.Start.Add(2*40*time.Second)) && r.Active["env-prober"] >= late
				})
				for _, sc := range s.Scenarios {
					switch sc.Scenario {
					case "env-prober":
						t.Logf("env-prober: %d requests (%d from its third /24 on), %d covered by an active rule, detected in %v by %d rules", sc.Requests, late, sc.Covered, sc.TimeToDetect, sc.TruePositives)
						if sc.Requests != total || !stopped {
							t.Errorf("%s: no rule on the prober's JA4 and AS35994 emitted within its first two /24s (by %v) and active on its %d requests from the third on (%d requests in all, %d seen)",
								run.Name, span.Start.Add(80*time.Second).UTC().Format(time.TimeOnly), late, total, sc.Requests)
						}
					case "small-cgnat":
						if sc.Rules > 0 {
							t.Errorf("%s: %d rules on the benign CGNAT", run.Name, sc.Rules)
						}
					}
				}
			}
		})
	}
}

// window is a Source's requests from from to to (event time); it reads the
// rest of the source to its end, as a log is not sorted.
type window struct {
	replay.Source
	from, to time.Time
}

func (b *window) Next() (replay.Request, error) {
	for {
		r, err := b.Source.Next()
		if err != nil || !r.Time.Before(b.from) && r.Time.Before(b.to) {
			return r, err
		}
	}
}
