package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluice-rl/sluice/rules"
)

func explainCmd() *cobra.Command {
	var (
		all    bool
		prefix int
	)
	cmd := &cobra.Command{
		Use:   "explain FILE KEY=VALUE...",
		Short: "Say which rules of a rule file apply to a request, and why",
		Long: `Explain reads a rule file (sluice's format or an envoyproxy/ratelimit config)
and a request given as descriptor KEY=VALUE pairs (api_key=k1 route=/v1/search
client_ip=2001:db8::7 generic_key=slow ...), and prints each rule that
applies with the condition each value passed, and each rule that matched but
is replaced by another. With --all it also prints why every other rule does
not match. Client IPs are keyed as the enforcer keys them (IPv6 by
--ipv6-prefix).`,
		Example: `  sluice rules explain rules.yaml api_key=k1 tier=pro route=/v1/search`,
		Args:    cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			set, err := rules.Load(args[0])
			if err != nil {
				return err
			}
			used := map[string]bool{}
			for _, r := range set.Rules {
				for i := range r.Match {
					used[r.Match[i].KeyName()] = true
				}
			}
			var d rules.Descriptors
			given := map[string]bool{}
			for _, kv := range args[1:] {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || v == "" {
					return fmt.Errorf("%q: want KEY=VALUE, e.g. client_ip=192.0.2.7", kv)
				}
				if key, ok := rules.KeyFor(k); ok && key != rules.KeyCustom {
					k = key.String()
				}
				if given[k] {
					return fmt.Errorf("%q: %s is given twice; a descriptor has one value per key", kv, k)
				}
				given[k] = true
				if !used[k] {
					fmt.Fprintf(cmd.OutOrStdout(), "note: no rule of this set matches on %s\n", k)
				}
				key, ok := rules.KeyFor(k)
				switch {
				case !ok:
					return fmt.Errorf("%q: %q cannot be a descriptor key", kv, k)
				case key == rules.KeyCustom:
					if !d.SetCustom(k, v) {
						return fmt.Errorf("%q: at most %d custom keys in one request", kv, rules.MaxCustom)
					}
				case key == rules.KeyClientIP:
					d[key] = rules.NormalizeIP(v, prefix)
				default:
					d[key] = v
				}
			}
			if err := rules.NormalizeRequest(&d, set); err != nil { // as the enforcer does
				return err
			}
			printExplanation(cmd.OutOrStdout(), set, &d, all)
			return nil
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "also say why each other rule does not match")
	cmd.Flags().IntVar(&prefix, "ipv6-prefix", 64, "the prefix length that keys IPv6 client addresses, as the enforcer's")
	return cmd
}

func printExplanation(w io.Writer, set *rules.Set, d *rules.Descriptors, all bool) {
	fmt.Fprintf(w, "rule set version %d, domain %q, %s\n", set.Version, set.Domain, count(len(set.Rules), "rule"))
	applies := 0
	for _, e := range rules.Explain(set, d) {
		switch {
		case e.Applies():
			applies++
			fmt.Fprintf(w, "APPLIES   %s: %s\n", e.Rule.ID, e.Rule.Describe())
		case e.Matched:
			fmt.Fprintf(w, "REPLACED  %s: matched, but %s replaces it\n", e.Rule.ID, e.ReplacedBy)
		case all:
			fmt.Fprintf(w, "no match  %s: %s\n", e.Rule.ID, strings.Join(e.Why, "; "))
			continue
		default:
			continue
		}
		for _, why := range e.Why {
			fmt.Fprintf(w, "          %s\n", why)
		}
	}
	if applies == 0 {
		fmt.Fprintln(w, "no rule applies: the request is not limited")
	}
}
