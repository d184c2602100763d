package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/pipeline"
	"github.com/sluice-rl/sluice/pipeline/gcounter"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

func applyCmd() *cobra.Command {
	var (
		o          pipeline.ApplierOptions
		rf         redisFlags
		metrics    string
		quotaTopic string
	)
	cmd := &cobra.Command{
		Use:   "apply --brokers HOST:PORT --region NAME --redis HOST:PORT",
		Short: "Apply the pipeline's output topic to one region's Redis: every dynamic rule, and the region's shares",
		Long: `Apply reads the output topic that sluice pipeline publishes to (--output kafka)
as consumer group sluice-apply-NAME, and writes every dynamic rule and the
shares of region NAME into the region's Redis, where its enforcers pick them
up. Run one (or a standby) per region, beside its Redis: a region whose Redis
is down holds back only its own applier, which retries and catches up.

It also merges the other regions' G-Counter counts from --quota-topic (which
the regions' sluice serve publish to) into the region's Redis, by element-wise
maximum, as consumer group sluice-quotas-NAME.

Offsets are committed after Redis took the records. While the region's
dynamic-rule kill switch is on (sluice rules kill), rules are skipped and
counted. Metrics are served on --metrics at /metrics (sluice_apply_*), with
/healthz (the process serves) and /readyz (503 while the region's Redis does
not answer PING).
SIGTERM or SIGINT commits what is applied and leaves the group.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(o.Brokers) == 0 {
				return errors.New("--brokers is required: the Kafka brokers sluice pipeline publishes to")
			}
			if o.Region == "" {
				return errors.New("--region is required: the name of this region, as sluice pipeline --region names it")
			}
			if !rules.ValidID(o.Region) {
				return fmt.Errorf("--region %q: want 1-64 letters, digits, '-', '_' and '.'", o.Region)
			}
			t, err := rf.resolve(cmd.Flags())
			if err != nil {
				return err
			}
			if len(t.Addrs) == 0 {
				return errors.New("--redis is required: the region's Redis, HOST:PORT")
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			reg := prometheus.NewRegistry()
			reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
			rdb := redis.NewUniversalClient(t.universal(&redis.UniversalOptions{DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second}))
			defer rdb.Close()
			o.Store, o.Logger, o.Registerer = store.NewStore(rdb), log, reg

			ctx := cmd.Context()
			ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err = pipeline.EnsureOutputTopic(ectx, o.Brokers, o.Topic)
			cancel()
			if err != nil {
				return fmt.Errorf("apply: the output topic on --brokers %s: %w", strings.Join(o.Brokers, ","), err)
			}
			a, err := pipeline.NewApplier(o)
			if err != nil {
				return err
			}
			var qa *gcounter.QuotaApplier
			if quotaTopic != "" && !validTopic(quotaTopic) {
				return fmt.Errorf("--quota-topic %q: want 1-249 of a-z A-Z 0-9 '.' '_' '-'", quotaTopic)
			}
			if quotaTopic != "" {
				ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
				err := gcounter.EnsureQuotaTopic(ectx, o.Brokers, quotaTopic, 0)
				cancel()
				if err == nil {
					qa, err = gcounter.NewQuotaApplier(gcounter.QuotaApplierOptions{Brokers: o.Brokers, Region: o.Region, Redis: rdb, Merge: enforcer.MergeQuotaCounts,
						Topic: quotaTopic, Logger: log, Registerer: reg})
				}
				if err != nil {
					a.Close()
					return err
				}
			}
			addr, serve, stop, err := serveMetrics(reg, metrics, pingAll(map[string]redis.UniversalClient{o.Region: rdb}))
			if err != nil {
				a.Close()
				if qa != nil {
					qa.Close()
				}
				return err
			}
			log.Info("applier running", "brokers", o.Brokers, "topic", o.Topic, "region", o.Region, "redis", t.describe(), "metrics", addr)
			g := newRunGroup(ctx)
			g.addStop("metrics server", serve, stop)
			g.add("applier", a.Run)
			if qa != nil {
				g.add("quota applier", qa.Run)
			}
			err = g.wait()
			if qa != nil && !closeWithin(qa.Close, 15*time.Second) {
				log.Warn("quota applier stopped without leaving its group within 15 s")
			}
			if closeWithin(a.Close, 15*time.Second) {
				log.Info("applier stopped")
			} else {
				log.Warn("applier stopped without leaving its group within 15 s: Kafka did not answer; the group expires this member after its session timeout")
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.Brokers, "brokers", nil, "Kafka brokers (required)")
	f.StringVar(&o.Region, "region", "", "this region's name, as sluice pipeline --region gives it (required)")
	rf.add(f, "the region's Redis (required)", anyTopology)
	f.StringVar(&o.Topic, "topic", pipeline.DefaultOutputTopic, "the output topic sluice pipeline publishes to")
	f.StringVar(&quotaTopic, "quota-topic", gcounter.DefaultQuotaTopic, "the topic the regions' G-Counter counts are exchanged on (empty: none)")
	f.StringVar(&o.Group, "group", "", "consumer group (default sluice-apply-REGION): one per region")
	f.StringVar(&metrics, "metrics", "127.0.0.1:9466", "address for /metrics, /healthz and /readyz (empty: none)")
	return cmd
}

// pingAll returns a readiness check for serveMetrics: every client answers
// PING within a second.
func pingAll(clients map[string]redis.UniversalClient) func(context.Context) error {
	return func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		for name, c := range clients {
			if err := c.Ping(ctx).Err(); err != nil {
				return fmt.Errorf("redis %s: %w", name, err)
			}
		}
		return nil
	}
}

// serveMetrics listens on addr for reg at /metrics, /healthz (200 while the
// process serves) and /readyz (200 when ready answers nil, else 503 with its
// error); with addr empty it listens nowhere and serve blocks until stop.
// It returns the address it listens on, serve (which serves until stop is
// called, then returns http.ErrServerClosed) and stop, for runGroup.addStop.
func serveMetrics(reg *prometheus.Registry, addr string, ready func(context.Context) error) (bound string, serve func() error, stop func(), err error) {
	if addr == "" {
		done := make(chan struct{})
		return "", func() error { <-done; return http.ErrServerClosed }, func() { close(done) }, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, nil, fmt.Errorf("--metrics %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := ready(r.Context()); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	return ln.Addr().String(), func() error { return srv.Serve(ln) }, func() { srv.Close() }, nil
}

// closeWithin runs closeFn and reports whether it returned within d:
// closing leaves a consumer group, which waits for a broker that may not
// answer.
func closeWithin(closeFn func(), d time.Duration) bool {
	closed := make(chan struct{})
	go func() { closeFn(); close(closed) }()
	select {
	case <-closed:
		return true
	case <-time.After(d):
		return false
	}
}
