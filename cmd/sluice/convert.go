package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/sluice-rl/sluice/rules"
)

// convertCmd is `sluice rules convert`: an envoyproxy/ratelimit config
// rewritten in sluice's rule format. It belongs under the `rules` command.
func convertCmd() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "convert FILE",
		Short: "Rewrite an envoyproxy/ratelimit config in sluice's rule format",
		Long: `Convert reads an envoyproxy/ratelimit config (domain and nested descriptors)
and writes the same limits in sluice's rule format: one fixed-window rule per
rate_limit, matching exactly the descriptors envoyproxy/ratelimit would apply
it to (exact_keys, and the values more specific siblings take excluded).

sluice serve --rules also loads envoyproxy/ratelimit configs as they are;
convert is for moving to sluice's format, to add what it alone has (token
buckets, calendar windows, CIDRs, tiers). See docs/rules-envoy.md.`,
		Example: "  sluice rules convert ratelimit/config.yaml -o rules.yaml",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in, err := os.ReadFile(args[0])
			if err != nil {
				return fmt.Errorf("reading the envoyproxy/ratelimit config: %w", err)
			}
			b, err := rules.ConvertEnvoy(args[0], in)
			if err != nil {
				return err
			}
			if out == "" || out == "-" {
				_, err = cmd.OutOrStdout().Write(b)
				return err
			}
			if err := os.WriteFile(out, b, 0o644); err != nil {
				return fmt.Errorf("writing the converted rules: %w", err)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "file to write (default: standard output)")
	return cmd
}
