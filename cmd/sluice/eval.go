package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluice-rl/sluice/replay"
)

func evalCmd() *cobra.Command {
	var (
		scenarios    []string
		background   string
		abusive      []string
		abusiveFiles []string
		det          detectorFlags
		orders       int
		seed         uint64
		alone        bool
		asJSON       bool
		dataDir      string
		rf           replayRedisFlags
	)
	cmd := &cobra.Command{
		Use:   "eval",
		Short: "Score the detector on injected attacks and benign spikes, in seeded orders, by every request its rules match",
		Long: `Eval injects the scenarios (attacks: botnet, credential-stuffing, uri-scan,
ua-flood, scraper, low-slow-botnet (20 000 addresses at one request per 4 min),
slow-scan (0.5 requests/s), credential-stuffing-as29518 (another ASN); benign:
cgnat (8 000 users behind 2 addresses), flash-crowd (20 000 users arriving
within 30 s)) into background traffic, all
together in --orders seeded random orders (and, with --alone, each alone),
replays each, and judges every rule the detector emitted on every labelled
request it matches: a rule is a true positive when at least 95% of the requests
it matches, from the window that drew it to its expiry, are attack requests.
It prints the worst case over the runs (missed attacks, time to detect, rules
on benign scenarios, benign requests denied) and each run's precision, recall
and collateral; --json prints the whole result as JSON. See docs/eval.md.

The background is generated (seeded by --seed; its scraper counts as an
attack), or an access log (--background PATH), whose abusive clients
--abusive names (e.g. --abusive client_ip=198.72.227.213); its other
requests count as benign.

--scenarios FILE.yaml injects your own scenarios instead (or beside built-in
names): generators with parameters (botnet, credential-stuffing, uri-scan,
ua-flood, scraper, cgnat, flash-crowd, rotating-prober) or a labelled request
list (kind requests: an access log of attacks you recorded, merged into the
background in event time), scored the same way in the same seeded orders.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			run, err := rf.options(cmd.Flags(), replay.Options{DataDir: dataDir})
			if err != nil {
				return err
			}
			o := replay.EvalOptions{Scenarios: scenarios, Orders: orders, Alone: alone, Seed: seed, Run: run}
			if !cmd.Flags().Changed("data") {
				o.Run.DataDir = findData()
			} else if st, err := os.Stat(dataDir); err != nil || !st.IsDir() {
				return fmt.Errorf("--data %s: not a directory (the shared data folder, with asn/ and ja4/)", dataDir)
			}
			if cmd.Flags().Changed("scenarios") && len(scenarios) == 0 {
				return errors.New("--scenarios: empty: name some of " + strings.Join(replay.EvalScenarios, ",") + ", or omit the flag for all")
			}
			if o.Run.Detector, err = det.options(o.Run.Detector, slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))); err != nil {
				return err
			}
			if orders < 0 || (orders == 0 && !alone) || orders > replay.MaxEvalOrders {
				return fmt.Errorf("--orders %d: want 1 to %d, or 0 with --alone", orders, replay.MaxEvalOrders)
			}
			o.Scenarios = nil
			for _, name := range scenarios {
				if strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml") || strings.ContainsRune(name, os.PathSeparator) {
					more, err := replay.LoadScenarioFile(name)
					if err != nil {
						return fmt.Errorf("--scenarios: %w", err)
					}
					o.Extra = append(o.Extra, more...)
					continue
				}
				if !strings.Contains(","+strings.Join(replay.EvalScenarios, ",")+",", ","+name+",") {
					return fmt.Errorf("--scenarios: no scenario %q: want some of %s, or a scenario file (.yaml)", name, strings.Join(replay.EvalScenarios, ","))
				}
				o.Scenarios = append(o.Scenarios, name)
			}
			for _, file := range abusiveFiles {
				more, err := readAbusiveFile(file)
				if err != nil {
					return err
				}
				o.BackgroundAttacks = append(o.BackgroundAttacks, more...)
			}
			for _, a := range abusive {
				ba, err := parseAbusive(a)
				if err != nil {
					return err
				}
				o.BackgroundAttacks = append(o.BackgroundAttacks, ba)
			}
			if background != "generated" {
				if st, err := os.Stat(background); err != nil {
					return fmt.Errorf("--background: %w (a log file, or \"generated\")", err)
				} else if st.IsDir() {
					return fmt.Errorf("--background %s is a directory: want a log file, or \"generated\"", background)
				}
				path := background
				o.Background = func() (replay.Source, error) { return replay.OpenFile(cmd.Context(), path) }
			} else if len(o.BackgroundAttacks) > 0 {
				o.BackgroundAttacks = append(o.BackgroundAttacks, replay.GeneratedAttacks...)
			}
			res, err := replay.Eval(cmd.Context(), o, func(run string) {
				if !asJSON {
					fmt.Fprintf(cmd.ErrOrStderr(), "replaying %s\n", run)
				}
			})
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(res)
			}
			res.Print(cmd.OutOrStdout())
			return nil
		},
	}
	f := cmd.Flags()
	det.add(f)
	f.StringSliceVar(&scenarios, "scenarios", nil, "scenarios to inject, comma-separated: built-in names, or scenario files (.yaml: your own attacks as generators or labelled request lists, docs/eval.md); default all built-in: "+strings.Join(replay.EvalScenarios, ","))
	f.StringVar(&background, "background", "generated", `background traffic: "generated" (seeded by --seed), or an access log's path`)
	f.StringArrayVar(&abusive, "abusive", nil, "a background client to count as an attack, [NAME:]KEY=VALUE[,KEY=VALUE] by descriptor; a client_ip may be a CIDR network; values of one NAME are one attacker (repeatable)")
	f.StringArrayVar(&abusiveFiles, "abusive-file", nil, "a file of --abusive values, one a line, # comments (repeatable); testdata/eval/ has the real logs'")
	f.IntVar(&orders, "orders", 3, "seeded random orders of all the scenarios together to replay")
	f.Uint64Var(&seed, "seed", 1, "seed of the orders (order k uses seed+k), the injected traffic and the generated background")
	f.BoolVar(&alone, "alone", false, "also replay each scenario alone")
	f.BoolVar(&asJSON, "json", false, "print the result as JSON")
	f.StringVar(&dataDir, "data", "", "shared data folder for ASN and JA4 enrichment; default: ../shared/data beside the repository, if any")
	rf.add(f)
	return cmd
}

// parseAbusive reads one --abusive value (replay.ParseBackgroundAttack).
func parseAbusive(a string) (replay.BackgroundAttack, error) {
	ba, err := replay.ParseBackgroundAttack(a)
	if err != nil {
		return ba, fmt.Errorf("--%w", err)
	}
	return ba, nil
}

// readAbusiveFile reads an --abusive-file (replay.ReadBackgroundAttacks).
func readAbusiveFile(path string) ([]replay.BackgroundAttack, error) {
	as, err := replay.ReadBackgroundAttacks(path)
	if err != nil {
		return nil, fmt.Errorf("--abusive-file: %w", err)
	}
	return as, nil
}
