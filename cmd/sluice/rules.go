package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/sluice-rl/sluice/rules"
)

// rulesCmd is the `sluice rules` group.
func rulesCmd() *cobra.Command {
	var rc redisFlags
	cmd := &cobra.Command{
		Use:   "rules",
		Short: "Validate, diff, push, list, roll back, convert and explain rule sets; promote, add and kill dynamic rules",
		Long: `Rules manages the rule sets that enforcers follow (sluice serve --rules-redis):
the static set is pushed to each region's Redis as a new version, which every
enforcer applies within about a second; the last 20 versions are kept for
rollback. Dynamic rules (from the detector or an operator) live beside it,
each with a TTL, under a cap, behind a kill switch. See docs/rules.md.

Commands that talk to Redis take --redis (default $REDIS_ADDR).`,
	}
	pf := cmd.PersistentFlags()
	pf.StringSliceVar(&rc.addrs, "redis", nil, "the region's Redis address; several (comma-separated) for a Cluster (default $REDIS_ADDR)")
	pf.BoolVar(&rc.cluster, "redis-cluster", false, "treat a single --redis address as a Cluster")
	cmd.AddCommand(rulesValidateCmd(), rulesDiffCmd(&rc), rulesPushCmd(&rc), rulesListCmd(&rc),
		rulesRollbackCmd(&rc), rulesPromoteCmd(&rc), rulesKillCmd(&rc), rulesDynamicCmd(&rc),
		convertCmd(), explainCmd(), rulesKeysCmd(&rc))
	return cmd
}

// redisFlags are the rules commands' --redis and --redis-cluster.
type redisFlags struct {
	addrs   []string
	cluster bool
}

// client opens the Redis that --redis names; the caller closes it.
func (rc *redisFlags) client(cmd *cobra.Command) (redis.UniversalClient, error) {
	addrs := rc.addrs
	if !cmd.Flags().Changed("redis") {
		if v := os.Getenv("REDIS_ADDR"); v != "" {
			addrs = strings.Split(v, ",")
		}
	}
	if len(addrs) == 0 {
		return nil, errors.New("no Redis: name the region's Redis with --redis host:port (or set REDIS_ADDR)")
	}
	return redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs: addrs, IsClusterMode: rc.cluster,
		DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second,
	}), nil
}

// who names the person running the command, for pushes and the kill switch.
func who() string {
	name := os.Getenv("USER")
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, _ := os.Hostname()
	return name + "@" + host
}

func rulesValidateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "validate FILE...",
		Short: "Check rule files strictly; errors name file:line:column",
		Example: `  sluice rules validate rules.yaml
  rules.yaml: ok: domain api, 4 rules`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			bad := 0
			for _, p := range args {
				s, err := loadFile(p)
				if err != nil {
					bad++
					fmt.Fprintln(cmd.ErrOrStderr(), err)
					continue
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: ok: domain %s, %d rules%s\n", p, s.Domain, len(s.Rules), versionNote(s.Version))
			}
			if bad > 0 {
				return fmt.Errorf("%d of %d rule files are invalid", bad, len(args))
			}
			return nil
		},
	}
}

// loadFile parses a rule file and its declared version (0: none).
func loadFile(path string) (*rules.Set, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s, err := rules.Parse(path, b)
	if err != nil {
		return nil, err
	}
	if s.Version, err = rules.DeclaredVersion(b); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

func versionNote(v int64) string {
	if v == 0 {
		return ""
	}
	return ", version " + strconv.FormatInt(v, 10)
}

func rulesDiffCmd(rc *redisFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "diff OLD NEW | diff FILE --redis ADDR",
		Short: "Show the rules added, removed and changed (field by field) between two rule files, or between the set in force and a file",
		Example: `  sluice rules diff rules.yaml rules-new.yaml
  --- rules.yaml
  +++ rules-new.yaml
  + per-user: 100 per 1m0s, burst 100 (token bucket), enforce
  ~ per-ip: limit 10 → 20, mode enforce → shadow
  sluice rules diff rules-new.yaml --redis 127.0.0.1:6379`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var old *rules.Set
			oldName := ""
			if len(args) == 1 {
				rdb, err := rc.client(cmd)
				if err != nil {
					return err
				}
				defer rdb.Close()
				e, err := rules.NewSetStore(rdb).Current(cmd.Context())
				if err != nil && !errors.Is(err, rules.ErrNoRuleSet) {
					return err
				}
				oldName = "in force: none"
				if err == nil {
					if old, err = e.Set(); err != nil {
						return fmt.Errorf("the set in force does not parse: %w", err)
					}
					oldName = fmt.Sprintf("in force: version %d", e.Version)
				}
			} else {
				var err error
				if old, err = loadFile(args[0]); err != nil {
					return err
				}
				oldName = args[0]
			}
			newName := args[len(args)-1]
			cur, err := loadFile(newName)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "--- %s\n+++ %s\n", oldName, newName)
			d := rules.Diff(old, cur)
			if d.Empty() {
				fmt.Fprintln(out, "no changes")
				return nil
			}
			_, err = d.WriteTo(out)
			return err
		},
	}
	return cmd
}

func rulesPushCmd(rc *redisFlags) *cobra.Command {
	var version int64
	cmd := &cobra.Command{
		Use:   "push FILE",
		Short: "Validate a rule file and make it the region's rule set, as a new version",
		Long: `Push validates FILE and stores it in the region's Redis as the next version
(or --version N, which must be above the version in force; or the file's own
version:), atomically, and notifies every enforcer that follows the store
(sluice serve --rules-redis).`,
		Example: `  sluice rules push rules.yaml --redis 127.0.0.1:6379
  pushed rules.yaml as version 8 (was 7): +1 -0 ~2`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			data, err := os.ReadFile(args[0])
			if err != nil {
				return err
			}
			rdb, err := rc.client(cmd)
			if err != nil {
				return err
			}
			defer rdb.Close()
			st := rules.NewSetStore(rdb, rules.Pusher(who()))
			var old *rules.Set
			if e, err := st.Current(cmd.Context()); err == nil {
				old, _ = e.Set()
			}
			e, err := st.Push(cmd.Context(), args[0], data, version)
			if err != nil {
				return err
			}
			s, _ := e.Set()
			d := rules.Diff(old, s)
			was := "none"
			if old != nil {
				was = strconv.FormatInt(old.Version, 10)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "pushed %s as version %d (was %s): %s\n", args[0], e.Version, was, d.Summary())
			return nil
		},
	}
	cmd.Flags().Int64Var(&version, "version", 0, "the version to store, above the one in force (default: the file's version:, else the next one)")
	return cmd
}

func rulesListCmd(rc *redisFlags) *cobra.Command {
	var capN int
	cmd := &cobra.Command{
		Use:     "list",
		Short:   "Show the rule set in force (version, rules, history), then the dynamic rules with mode, origin, TTL and reason",
		Example: `  sluice rules list --redis 127.0.0.1:6379`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rdb, err := rc.client(cmd)
			if err != nil {
				return err
			}
			defer rdb.Close()
			return list(cmd.Context(), cmd.OutOrStdout(), rdb, capN, time.Now())
		},
	}
	cmd.Flags().IntVar(&capN, "cap", rules.DefaultDynamicCap, "the region's cap on active dynamic rules, to show which are over it")
	return cmd
}

func list(ctx context.Context, out io.Writer, rdb redis.UniversalClient, capN int, now time.Time) error {
	st := rules.NewSetStore(rdb)
	e, err := st.Current(ctx)
	switch {
	case errors.Is(err, rules.ErrNoRuleSet):
		fmt.Fprintln(out, "static rule set: none pushed")
	case err != nil:
		return err
	default:
		fmt.Fprintf(out, "static rule set: version %d%s, pushed %s by %s\n", e.Version, rollbackNote(&e),
			e.PushedAt.UTC().Format(time.RFC3339), orDash(e.Pusher))
		s, err := e.Set()
		if err != nil {
			fmt.Fprintf(out, "  does not parse (enforcers keep their previous set): %v\n", err)
		} else {
			fmt.Fprintf(out, "  domain %s, %d rules\n", s.Domain, len(s.Rules))
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			for _, r := range s.Rules {
				fmt.Fprintf(tw, "  %s\t%s\t%s\n", r.ID, matchText(r), r.Describe())
			}
			tw.Flush()
		}
		hist, err := st.History(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "history (newest first, %d kept):\n", len(hist))
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		for _, h := range hist {
			line := fmt.Sprintf("  v%d\t%s\t%s", h.Version, h.PushedAt.UTC().Format(time.RFC3339), orDash(h.Pusher))
			if n := rollbackNote(&h); n != "" {
				line += "\t" + strings.TrimPrefix(n, ", ")
			}
			fmt.Fprintln(tw, line)
		}
		tw.Flush()
	}

	ds := rules.NewStore(rdb, rules.DynamicCap(capN))
	killed, why, err := ds.Killed(ctx)
	if err != nil {
		return err
	}
	all, err := ds.Dynamic(ctx)
	if err != nil {
		return err
	}
	active := 0
	for _, d := range all {
		if !d.Expired(now) {
			active++
		}
	}
	kill := "off"
	if killed {
		kill = "ON (" + why + "): no dynamic rule is enforced"
	}
	fmt.Fprintf(out, "dynamic rules: %d active of %d stored, cap %d, kill switch %s\n", active, len(all), capN, kill)
	if len(all) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  ID\tMODE\tORIGIN\tTTL\tMATCH\tLIMIT\tREASON")
	for _, d := range all {
		mode := d.Mode.String()
		switch {
		case d.Promoted():
			mode += " (promoted)"
		case d.RolledBack:
			mode += " (rolled back)"
		}
		ttl := "expired"
		if !d.Expired(now) {
			ttl = d.ExpiresAt.Sub(now).Round(time.Second).String()
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.ID, mode, d.Origin, ttl, matchText(&d.Rule), d.Describe(), orDash(d.Reason))
	}
	return tw.Flush()
}

func rollbackNote(e *rules.Entry) string {
	if e.From == 0 {
		return ""
	}
	return fmt.Sprintf(", rollback to v%d", e.From)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func matchText(r *rules.Rule) string {
	ms := make([]string, len(r.Match))
	for i, m := range r.Match {
		ms[i] = m.Key.String()
		if m.Value != "" {
			ms[i] += "=" + m.Value
		}
	}
	return strings.Join(ms, ",")
}

func rulesRollbackCmd(rc *redisFlags) *cobra.Command {
	var (
		rule string
		to   int64
	)
	cmd := &cobra.Command{
		Use:   "rollback",
		Short: "Restore the previous rule-set version (as a new version), or undo a dynamic rule's promotion (--rule)",
		Example: `  sluice rules rollback --redis 127.0.0.1:6379
  rolled back to version 6's content as version 9 (was 8): +0 -1 ~0
  sluice rules rollback --to 4 --redis 127.0.0.1:6379
  sluice rules rollback --rule hh-asn-64500 --redis 127.0.0.1:6379`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if rule != "" && to != 0 {
				return errors.New("--rule and --to: give one")
			}
			rdb, err := rc.client(cmd)
			if err != nil {
				return err
			}
			defer rdb.Close()
			out := cmd.OutOrStdout()
			if rule != "" {
				d, err := rules.NewStore(rdb).RollbackRule(cmd.Context(), rule)
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "dynamic rule %s back to %s (version %d)\n", d.ID, d.Mode, d.Version)
				return nil
			}
			st := rules.NewSetStore(rdb, rules.Pusher(who()))
			cur, err := st.Current(cmd.Context())
			if err != nil {
				return err
			}
			var e rules.Entry
			if to != 0 {
				e, err = st.RollbackTo(cmd.Context(), to)
			} else {
				e, err = st.Rollback(cmd.Context())
			}
			if err != nil {
				return err
			}
			summary := ""
			if old, err := cur.Set(); err == nil {
				if s, err := e.Set(); err == nil {
					d := rules.Diff(old, s)
					summary = ": " + d.Summary()
				}
			}
			fmt.Fprintf(out, "rolled back to version %d's content as version %d (was %d)%s\n", e.From, e.Version, cur.Version, summary)
			return nil
		},
	}
	cmd.Flags().StringVar(&rule, "rule", "", "undo the promotion of this dynamic rule (back to shadow) instead")
	cmd.Flags().Int64Var(&to, "to", 0, "restore this version from the history instead of the previous one")
	return cmd
}

func rulesPromoteCmd(rc *redisFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "promote ID",
		Short:   "Switch a shadow dynamic rule to enforce (undo with rollback --rule ID)",
		Example: `  sluice rules promote hh-asn-64500 --redis 127.0.0.1:6379`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rdb, err := rc.client(cmd)
			if err != nil {
				return err
			}
			defer rdb.Close()
			d, err := rules.NewStore(rdb).Promote(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "dynamic rule %s now enforces (version %d): %s\n", d.ID, d.Version, d.Describe())
			return nil
		},
	}
}

func rulesKillCmd(rc *redisFlags) *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "kill on|off",
		Short: "Turn the dynamic-rule kill switch on (every enforcer drops all dynamic rules at its next refresh) or off",
		Example: `  sluice rules kill on --reason "false positives on AS64500" --redis 127.0.0.1:6379
  sluice rules kill off --redis 127.0.0.1:6379`,
		Args:      cobra.MatchAll(cobra.ExactArgs(1), cobra.OnlyValidArgs),
		ValidArgs: []string{"on", "off"},
		RunE: func(cmd *cobra.Command, args []string) error {
			rdb, err := rc.client(cmd)
			if err != nil {
				return err
			}
			defer rdb.Close()
			on := args[0] == "on"
			why := who()
			if reason != "" {
				why += ": " + reason
			}
			if err := rules.NewStore(rdb).SetKill(cmd.Context(), on, why); err != nil {
				return err
			}
			if on {
				fmt.Fprintf(cmd.OutOrStdout(), "kill switch on (%s): enforcers drop every dynamic rule at their next refresh\n", why)
			} else {
				fmt.Fprintln(cmd.OutOrStdout(), "kill switch off: dynamic rules that have not expired apply again")
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, recorded with the switch")
	return cmd
}

func rulesDynamicCmd(rc *redisFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dynamic",
		Short: "Manage dynamic rules by hand",
	}
	var (
		r       rules.Rule
		matches []string
		alg     string
		mode    string
		period  time.Duration
		ttl     time.Duration
		capN    int
	)
	add := &cobra.Command{
		Use:   "add",
		Short: "Add (or replace) a dynamic rule with a TTL, for tests and operations; shadow unless --mode enforce",
		Example: `  sluice rules dynamic add --id block-asn-64500 --match asn=64500 --match client_ip \
      --limit 10 --period 1m --ttl 30m --reason "scraping /v1/search" --redis 127.0.0.1:6379`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if ttl <= 0 {
				return errors.New("--ttl: want a positive duration: every dynamic rule expires")
			}
			for _, m := range matches {
				k, v, _ := strings.Cut(m, "=")
				key, err := rules.ParseKey(k)
				if err != nil {
					return fmt.Errorf("--match %q: %w", m, err)
				}
				r.Match = append(r.Match, rules.Match{Key: key, Value: v})
			}
			var err error
			if r.Algorithm, err = rules.ParseAlgorithm(alg); err != nil {
				return err
			}
			switch mode {
			case "shadow":
				r.Mode = rules.Shadow
			case "enforce":
				r.Mode = rules.Enforce
			default:
				return fmt.Errorf("--mode %q: want shadow or enforce", mode)
			}
			if r.Origin == "" {
				r.Origin = "operator/" + who()
			}
			r.Period = period
			now := time.Now()
			r.ExpiresAt = now.Add(ttl)
			if err := r.Validate(); err != nil { // also fills the defaults shown below
				return err
			}
			rdb, err := rc.client(cmd)
			if err != nil {
				return err
			}
			defer rdb.Close()
			if _, err := rules.NewStore(rdb, rules.DynamicCap(capN)).PutDynamic(cmd.Context(), now, []rules.Rule{r}); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "dynamic rule %s: %s, expires %s (in %s)\n", r.ID, r.Describe(),
				r.ExpiresAt.UTC().Format(time.RFC3339), ttl)
			return nil
		},
	}
	f := add.Flags()
	f.StringVar(&r.ID, "id", "", "rule id (1-64 of A-Z a-z 0-9 _ . -)")
	f.StringArrayVar(&matches, "match", nil, "descriptor key, or key=value; repeat for several")
	f.Int64Var(&r.Limit, "limit", 0, "tokens per period (requests per window)")
	f.DurationVar(&period, "period", time.Minute, "refill period or window")
	f.Int64Var(&r.Burst, "burst", 0, "token bucket capacity (default: limit)")
	f.StringVar(&alg, "algorithm", "", "token_bucket (default), sliding_window or fixed_window")
	f.StringVar(&mode, "mode", "shadow", "shadow or enforce")
	f.DurationVar(&ttl, "ttl", 0, "how long the rule lives (required)")
	f.StringVar(&r.Reason, "reason", "", "why, shown by list")
	f.StringVar(&r.Origin, "origin", "", "who made it (default operator/USER@HOST)")
	f.IntVar(&capN, "cap", rules.DefaultDynamicCap, "the region's cap on active dynamic rules")
	_ = add.MarkFlagRequired("id")
	_ = add.MarkFlagRequired("ttl")
	cmd.AddCommand(add)
	return cmd
}
