package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/user"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

// rulesCmd is the `sluice rules` group.
func rulesCmd() *cobra.Command {
	var rc rulesRedis
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
	rc.add(pf, "the region's Redis; several (comma-separated) for a Cluster", anyTopology)
	pf.DurationVar(&rc.timeout, "timeout", 5*time.Second, "how long to wait for Redis to connect and to answer each command; a write it does not answer in time may or may not have happened")
	cmd.AddCommand(rulesValidateCmd(), rulesDiffCmd(&rc), rulesPushCmd(&rc), rulesListCmd(&rc),
		rulesRollbackCmd(&rc), rulesPromoteCmd(&rc), rulesKillCmd(&rc), rulesDynamicCmd(&rc),
		convertCmd(), explainCmd(), rulesKeysCmd(&rc))
	return cmd
}

// rulesRedis are the rules commands' Redis flags (redisconn.go) and
// --timeout.
type rulesRedis struct {
	redisFlags
	timeout time.Duration
}

// client opens the Redis that --redis names; the caller closes it.
func (rc *rulesRedis) client(cmd *cobra.Command) (redis.UniversalClient, error) {
	t, err := rc.resolve(cmd.Flags())
	if err != nil {
		return nil, err
	}
	if len(t.Addrs) == 0 {
		return nil, errors.New("no Redis: name the region's Redis with --redis host:port (or set REDIS_ADDR)")
	}
	if rc.timeout <= 0 {
		return nil, fmt.Errorf("--timeout %v: want a positive duration", rc.timeout)
	}
	return redis.NewUniversalClient(t.universal(&redis.UniversalOptions{
		DialTimeout: rc.timeout, ReadTimeout: rc.timeout, WriteTimeout: rc.timeout,
		// A write that timed out may have happened: never send it again (a
		// push without a version would make one more).
		MaxRetries: -1,
	})), nil
}

// outcomeUnknown adds to an error that leaves a write's outcome unknown
// how to find it out.
func outcomeUnknown(err error) error {
	if errors.Is(err, store.ErrOutcomeUnknown) {
		return fmt.Errorf("%w; see whether it did with `sluice rules list`", err)
	}
	return err
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
				fmt.Fprintf(cmd.OutOrStdout(), "%s: ok: domain %s, %s%s\n", p, s.Domain, count(len(s.Rules), "rule"), versionNote(s.Version))
				if n := len(s.Rules); n > enforcer.MaxRules {
					// As serve warns: found by a fresh user, whose 70 rules on
					// one key validated and then refused every check.
					fmt.Fprintf(cmd.ErrOrStderr(), "%s: warning: %d rules, more than one request may match (%d): a request that matches more is refused (400, gRPC InvalidArgument), and behind a gateway that fails open its limits are off\n", p, n, enforcer.MaxRules)
				}
			}
			if bad > 0 {
				verb := "are"
				if bad == 1 {
					verb = "is"
				}
				return fmt.Errorf("%d of %s %s invalid", bad, count(len(args), "rule file"), verb)
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
	if s.Version, err = store.DeclaredVersion(b); err != nil {
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

func rulesDiffCmd(rc *rulesRedis) *cobra.Command {
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
				e, err := store.NewSetStore(rdb).Current(cmd.Context())
				if err != nil && !errors.Is(err, store.ErrNoRuleSet) {
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

func rulesPushCmd(rc *rulesRedis) *cobra.Command {
	var version int64
	cmd := &cobra.Command{
		Use:   "push FILE",
		Short: "Validate a rule file and make it the region's rule set, as a new version",
		Long: `Push validates FILE and stores it in the region's Redis as the next version
(or --version N, which must be above the version in force; or the file's own
version:), atomically, and notifies every enforcer that follows the store
(sluice serve --rules-redis). The next version is above both the store's and
every version an enforcer reports holding, so that a Redis that lost its data
does not start again below its enforcers; a --version below an enforcer's is
refused. A file identical to the set in force is not pushed again (exit 0).

The summary compares the new set with the version it replaced, read back from
the history.`,
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
			return push(cmd.Context(), cmd.OutOrStdout(), store.NewSetStore(rdb, store.Pusher(who())), args[0], data, version)
		},
	}
	cmd.Flags().Int64Var(&version, "version", 0, "the version to store, above the one in force (default: the file's version:, else the next one)")
	return cmd
}

// push stores the rule file name (data) as version (0: the next) and says
// what it did.
func push(ctx context.Context, out io.Writer, st *store.SetStore, name string, data []byte, version int64) error {
	e, err := st.Push(ctx, name, data, version)
	if errors.Is(err, store.ErrUnchanged) {
		fmt.Fprintf(out, "%s is already in force as version %d: nothing pushed\n", name, e.Version)
		return nil
	}
	if err != nil {
		return outcomeUnknown(err)
	}
	fmt.Fprintf(out, "pushed %s as version %d %s\n", name, e.Version, replacedSummary(ctx, st, &e))
	if e.Replaced == 0 && version == 0 {
		// The store held no set: a new one, or a Redis that lost its data
		// while enforcers kept theirs. Give enforcers a poll to report what
		// they hold, and go above it if they are ahead.
		if ahead := enforcersAhead(ctx, st, e.Version, enforcerWait); ahead > 0 {
			again, err := st.Push(ctx, name, data, ahead+1)
			if err != nil {
				return outcomeUnknown(err)
			}
			fmt.Fprintf(out, "the store held no rule set but enforcers hold version %d (Redis lost its data?): pushed %s again as version %d\n", ahead, name, again.Version)
			e = again
		}
	}
	warnDynamicIDs(ctx, out, st, &e)
	return nil
}

// enforcerWait is how long a push into an empty store waits for enforcers
// to report: a little more than their poll (--rules-poll, 1 s by default).
var enforcerWait = 1500 * time.Millisecond

// enforcersAhead returns the highest version above v that a live enforcer
// reports within wait, or 0.
func enforcersAhead(ctx context.Context, st *store.SetStore, v int64, wait time.Duration) int64 {
	deadline := time.Now().Add(wait)
	for {
		rs, err := st.Enforcers(ctx)
		var top int64
		for _, r := range rs {
			if !r.Stale() && r.Version > v {
				top = max(top, r.Version)
			}
		}
		if err != nil || top > 0 || time.Now().After(deadline) {
			return top
		}
		select {
		case <-ctx.Done():
			return 0
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// warnDynamicIDs says which dynamic rules now share an id with a rule of the
// set just pushed: enforcers leave such dynamic rules out (they could
// loosen the static rule), so the push switches them off.
func warnDynamicIDs(ctx context.Context, out io.Writer, st *store.SetStore, e *store.Entry) {
	s, err := e.Set()
	if err != nil {
		return
	}
	ds, err := store.NewStore(st.Client()).Dynamic(ctx)
	if err != nil {
		return
	}
	for _, d := range ds {
		if s.Rule(d.ID) != nil && !d.Expired(time.Now()) {
			fmt.Fprintf(out, "warning: dynamic rule %s (%s, %s) has the id of a rule of this set: enforcers now leave it out; give it another id to keep it\n", d.ID, d.Mode, d.Origin)
		}
	}
}

// replacedSummary describes what e (just written) changed from the version
// it replaced, read from the history: "(was 7): +1 -0 ~2". When that version
// cannot be read (trimmed by pushes since, Redis gone), it says so instead.
func replacedSummary(ctx context.Context, st *store.SetStore, e *store.Entry) string {
	s, err := e.Set()
	if err != nil {
		return fmt.Sprintf("(was %d; the new set does not parse: %v)", e.Replaced, err)
	}
	if e.Replaced == 0 {
		d := rules.Diff(nil, s)
		return "(was none): " + d.Summary()
	}
	prev, err := st.Get(ctx, e.Replaced)
	if err != nil {
		return fmt.Sprintf("(was %d; cannot read it for a summary: %v)", e.Replaced, err)
	}
	old, err := prev.Set()
	if err != nil {
		return fmt.Sprintf("(was %d, which does not parse: no summary)", e.Replaced)
	}
	d := rules.Diff(old, s)
	return fmt.Sprintf("(was %d): %s", e.Replaced, d.Summary())
}

func rulesListCmd(rc *rulesRedis) *cobra.Command {
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
	cmd.Flags().IntVar(&capN, "cap", store.DefaultDynamicCap, "the region's cap on active dynamic rules, to show which are over it")
	return cmd
}

func list(ctx context.Context, out io.Writer, rdb redis.UniversalClient, capN int, now time.Time) error {
	st := store.NewSetStore(rdb)
	e, err := st.Current(ctx)
	switch {
	case errors.Is(err, store.ErrNoRuleSet):
		fmt.Fprintln(out, "static rule set: none pushed")
	case err != nil:
		return err
	default:
		fmt.Fprintf(out, "static rule set: version %d%s, sha %s, pushed %s by %s\n", e.Version, rollbackNote(&e), shortSHA(e.SHA),
			e.PushedAt.UTC().Format(time.RFC3339), orDash(e.Pusher))
		s, err := e.Set()
		if err != nil {
			fmt.Fprintf(out, "  does not parse (enforcers keep their previous set): %v\n", err)
		} else {
			fmt.Fprintf(out, "  domain %s, %s\n", s.Domain, count(len(s.Rules), "rule"))
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
	if err := listEnforcers(ctx, out, st, &e); err != nil {
		return err
	}

	ds := store.NewStore(rdb, store.DynamicCap(capN))
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

// listEnforcers prints what each enforcer following the store reports
// holding, and flags those that differ from the store (cur; Version 0: none)
// or have stopped reporting.
func listEnforcers(ctx context.Context, out io.Writer, st *store.SetStore, cur *store.Entry) error {
	es, err := st.Enforcers(ctx)
	if err != nil {
		return err
	}
	if len(es) == 0 {
		fmt.Fprintln(out, "enforcers: none reporting (sluice serve --rules-redis records the version it holds here at every poll)")
		return nil
	}
	differ, stale := 0, 0
	var top int64
	notes := make([]string, len(es))
	for i := range es {
		r := &es[i]
		top = max(top, r.Version)
		var n []string
		if r.Stale() {
			stale++
			n = append(n, fmt.Sprintf("STALE: no report for %s", r.Age.Round(time.Second)))
		}
		d := ""
		switch {
		case cur.Version == 0 && r.Version != 0:
			d = "DIFFERS: the store has no rule set"
		case r.Version != cur.Version:
			d = fmt.Sprintf("DIFFERS: the store has version %d", cur.Version)
		case r.Version != 0 && r.SHA != cur.SHA:
			d = fmt.Sprintf("DIFFERS: same version, other content than the store's (sha %s): push a new version", shortSHA(cur.SHA))
		}
		if d != "" {
			differ++
			n = append(n, d)
		}
		notes[i] = strings.Join(n, "; ")
	}
	fmt.Fprintf(out, "enforcers: %d reporting, %d differ from the store, %d stale\n", len(es), differ, stale)
	if cur.Version == 0 && top > 0 {
		fmt.Fprintf(out, "  the store has no rule set, but enforcers hold up to version %d (did Redis lose its data?): a push without --version will be version %d\n", top, top+1)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  INSTANCE\tVERSION\tSHA\tREPORTED\t")
	for i, r := range es {
		fmt.Fprintf(tw, "  %s\t%d\t%s\t%s ago\t%s\n", r.Instance, r.Version, orDash(shortSHA(r.SHA)), r.Age.Round(time.Second), notes[i])
	}
	return tw.Flush()
}

// shortSHA is the first 12 hex digits of a SHA-256, as the enforcers' logs
// show it.
func shortSHA(sha string) string {
	if len(sha) > 12 {
		return sha[:12]
	}
	return sha
}

func rollbackNote(e *store.Entry) string {
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

// matchText is a rule's match conditions, as explain words them: "asn =
// 64500; client_ip; path prefix /admin/, not [/admin/health]" (a key alone
// takes any value).
func matchText(r *rules.Rule) string {
	ms := make([]string, len(r.Match))
	for i := range r.Match {
		m := &r.Match[i]
		ms[i] = m.KeyName()
		if c := m.Condition(); c != "any value" {
			ms[i] += " " + c
		}
	}
	return strings.Join(ms, "; ")
}

func rulesRollbackCmd(rc *rulesRedis) *cobra.Command {
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
			if rule != "" && cmd.Flags().Changed("to") {
				return errors.New("--rule and --to: give one")
			}
			if cmd.Flags().Changed("to") && to < 1 {
				return fmt.Errorf("--to %d: want a version in the history (sluice rules list shows them)", to)
			}
			rdb, err := rc.client(cmd)
			if err != nil {
				return err
			}
			defer rdb.Close()
			out := cmd.OutOrStdout()
			if rule != "" {
				d, err := store.NewStore(rdb).RollbackRule(cmd.Context(), rule)
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "dynamic rule %s back to %s (version %d)\n", d.ID, d.Mode, d.Version)
				return nil
			}
			st := store.NewSetStore(rdb, store.Pusher(who()))
			var e store.Entry
			if to != 0 {
				e, err = st.RollbackTo(cmd.Context(), to)
			} else {
				e, err = st.Rollback(cmd.Context())
			}
			if errors.Is(err, store.ErrUnchanged) {
				fmt.Fprintf(out, "version %d's content is already in force (version %d): nothing written\n", e.From, e.Version)
				return nil
			}
			if err != nil {
				return outcomeUnknown(err)
			}
			fmt.Fprintf(out, "rolled back to version %d's content as version %d %s\n", e.From, e.Version, replacedSummary(cmd.Context(), st, &e))
			return nil
		},
	}
	cmd.Flags().StringVar(&rule, "rule", "", "undo the promotion of this dynamic rule (back to shadow) instead")
	cmd.Flags().Int64Var(&to, "to", 0, "restore this version from the history instead of the previous one")
	return cmd
}

func rulesPromoteCmd(rc *rulesRedis) *cobra.Command {
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
			d, err := store.NewStore(rdb).Promote(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "dynamic rule %s now enforces (version %d): %s\n", d.ID, d.Version, d.Describe())
			return nil
		},
	}
}

func rulesKillCmd(rc *rulesRedis) *cobra.Command {
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
			if err := store.NewStore(rdb).SetKill(cmd.Context(), on, why); err != nil {
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

func rulesDynamicCmd(rc *rulesRedis) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dynamic",
		Short: "Manage dynamic rules by hand",
	}
	var (
		r       rules.Rule
		matches []string
		cidrs   []string
		alg     string
		mode    string
		period  time.Duration
		ttl     time.Duration
		capN    int
	)
	add := &cobra.Command{
		Use:   "add",
		Short: "Add (or replace) a dynamic rule with a TTL, for tests and operations; shadow unless --mode enforce",
		Long: `Add writes a dynamic rule to the region's Redis, where every enforcer loads it at
its next refresh. It is shadow unless --mode enforce, and lives --ttl, at most
24h (the hash that holds dynamic rules expires 24h after its last write): a rule
that must last longer belongs in the static rule set (sluice rules push).

--match takes a descriptor key, for any value, or key=value for one value; the
key is a well-known one (api_key, user, client_ip, asn, route, ...), an alias
of one (user_id, x-api-key, remote_address, ...), or any other name, a custom
key (generic_key, header_match, x-tenant), as the request's descriptors name
it. Its id may not be a rule id of the static set in the store.`,
		Example: `  sluice rules dynamic add --id block-asn-64500 --match asn=64500 --match client_ip \
      --limit 10 --period 1m --ttl 30m --reason "scraping /v1/search" --redis 127.0.0.1:6379
  sluice rules dynamic add --id slow-search --match generic_key=search --match api_key \
      --limit 5 --period 1s --ttl 2h --mode enforce --redis 127.0.0.1:6379`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if ttl <= 0 {
				return errors.New("--ttl: want a positive duration: every dynamic rule expires")
			}
			if ttl > rules.MaxDynamicTTL {
				return fmt.Errorf("--ttl %s: %w", ttl, rules.ErrExpiryTooFar)
			}
			for _, m := range matches {
				m, err := matchFlag(m)
				if err != nil {
					return err
				}
				r.Match = append(r.Match, m)
			}
			if len(cidrs) > 0 {
				m := rules.Match{Key: rules.KeyClientIP}
				for _, c := range cidrs {
					p, err := netip.ParsePrefix(c)
					if err != nil {
						return fmt.Errorf("--cidr %q: want a network such as 10.0.0.0/8 or 2001:db8::/32", c)
					}
					m.CIDR = append(m.CIDR, p)
				}
				r.Match = append(r.Match, m)
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
			if err := notStatic(cmd.Context(), rdb, r.ID); err != nil {
				return err
			}
			if _, err := store.NewStore(rdb, store.DynamicCap(capN)).PutDynamic(cmd.Context(), now, []rules.Rule{r}); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "dynamic rule %s: %s, expires %s (in %s)\n", r.ID, r.Describe(),
				r.ExpiresAt.UTC().Format(time.RFC3339), ttl)
			return nil
		},
	}
	f := add.Flags()
	f.StringVar(&r.ID, "id", "", "rule id (1-64 of A-Z a-z 0-9 _ . -)")
	f.StringArrayVar(&cidrs, "cidr", nil, "client_ip within this network (repeat for several): one condition on client_ip, instead of --match client_ip=...")
	f.StringArrayVar(&matches, "match", nil, "descriptor key (any value) or key=value; a well-known key, an alias, or any other name as a custom key; repeat for several")
	f.Int64Var(&r.Limit, "limit", 0, "tokens per period (requests per window)")
	f.DurationVar(&period, "period", time.Minute, "refill period or window")
	f.Int64Var(&r.Burst, "burst", 0, "token bucket capacity (default: limit)")
	f.StringVar(&alg, "algorithm", "", "token_bucket (default), sliding_window, fixed_window or concurrency (--limit in flight, --period the lease)")
	f.StringVar(&mode, "mode", "shadow", "shadow or enforce")
	f.DurationVar(&ttl, "ttl", 0, "how long the rule lives (required), at most 24h")
	f.StringVar(&r.Reason, "reason", "", "why, shown by list")
	f.StringVar(&r.Origin, "origin", "", "who made it (default operator/USER@HOST)")
	f.IntVar(&capN, "cap", store.DefaultDynamicCap, "the region's cap on active dynamic rules")
	_ = add.MarkFlagRequired("id")
	_ = add.MarkFlagRequired("ttl")
	cmd.AddCommand(add)
	return cmd
}

// matchFlag parses a --match of dynamic add: a key (any value) or
// key=value. The key is any descriptor key name (rules.KeyFor): a custom
// one is rules.Match{Key: rules.KeyCustom, Name: name}.
func matchFlag(s string) (rules.Match, error) {
	k, v, hasValue := strings.Cut(s, "=")
	if hasValue && v == "" {
		return rules.Match{}, fmt.Errorf("--match %q: an empty value after =: give key=value, or the key alone for any value", s)
	}
	key, ok := rules.KeyFor(k)
	if !ok {
		return rules.Match{}, fmt.Errorf("--match %q: %q cannot be a descriptor key: want a well-known key (e.g. user, client_ip) or 1 to 64 printable characters without spaces", s, k)
	}
	if key == rules.KeyClientIP {
		if err := rules.CheckClientIPValue(v); err != nil {
			return rules.Match{}, fmt.Errorf("--match %q: %v (here: --cidr)", s, err)
		}
	}
	m := rules.Match{Key: key, Value: v}
	if key == rules.KeyCustom {
		m.Name = k
	}
	return m, nil
}

// notStatic refuses a dynamic rule id that a rule of the static set in the
// store has: enforcers refuse such a rule (it would share, and could raise,
// that rule's bucket). No set in the store, or one that does not parse, is
// no objection.
func notStatic(ctx context.Context, rdb redis.UniversalClient, id string) error {
	e, err := store.NewSetStore(rdb).Current(ctx)
	if errors.Is(err, store.ErrNoRuleSet) {
		return nil
	}
	if err != nil {
		return err
	}
	if !bytes.Contains(e.YAML, []byte(id)) && !bytes.ContainsRune(e.YAML, '\\') {
		return nil // not there, even escaped: spares parsing a large set (2 s for 100 000 rules)
	}
	s, err := e.Set()
	if err != nil {
		return nil
	}
	if s.Rule(id) != nil {
		return fmt.Errorf("--id %q is the id of a rule of the static set (version %d): enforcers would refuse a dynamic rule with it; choose another id", id, e.Version)
	}
	return nil
}

// count writes n with the noun, singular for 1: "1 rule", "2 rules". noun
// is the singular; an s makes the plural.
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
