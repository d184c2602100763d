package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/sluice-rl/sluice/aggregator"
	"github.com/sluice-rl/sluice/detector"
	"github.com/sluice-rl/sluice/pipeline"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

func pipelineCmd() *cobra.Command {
	var (
		brokers    []string
		regionArgs []string
		rulesPath  string
		role       string
		output     string
		metrics    string
		partitions int32
		o          pipeline.Options
		hh         detector.HeavyHitterOptions
		ag         aggregator.Options
		splitArgs  []string
		det        detectorFlags
		rf         redisFlags
		alerts     crowdsecAlertFlags
	)
	cmd := &cobra.Command{
		Use:   "pipeline --brokers HOST:PORT --region NAME...",
		Short: "Run the slow loop against Kafka: the detector, the aggregator and the shadow tally, publishing rules and shares for every region",
		Long: `Pipeline consumes the decision topic as Kafka consumer groups and produces
dynamic rules (for every region) and shares (for their region). Run as many as
there are partitions to share; one of them merges (docs/pipeline.md).

--output kafka (the default) publishes them to the output topic (--output-topic,
sluice.output), and sluice apply, one per region, writes them into that
region's Redis: a region whose Redis is down holds back only itself. Name the
regions only: --region us-east --region eu-west. --output redis writes them
into each region's Redis directly, --region NAME=REDIS_ADDR: simpler, with no
applier to run, but one region's Redis being down holds back every region.

--role partition runs only the consumer group that keeps per-partition window
state, --role merge only the merge tier, both (the default) runs the two.
Metrics are served on --metrics at /metrics. SIGTERM or SIGINT commits what is
done and leaves the groups.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(brokers) == 0 {
				return errors.New("--brokers is required: the Kafka brokers the enforcers log decisions to")
			}
			if output != "kafka" && output != "redis" {
				return fmt.Errorf("--output %q: want kafka (publish to the output topic, applied by sluice apply) or redis (write to every region's Redis)", output)
			}
			if len(regionArgs) == 0 {
				if output == "redis" {
					return errors.New("--region is required: name each region's Redis, e.g. --region us-east=10.0.0.5:6379")
				}
				return errors.New("--region is required: name each region, e.g. --region us-east --region eu-west")
			}
			if role != "both" && role != "partition" && role != "merge" {
				return fmt.Errorf("--role %q: want both, partition or merge", role)
			}
			for name, d := range map[string]time.Duration{"--lateness": o.Lateness, "--idle-timeout": o.IdleTimeout, "--detector-window": hh.Window, "--share-interval": ag.Interval} {
				if d <= 0 {
					return fmt.Errorf("%s %v: want a positive duration", name, d)
				}
			}
			if partitions < 0 {
				return fmt.Errorf("--partitions %d: want 0 (leave the topic to the operator) or more", partitions)
			}
			rt, err := rf.resolve(cmd.Flags())
			if err != nil {
				return err
			}
			stores := map[string]*store.Store{}
			clients := map[string]redis.UniversalClient{}
			var regions []string
			seen := map[string]bool{}
			for _, a := range regionArgs {
				name, _, _ := strings.Cut(a, "=")
				if seen[name] {
					return fmt.Errorf("--region %s is given twice", name)
				}
				seen[name] = true
			}
			for _, a := range regionArgs {
				name, addr, ok := strings.Cut(a, "=")
				if ok {
					a = name + "=" + redactURL(addr) // never echo a password
				}
				if output == "kafka" {
					if ok {
						return fmt.Errorf("--region %q: with --output kafka the pipeline writes to no Redis: name the region only (--region %s) and run sluice apply --region %s --redis %s beside it, or pass --output redis", a, name, name, redactURL(addr))
					}
					if !rules.ValidID(name) {
						return fmt.Errorf("--region %q: want a NAME of letters, digits, '-', '_' and '.'", a)
					}
					regions = append(regions, name)
					continue
				}
				if !ok || addr == "" || !rules.ValidID(name) {
					return fmt.Errorf("--region %q: want NAME=REDIS_ADDR (--output redis), with NAME of letters, digits, '-', '_' and '.'", a)
				}
				addr, db, auth, err := nodeAddr("--region "+name+"=", addr, rt.Auth)
				if err != nil {
					return err
				}
				rdb := redis.NewClient(auth.options(&redis.Options{Addr: addr, DB: db, DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second}))
				defer rdb.Close()
				// The pipeline's rules are live: their expiries are checked
				// against the wall clock.
				stores[name] = store.NewStore(rdb, store.StoreClock(time.Now))
				clients[name] = rdb
				regions = append(regions, name)
			}
			slices.Sort(regions)
			set := &rules.Set{}
			if rulesPath != "" {
				s, err := rules.Load(rulesPath)
				if err != nil {
					return err
				}
				set = s
			}
			ag.Regions, ag.Rules = regions, set.Rules
			for _, a := range splitArgs {
				name, v, ok := strings.Cut(a, "=")
				f, err := strconv.ParseFloat(v, 64)
				if !ok || err != nil {
					return fmt.Errorf("--share-default-split %q: want REGION=FRACTION, e.g. us-east=0.6", a)
				}
				if ag.DefaultSplit == nil {
					ag.DefaultSplit = map[string]float64{}
				}
				if _, dup := ag.DefaultSplit[name]; dup {
					return fmt.Errorf("--share-default-split names region %s twice", name)
				}
				ag.DefaultSplit[name] = f
			}
			shares, err := aggregator.New(ag)
			if err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			reg := prometheus.NewRegistry()
			reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
			o.Brokers, o.Logger, o.Registerer = brokers, log, reg
			tr, err := openTracing(cmd.Context(), log)
			if err != nil {
				return err
			}
			defer tr.Close(log)
			o.Tracer = tr.Tracer("github.com/sluice-rl/sluice/pipeline")
			if output == "kafka" {
				tw, err := pipeline.NewTopicWriter(pipeline.TopicWriterOptions{Brokers: brokers, Topic: o.OutputTopic, Logger: log})
				if err != nil {
					return err
				}
				defer tw.Close()
				o.Writer = tw
			} else {
				o.Writer = pipeline.NewRegionWriter(stores)
			}
			stopAlerts, err := alerts.start(&o.Writer, log, reg)
			if err != nil {
				return err
			}
			defer stopAlerts()
			do, err := det.options(detector.Options{HeavyHitters: hh}, log)
			if err != nil {
				return err
			}
			signals, err := detector.Signals(do)
			if err != nil {
				return err
			}
			o.Stages = append(signals, shares, detector.NewShadowTally())

			ctx := cmd.Context()
			ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err = pipeline.EnsureTopics(ectx, o, partitions)
			cancel()
			if err != nil {
				return err
			}
			metricsAddr, serve, stop, err := serveMetrics(reg, metrics, pingAll(clients))
			if err != nil {
				return err
			}

			type runner interface {
				Run(context.Context) error
				Close()
			}
			var rs []runner
			var names []string
			if role != "merge" {
				c, err := pipeline.NewConsumer(o)
				if err != nil {
					return err
				}
				rs, names = append(rs, c), append(names, "partition tier")
			}
			if role != "partition" {
				m, err := pipeline.NewMerger(o)
				if err != nil {
					for _, r := range rs {
						r.Close()
					}
					return err
				}
				rs, names = append(rs, m), append(names, "merge tier")
			}
			log.Info("pipeline running", "brokers", brokers, "topic", o.Topic, "role", role, "regions", regions, "output", output, "metrics", metricsAddr)
			g := newRunGroup(ctx)
			g.addStop("metrics server", serve, stop)
			for i, r := range rs {
				g.add(names[i], r.Run)
			}
			err = g.wait()
			// Closing commits what is done and leaves the groups; a broker
			// that does not answer could hold the leave for ever, so the
			// process gives it 15 s (the group then expires the member).
			if closeWithin(func() {
				for _, r := range rs {
					r.Close()
				}
			}, 15*time.Second) {
				log.Info("pipeline stopped")
			} else {
				log.Warn("pipeline stopped without leaving its groups within 15 s: Kafka did not answer; the group expires this member after its session timeout")
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&brokers, "brokers", nil, "Kafka brokers (required)")
	f.StringArrayVar(&regionArgs, "region", nil, "a region: NAME with --output kafka, NAME=REDIS_HOST:PORT with --output redis (or NAME=redis://USER:PASSWORD@HOST:PORT, rediss:// for TLS, with credentials of its own); repeat for each region (required)")
	rf.addAuth(f) // the regions' Redis credentials and TLS, with --output redis
	f.StringVar(&output, "output", "kafka", "kafka (publish rules and shares to --output-topic for sluice apply) or redis (write them into every region's Redis)")
	f.StringVar(&o.OutputTopic, "output-topic", pipeline.DefaultOutputTopic, "the topic --output kafka publishes to")
	f.StringVar(&rulesPath, "rules", "", "rule file whose global rules the aggregator splits into per-region shares")
	f.StringVar(&role, "role", "both", "both, partition (per-partition window state) or merge (the merge tier)")
	f.StringVar(&metrics, "metrics", "127.0.0.1:9465", "address for /metrics, /healthz and /readyz (503 while a region's Redis does not answer; empty: none)")
	f.Int32Var(&partitions, "partitions", 0, "create the decision topic with this many partitions if it is missing (0: leave it to the operator)")
	f.StringVar(&o.Topic, "topic", pipeline.DefaultTopic, "decision topic")
	f.StringVar(&o.InstanceID, "instance", "", "a static member's name in both groups (Kafka's group.instance.id), unique per process, e.g. the pod's name: restarted under it within the session timeout (45 s), the process takes its partitions back at once; it does not leave the groups when it stops")
	f.DurationVar(&o.StateInterval, "state-interval", 10*time.Second, "how often, at most, a partition whose open windows reach back writes their state and commits the next record with it, so that a restart after a crash reads on from there (negative: never; a restart then reads again from the oldest open window's first record)")
	f.StringVar(&o.Group, "group", pipeline.DefaultGroup, "consumer group; the merge tier's is GROUP-merge, and its topics GROUP.partials and GROUP.checkpoints: one group per pipeline")
	f.DurationVar(&o.Lateness, "lateness", time.Second, "how far the watermark trails each partition's newest event time: shares are published this long after their interval ends")
	f.DurationVar(&o.IdleTimeout, "idle-timeout", 30*time.Second, "a partition with no record this long closes its windows and stops holding back the merge")
	det.add(f)
	alerts.add(f)
	f.DurationVar(&hh.Window, "detector-window", 10*time.Second, "the heavy-hitter detector's event-time window")
	f.Float64Var(&ag.Floor, "share-floor", 0.05, "the least share of a global limit every region keeps (below 1/regions)")
	f.StringArrayVar(&splitArgs, "share-default-split", nil, "REGION=FRACTION: the long tail's split of global limits from configuration (repeat per region; fractions sum to at most 1); unset, it follows the regions' traffic")
	f.DurationVar(&ag.Interval, "share-interval", 250*time.Millisecond, "the aggregator's interval: demand is measured and shares recomputed this often (docs/global-quotas.md)")
	return cmd
}
