//go:build !sidecar

package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/sluice-rl/sluice/analytics"
	"github.com/sluice-rl/sluice/detector/enrich"
	"github.com/sluice-rl/sluice/replay"
	"github.com/sluice-rl/sluice/rules"
)

// fullCommands are the commands beyond the sidecar's (serve, rules,
// version): the replay and the pipeline, with the in-process Kafka and
// Redis and the ClickHouse client they bring. The sidecar's build
// (-tags sidecar, make sidecar) leaves them out.
func fullCommands() []*cobra.Command {
	return []*cobra.Command{replayCmd(), evalCmd(), pipelineCmd(), applyCmd(), kafkaCmd(), clickhouseCmd(), reportCmd(), crowdsecCmd()}
}

// replayMemoryLimit is the soft memory limit of `sluice replay` (runtime/debug
// SetMemoryLimit) unless GOMEMLIMIT is set: 384 MiB, under the 512 MiB a day's
// log is meant to replay in.
const replayMemoryLimit = 384 << 20

func replayCmd() *cobra.Command {
	var (
		rulesPath, dataDir   string
		htmlPath, memProfile string
		cpuProfile           string
		brokers, regions     []string
		rf                   replayRedisFlags
		sc                   replay.Scenario
		verbose              bool
		det                  detectorFlags
		alerts               crowdsecAlertFlags
	)
	var ch analytics.ConnOptions
	var shareFloor float64
	var backend replay.Backend
	c := &cobra.Command{
		Use:   "replay [FILE...]",
		Short: "Replay access logs (or a generated scenario) through enforcers, Kafka, the detector and the aggregator, and print a report",
		Long: `Replay reads Apache/nginx combined or common logs and the NASA TSV, turns each
line into a request, and drives the requests in event time through one enforcer
per region (each with its own Redis), logging every decision to Kafka. The
pipeline's detector and aggregator consume the decisions and write dynamic
rules and shares back to every region's Redis, where later decisions use them.

With no FILE it replays a scenario from sluice's seeded generator.
With no --brokers it runs an in-process Kafka broker (kfake); with no --redis
an in-process Redis per region. A replay flushes one database per region of
the Redis it uses, so it takes one only from --redis: with REDIS_ADDR alone
(exported for sluice serve) it refuses to start. With --clickhouse it also
writes every decision, dynamic rule and share to ClickHouse (sluice report
then reads them), and waits at the end until they are all written.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := rf.options(cmd.Flags(), replay.Options{Brokers: brokers, DataDir: dataDir})
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("regions") && len(regions) == 0 {
				return fmt.Errorf("--regions is empty: name at least one region, e.g. --regions us-east,eu-west")
			}
			if len(regions) > 0 {
				o.Regions = regions
			}
			o.Aggregator.Floor = shareFloor
			if cmd.Flags().Changed("backend-error-rate") || cmd.Flags().Changed("backend-degrade") {
				o.Backend = &backend
			}
			if rulesPath != "" {
				s, err := rules.Load(rulesPath)
				if err != nil {
					return err
				}
				o.Rules = s
			}
			if o.Backend != nil && !reactsToBackend(cmp.Or(o.Rules, replay.DefaultRules())) {
				fmt.Fprintln(cmd.ErrOrStderr(), "note: the rule set has no adaptive rule and no shedding: block, so nothing will react to the simulated backend; try --rules testdata/rules/backend-degrade.yaml")
			}
			if !cmd.Flags().Changed("data") {
				o.DataDir = findData()
			} else if st, err := os.Stat(dataDir); err != nil || !st.IsDir() {
				return fmt.Errorf("--data %s: not a folder; point it at the shared data folder (with asn/ and ja4/)", dataDir)
			}
			if err := checkScenarioFlags(cmd, sc, len(args) > 0); err != nil {
				return err
			}
			if verbose {
				o.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
			}
			if err := htmlNotAnInput(htmlPath, args); err != nil {
				return err
			}
			html, err := createHTML(htmlPath)
			if err != nil {
				return err
			}
			defer html.abort() // a replay that fails before its report leaves the old page as it was
			o.ClickHouse = clickhouseOption(ch)
			srcs, files, closeFiles, err := replaySources(cmd.Context(), args, sc, len(o.Regions))
			defer closeFiles()
			if err != nil {
				return err
			}
			if f, ok := cmd.ErrOrStderr().(*os.File); ok && term.IsTerminal(int(f.Fd())) {
				bar := newProgress(f, files, srcs)
				o.Progress = bar.update
				defer bar.finish()
			}
			setReplayMemoryLimit()
			if o.Detector, err = det.options(o.Detector, slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))); err != nil {
				return err
			}
			stopProfiles, err := startProfiles(cpuProfile, memProfile, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer stopProfiles()
			stopAlerts, err := alerts.start(&o.Output, slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil)), nil)
			if err != nil {
				return err
			}
			rep, err := replay.Run(cmd.Context(), o, srcs...)
			stopAlerts() // pushes what is queued first
			if rep != nil {
				rep.Print(cmd.OutOrStdout()) // partial when err != nil
			}
			return finishReplay(rep, err, html, cmd.ErrOrStderr())
		},
	}
	f := c.Flags()
	f.StringVar(&rulesPath, "rules", "", "rule file (YAML); default: the built-in replay rules")
	rf.add(f)
	f.StringSliceVar(&brokers, "brokers", nil, "Kafka brokers (default: in-process kfake)")
	f.StringSliceVar(&regions, "regions", nil, "regions to simulate (default "+strings.Join(replay.DefaultRegions, ",")+")")
	f.Float64Var(&shareFloor, "share-floor", 0.05, "the least share of a global limit every simulated region keeps (below 1/regions), as sluice pipeline's flag")
	f.Float64Var(&backend.ErrorRate, "backend-error-rate", 0.01, "simulate the backend: answer each allowed request with a 503 at this rate and report it to the enforcers (adaptive rules, load shedding); the report shows the factor and the sheds over time")
	f.Float64Var(&backend.DegradedErrorRate, "backend-degrade", 0, "the simulated backend's error rate while degraded (from --backend-degrade-at for --backend-degrade-for), e.g. 0.4")
	f.DurationVar(&backend.DegradeAt, "backend-degrade-at", time.Minute, "when the simulated backend degrades, after the first request (event time)")
	f.DurationVar(&backend.DegradeFor, "backend-degrade-for", 2*time.Minute, "how long the simulated backend stays degraded (event time)")
	f.StringVar(&dataDir, "data", "", "shared data folder for ASN and JA4 enrichment (default: ../shared/data when present)")
	f.Uint64Var(&sc.Seed, "seed", 1, "generator seed (no FILE)")
	f.DurationVar(&sc.Duration, "duration", 0, "generated traffic's event-time length (no FILE; default 10m)")
	f.BoolVarP(&verbose, "verbose", "v", false, "log warnings to stderr")
	det.add(f)
	alerts.add(f)
	f.StringVar(&htmlPath, "html", "", "also write the report as one self-contained HTML page with charts (SVG) to this file")
	f.StringVar(&ch.Addr, "clickhouse", "", "also write decisions, rules and shares to this ClickHouse, HOST:PORT (native protocol); default: none")
	f.StringVar(&ch.Database, "clickhouse-database", "sluice", "ClickHouse database with --clickhouse (migrated first)")
	f.StringVar(&memProfile, "memprofile", "", "write a heap profile at the peak heap in use (sampled each second) to this file, for go tool pprof")
	_ = f.MarkHidden("memprofile")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the replay to this file, for go tool pprof")
	_ = f.MarkHidden("cpuprofile")
	return c
}

// findData returns the shared data folder beside the repository the
// command runs in, or "" (no enrichment) when there is none.
func findData() string {
	d, err := enrich.FindData(".")
	if err != nil {
		return ""
	}
	return d
}

// checkScenarioFlags checks --seed and --duration: the generated
// scenario's, not a log file's.
func checkScenarioFlags(cmd *cobra.Command, sc replay.Scenario, files bool) error {
	gen := cmd.Flags().Changed("seed") || cmd.Flags().Changed("duration")
	if gen && files {
		return fmt.Errorf("--seed and --duration shape the generated scenario; they do not apply to log files")
	}
	if sc.Duration < 0 || (cmd.Flags().Changed("duration") && sc.Duration == 0) {
		return fmt.Errorf("--duration %s: want a positive duration such as 90s or 10m", sc.Duration)
	}
	if sc.Duration > replay.MaxGenerateDuration {
		return fmt.Errorf("--duration %s: at most %s: the generator builds its traffic in memory (about 250 MB an hour of it); replay a log file for longer", sc.Duration, replay.MaxGenerateDuration)
	}
	return nil
}

// startProfiles starts the replay's hidden --cpuprofile and --memprofile;
// stop writes them.
func startProfiles(cpuProfile, memProfile string, stderr io.Writer) (stop func(), err error) {
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err != nil {
			return stop, fmt.Errorf("--cpuprofile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return stop, fmt.Errorf("--cpuprofile: %w", err)
		}
		stops = append(stops, func() { pprof.StopCPUProfile(); f.Close() })
	}
	if memProfile != "" {
		write := peakHeapProfile(memProfile)
		stops = append(stops, func() {
			if err := write(); err != nil {
				fmt.Fprintln(stderr, "sluice:", err)
			}
		})
	}
	return stop, nil
}

// finishReplay writes the --html page of rep and turns the report's
// problems into the command's error (err, the replay's own, first).
func finishReplay(rep *replay.Report, err error, html *htmlPage, stderr io.Writer) error {
	if rep != nil && html != nil {
		if werr := html.commit(rep); werr != nil {
			return errors.Join(err, werr)
		}
		// On stderr: stdout is the report alone, to pipe or diff.
		fmt.Fprintf(stderr, "report page written to %s\n", html.path)
	}
	if err == nil && len(rep.Problems) > 0 {
		what := "problems"
		if len(rep.Problems) == 1 {
			what = "problem"
		}
		err = fmt.Errorf("replay finished with %d %s: see PROBLEMS in the report", len(rep.Problems), what)
	}
	return err
}

// replaySources opens the log files in args, or, with none, the generated
// scenario sc for regions regions (0: the default regions); close closes
// the files.
func replaySources(ctx context.Context, args []string, sc replay.Scenario, regions int) (srcs []replay.Source, files []*replay.File, close func(), err error) {
	close = func() {
		for _, f := range files {
			f.Close()
		}
	}
	for _, p := range args {
		f, err := replay.OpenFile(ctx, p)
		if err != nil {
			return nil, files, close, err
		}
		srcs = append(srcs, f)
		files = append(files, f)
	}
	if len(srcs) == 0 {
		sc.Regions = regions
		if sc.Regions == 0 {
			sc.Regions = len(replay.DefaultRegions)
		}
		srcs = append(srcs, replay.Generate(sc))
	}
	return srcs, files, close, nil
}

// htmlNotAnInput refuses an --html path that is one of the logs replayed
// (the page would replace the log).
func htmlNotAnInput(page string, logs []string) error {
	if page == "" {
		return nil
	}
	pst, err := os.Stat(page)
	if err != nil {
		return nil // no such file yet: nothing to lose
	}
	for _, l := range logs {
		if lst, err := os.Stat(l); err == nil && os.SameFile(pst, lst) {
			return fmt.Errorf("--html %s is also a log to replay: the page would replace it; give the page another name", page)
		}
	}
	return nil
}

// htmlPage is --html's page while the replay runs: a temporary file beside
// path, renamed onto it once the report is written, so that a replay that
// fails leaves what path held (an earlier run's page) as it was.
type htmlPage struct {
	f    *os.File
	path string
}

// createHTML creates --html's page (nil without the flag) before the
// replay: a folder that cannot be written fails before a long replay, not
// after it; a build without charts fails at once.
func createHTML(path string) (*htmlPage, error) {
	if path == "" {
		return nil, nil
	}
	if errNoCharts != nil {
		return nil, errNoCharts
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return nil, fmt.Errorf("--html %s: a folder; give a file name", path)
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return nil, fmt.Errorf("--html: %w", err)
	}
	return &htmlPage{f: f, path: path}, nil
}

// commit writes rep to the page and puts it at its path.
func (h *htmlPage) commit(rep *replay.Report) error {
	err := writeHTML(h.f, rep)
	if cerr := h.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(h.f.Name(), 0o644) // CreateTemp makes it 0600; a page is for reading
	}
	if err == nil {
		err = os.Rename(h.f.Name(), h.path)
	}
	if err != nil {
		os.Remove(h.f.Name())
		return fmt.Errorf("--html %s: %w", h.path, err)
	}
	h.f = nil
	return nil
}

// abort removes the temporary file of a page not committed. Safe on nil
// and after commit.
func (h *htmlPage) abort() {
	if h == nil || h.f == nil {
		return
	}
	h.f.Close()
	os.Remove(h.f.Name())
	h.f = nil
}

// setReplayMemoryLimit sets a soft memory limit unless GOMEMLIMIT does: the
// replay's live heap stays near 160 MiB whatever the log's length
// (docs/benchmarks.md, "Replay memory"), and the GC's headroom otherwise
// lets the process grow to about three times that.
func setReplayMemoryLimit() {
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(replayMemoryLimit)
	}
}

// clickhouseOption is --clickhouse's connection (nil without the flag), with
// the password from $CLICKHOUSE_PASSWORD.
func clickhouseOption(ch analytics.ConnOptions) *analytics.ConnOptions {
	if ch.Addr == "" {
		return nil
	}
	ch.Password = os.Getenv("CLICKHOUSE_PASSWORD")
	return &ch
}
