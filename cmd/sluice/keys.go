package main

import (
	"fmt"

	"github.com/sluice-rl/sluice/rules/store"
	"github.com/spf13/cobra"
)

// rulesKeysCmd is `sluice rules keys`: the key store that gives an API key
// its account, organisation and tier (sluice serve --key-store).
func rulesKeysCmd(rc *rulesRedis) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Manage the key store: API key → account → organisation and tier (sluice serve --key-store)",
	}
	var org, tier string
	account := &cobra.Command{
		Use:     "account ACCOUNT --org ORG --tier TIER",
		Short:   "Set an account's organisation and tier",
		Example: "  sluice rules keys account acme-eu --org acme --tier enterprise",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return rc.withKeys(cmd, func(ks *store.RedisKeys) error {
				if err := ks.PutAccount(cmd.Context(), args[0], org, tier); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "account %s: org %q, tier %q\n", args[0], org, tier)
				return nil
			})
		},
	}
	account.Flags().StringVar(&org, "org", "", "the account's organisation")
	account.Flags().StringVar(&tier, "tier", "", "the account's tier")
	key := &cobra.Command{
		Use:     "key API_KEY ACCOUNT",
		Short:   "File an API key under an account",
		Example: "  sluice rules keys key k-7f3a acme-eu",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return rc.withKeys(cmd, func(ks *store.RedisKeys) error {
				if err := ks.PutKey(cmd.Context(), args[0], args[1]); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "key %s: account %s\n", args[0], args[1])
				return nil
			})
		},
	}
	get := &cobra.Command{
		Use:   "get API_KEY",
		Short: "Show what the key store says of an API key",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return rc.withKeys(cmd, func(ks *store.RedisKeys) error {
				id, ok, err := ks.Lookup(cmd.Context(), args[0])
				switch {
				case err != nil:
					return err
				case !ok:
					return fmt.Errorf("key %s is not in the key store", args[0])
				}
				fmt.Fprintf(cmd.OutOrStdout(), "key %s: account %s, org %q, tier %q\n", args[0], id.Account, id.Org, id.Tier)
				return nil
			})
		},
	}
	cmd.AddCommand(account, key, get)
	return cmd
}

// withKeys runs fn with the key store in the Redis that --redis names.
func (rc *rulesRedis) withKeys(cmd *cobra.Command, fn func(*store.RedisKeys) error) error {
	rdb, err := rc.client(cmd)
	if err != nil {
		return err
	}
	defer rdb.Close()
	return fn(store.NewRedisKeys(rdb))
}
