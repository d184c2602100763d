//go:build !sidecar

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluice-rl/sluice/analytics"
	"github.com/sluice-rl/sluice/pipeline"
)

// clickhouseFlags adds the flags that name a ClickHouse server and
// database; CLICKHOUSE_ADDR and CLICKHOUSE_PASSWORD stand in for
// --clickhouse and --password.
func clickhouseFlags(f *pflag.FlagSet, o *analytics.ConnOptions) {
	f.StringVar(&o.Addr, "clickhouse", "", "ClickHouse native-protocol address HOST:PORT (default $CLICKHOUSE_ADDR, else 127.0.0.1:9000)")
	f.StringVar(&o.Database, "database", "sluice", "ClickHouse database of sluice's tables")
	f.StringVar(&o.User, "user", "default", "ClickHouse user (the password comes from $CLICKHOUSE_PASSWORD)")
}

func clickhouseEnv(o *analytics.ConnOptions) {
	if o.Addr == "" {
		o.Addr = os.Getenv("CLICKHOUSE_ADDR")
	}
	o.Password = os.Getenv("CLICKHOUSE_PASSWORD")
}

func clickhouseCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "clickhouse",
		Short: "ClickHouse analytics: apply the schema (migrate), write decisions, rules and shares to it (sink)",
	}
	cmd.AddCommand(clickhouseMigrateCmd(), clickhouseSinkCmd())
	return cmd
}

func clickhouseMigrateCmd() *cobra.Command {
	var o analytics.ConnOptions
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create the database and apply the schema's migrations (deploy/clickhouse/NNNN_*.sql) not yet applied",
		Long: `Migrate creates the database (--database, sluice) when it is missing and
applies, in order, the migrations of deploy/clickhouse that its
schema_migrations table does not list. Running it again applies nothing.
The sink runs it at its start too (sluice clickhouse sink --migrate).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			clickhouseEnv(&o)
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
			defer cancel()
			applied, err := analytics.Migrate(ctx, o)
			if err != nil {
				return err
			}
			if len(applied) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "the schema is up to date")
			}
			for _, name := range applied {
				fmt.Fprintln(cmd.OutOrStdout(), "applied", name)
			}
			return nil
		},
	}
	clickhouseFlags(cmd.Flags(), &o)
	return cmd
}

func clickhouseSinkCmd() *cobra.Command {
	var (
		co      analytics.ConnOptions
		o       analytics.SinkOptions
		metrics string
		migrate bool
	)
	cmd := &cobra.Command{
		Use:   "sink --brokers HOST:PORT",
		Short: "Write the decision topic, and the pipeline's rules and shares, to ClickHouse in batches",
		Long: `Sink is the analytics stage of the pipeline: a consumer group of its own
(--group, sluice-clickhouse) that reads the decision topic and the output
topic (the detector's rules, the aggregator's shares) and inserts them into
ClickHouse's decisions, dynamic_rules and shares tables in batches of
--batch-rows records or every --flush-interval. Offsets are committed only
after ClickHouse acknowledged a batch: while ClickHouse is down the sink
retries and reads no further (its lag grows, nothing is lost), and no other
stage waits for it. Records delivered twice are deduplicated by the tables
(docs/analytics.md).

Metrics (sluice_clickhouse_*) are served on --metrics at /metrics, with
/healthz and /readyz (503 while ClickHouse does not answer a ping).
SIGTERM or SIGINT leaves the group; a batch not yet acknowledged is read
again by the next owner.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(o.Brokers) == 0 {
				return errors.New("--brokers is required: the Kafka brokers the enforcers log decisions to")
			}
			if o.BatchRows <= 0 || o.FlushInterval <= 0 {
				return fmt.Errorf("--batch-rows %d and --flush-interval %v: want positive values", o.BatchRows, o.FlushInterval)
			}
			clickhouseEnv(&co)
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			ctx := cmd.Context()
			if migrate {
				mctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
				applied, err := analytics.Migrate(mctx, co)
				cancel()
				if err != nil {
					return err
				}
				if len(applied) > 0 {
					log.Info("schema migrated", "applied", strings.Join(applied, " "))
				}
			}
			conn, err := analytics.Open(co)
			if err != nil {
				return err
			}
			defer conn.Close()
			reg := prometheus.NewRegistry()
			reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
			o.Conn, o.Logger, o.Registerer = conn, log, reg
			s, err := analytics.NewSink(o)
			if err != nil {
				return err
			}
			addr, serve, stop, err := serveMetrics(reg, metrics, func(ctx context.Context) error {
				ctx, cancel := context.WithTimeout(ctx, time.Second)
				defer cancel()
				if err := conn.Ping(ctx); err != nil {
					return fmt.Errorf("clickhouse: %w", err)
				}
				return nil
			})
			if err != nil {
				s.Close()
				return err
			}
			log.Info("clickhouse sink running", "brokers", o.Brokers, "clickhouse", co.Addr, "database", co.Database, "metrics", addr)
			g := newRunGroup(ctx)
			g.addStop("metrics server", serve, stop)
			g.add("clickhouse sink", s.Run)
			err = g.wait()
			if closeWithin(s.Close, 15*time.Second) {
				log.Info("clickhouse sink stopped")
			} else {
				log.Warn("clickhouse sink stopped without leaving its group within 15 s: Kafka did not answer; the group expires this member after its session timeout")
			}
			return err
		},
	}
	f := cmd.Flags()
	clickhouseFlags(f, &co)
	f.StringSliceVar(&o.Brokers, "brokers", nil, "Kafka brokers (required)")
	f.StringVar(&o.Topic, "topic", pipeline.DefaultTopic, "the decision topic")
	f.StringVar(&o.OutputTopic, "output-topic", pipeline.DefaultOutputTopic, "the pipeline's output topic (rules and shares)")
	f.BoolVar(&o.NoOutput, "no-output", false, "read the decision topic only")
	f.StringVar(&o.Group, "group", analytics.DefaultGroup, "consumer group")
	f.IntVar(&o.BatchRows, "batch-rows", 10_000, "flush a batch at this many records")
	f.DurationVar(&o.FlushInterval, "flush-interval", time.Second, "flush a batch this long after its first record at the latest")
	f.StringVar(&metrics, "metrics", "127.0.0.1:9467", "address for /metrics, /healthz and /readyz (empty: none)")
	f.BoolVar(&migrate, "migrate", true, "apply the schema's pending migrations first")
	return cmd
}

func reportCmd() *cobra.Command {
	var (
		o        analytics.ConnOptions
		from, to string
		last     time.Duration
		limit    int
		apiKey   string
	)
	cmd := &cobra.Command{
		Use:   "report [NAME]",
		Short: "Print an analytics report from ClickHouse; with no NAME, list them",
		Long: `Report runs one of the queries of deploy/clickhouse/queries on ClickHouse
and prints its table. The range is the last --last (1h) up to now, or
--from to --to (RFC 3339, e.g. 2026-11-02T10:00:00Z); key_usage reports
one --api-key. The reports count
each decision once, however often the sink wrote it (docs/analytics.md).`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				for _, r := range analytics.Reports() {
					fmt.Fprintf(cmd.OutOrStdout(), "%-20s %s\n", r.Name, r.Title)
				}
				return nil
			}
			p := analytics.ReportParams{Limit: limit, To: time.Now(), APIKey: apiKey}
			if to != "" {
				t, err := time.Parse(time.RFC3339, to)
				if err != nil {
					return fmt.Errorf("--to %q: want RFC 3339, e.g. 2026-11-02T11:00:00Z", to)
				}
				p.To = t
			}
			p.From = p.To.Add(-last)
			if from != "" {
				t, err := time.Parse(time.RFC3339, from)
				if err != nil {
					return fmt.Errorf("--from %q: want RFC 3339, e.g. 2026-11-02T10:00:00Z", from)
				}
				p.From = t
			}
			if !p.From.Before(p.To) {
				return fmt.Errorf("the range %s to %s is empty", p.From.UTC().Format(time.RFC3339), p.To.UTC().Format(time.RFC3339))
			}
			if limit < 1 {
				return fmt.Errorf("--limit %d: want at least 1", limit)
			}
			if strings.ReplaceAll(args[0], "-", "_") == "key_usage" && apiKey == "" {
				return errors.New("report key_usage needs --api-key: the key whose requests it shows")
			}
			clickhouseEnv(&o)
			conn, err := analytics.Open(o)
			if err != nil {
				return err
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Minute)
			defer cancel()
			t, err := analytics.RunReport(ctx, conn, args[0], p)
			if err != nil {
				return err
			}
			return t.WriteText(cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	clickhouseFlags(f, &o)
	f.DurationVar(&last, "last", time.Hour, "the range: this long up to --to (or now)")
	f.StringVar(&from, "from", "", "start of the range, RFC 3339 (instead of --last)")
	f.StringVar(&to, "to", "", "end of the range, RFC 3339 (default now)")
	f.IntVar(&limit, "limit", 20, "rows of top_denied_keys; keys per rule of shadow_would_block")
	f.StringVar(&apiKey, "api-key", "", "the API key whose requests key_usage reports (required there)")
	return cmd
}
