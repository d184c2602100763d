package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluice-rl/sluice/replay"
)

func evalCmd() *cobra.Command {
	var (
		scenarios  []string
		background string
		abusive    []string
		orders     int
		seed       uint64
		alone      bool
		asJSON     bool
		dataDir    string
	)
	cmd := &cobra.Command{
		Use:   "eval",
		Short: "Score the detector on injected attacks and benign spikes, in seeded orders, by every request its rules match",
		Long: `Eval injects the scenarios (attacks: botnet, credential-stuffing, uri-scan,
ua-flood, scraper; benign: cgnat, flash-crowd) into background traffic, all
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
requests count as benign.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o := replay.EvalOptions{Scenarios: scenarios, Orders: orders, Alone: alone, Seed: seed, Run: replay.Options{DataDir: dataDir}}
			if !cmd.Flags().Changed("data") {
				o.Run.DataDir = findData()
			}
			if orders < 0 || (orders == 0 && !alone) {
				return fmt.Errorf("--orders %d: want at least 1, or 0 with --alone", orders)
			}
			for _, name := range scenarios {
				if !strings.Contains(","+strings.Join(replay.Scenarios, ",")+",", ","+name+",") {
					return fmt.Errorf("--scenarios: no scenario %q: want some of %s", name, strings.Join(replay.Scenarios, ","))
				}
			}
			for _, a := range abusive {
				scope := map[string]string{}
				for _, kv := range strings.Split(a, ",") {
					k, v, ok := strings.Cut(kv, "=")
					if !ok || k == "" || v == "" {
						return fmt.Errorf("--abusive %q: want KEY=VALUE[,KEY=VALUE], e.g. client_ip=198.72.227.213", a)
					}
					scope[k] = v
				}
				o.BackgroundAttacks = append(o.BackgroundAttacks, replay.BackgroundAttack{Name: "background " + a, Scope: scope})
			}
			if background != "generated" {
				if _, err := os.Stat(background); err != nil {
					return fmt.Errorf("--background: %w (a log file, or \"generated\")", err)
				}
				path := background
				o.Background = func() (replay.Source, error) { return replay.OpenFile(cmd.Context(), path) }
			} else if len(abusive) > 0 {
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
	f.StringSliceVar(&scenarios, "scenarios", nil, "scenarios to inject, comma-separated; default all: "+strings.Join(replay.Scenarios, ","))
	f.StringVar(&background, "background", "generated", `background traffic: "generated" (seeded by --seed), or an access log's path`)
	f.StringArrayVar(&abusive, "abusive", nil, "a background client to count as an attack, KEY=VALUE[,KEY=VALUE] by descriptor (repeatable)")
	f.IntVar(&orders, "orders", 3, "seeded random orders of all the scenarios together to replay")
	f.Uint64Var(&seed, "seed", 1, "seed of the orders (order k uses seed+k), the injected traffic and the generated background")
	f.BoolVar(&alone, "alone", false, "also replay each scenario alone")
	f.BoolVar(&asJSON, "json", false, "print the result as JSON")
	f.StringVar(&dataDir, "data", "", "shared data folder for ASN and JA4 enrichment; default: ../shared/data beside the repository, if any")
	return cmd
}
