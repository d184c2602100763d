package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/pipeline"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

// `sluice pipeline` against Kafka (kfake over TCP) and a redis-server: a
// scraper among ordinary clients becomes a shadow dynamic rule in the
// region's Redis, written directly (--output redis) or published and applied
// by `sluice apply` (--output kafka), and the metrics show the records taken
// in.
func TestPipelineCommand(t *testing.T) {
	for _, output := range []string{"redis", "kafka"} {
		t.Run(output, func(t *testing.T) { testPipelineCommand(t, output) })
	}
}

// runCommand runs the sluice command args until the test ends, and waits
// for its log to say it stopped with stopped.
func runCommand(t *testing.T, args []string, stopped string) *syncBuffer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	log := new(syncBuffer)
	root := newRoot()
	root.SetArgs(args)
	root.SetErr(log)
	root.SetOut(io.Discard)
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: %v", args[0], err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("%s did not stop within 20 s of its context's end", args[0])
		}
		if !strings.Contains(log.String(), stopped) {
			t.Errorf("no clean stop of %s in the log:\n%s", args[0], log)
		}
	})
	return log
}

func testPipelineCommand(t *testing.T, output string) {
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, pipeline.DefaultTopic))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	brokers := kc.ListenAddrs()
	addr := redistest.Addr(t)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	if err := rdb.FlushDB(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	region := "eu=" + addr
	if output == "kafka" {
		region = "eu"
		runCommand(t, []string{"apply", "--brokers", brokers[0], "--region", "eu", "--redis", addr, "--metrics", ""}, "applier stopped")
	}
	log := runCommand(t, []string{"pipeline", "--brokers", brokers[0], "--output", output, "--region", region, "--metrics", "127.0.0.1:0", "--lateness", "1s"}, "pipeline stopped")
	var metricsAddr string
	deadline := time.Now().Add(10 * time.Second)
	for metricsAddr == "" && time.Now().Before(deadline) {
		if m := regexp.MustCompile(`metrics=(127\.0\.0\.1:\d+)`).FindStringSubmatch(log.String()); m != nil {
			metricsAddr = m[1]
		}
		time.Sleep(10 * time.Millisecond)
	}
	if metricsAddr == "" {
		t.Fatalf("pipeline did not start:\n%s", log)
	}

	// Four minutes: 100 clients at 2 requests a minute, and a scraper at
	// 900 in the fourth.
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(pipeline.DefaultTopic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	t0 := time.Now().Add(-10 * time.Minute).Truncate(time.Minute)
	var recs []*kgo.Record
	add := func(ip string, at time.Duration) {
		b, err := proto.Marshal(&decisionpb.Decision{Version: 1, EventTimeMs: t0.Add(at).UnixMilli(), Region: "eu",
			Outcome: decisionpb.Outcome_OUTCOME_ALLOWED, Descriptors: &decisionpb.Descriptors{ClientIp: ip}})
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, &kgo.Record{Key: []byte(ip), Value: b, Timestamp: t0.Add(at)}) // sorting key; cleared before producing
	}
	for m := range 4 {
		for c := range 100 {
			for i := range 2 {
				add(fmt.Sprintf("192.0.2.%d", c), time.Duration(m)*time.Minute+time.Duration(c*500+i*20000)*time.Millisecond)
			}
		}
		if m == 3 {
			for i := range 900 {
				add("198.51.100.7", time.Duration(m)*time.Minute+time.Duration(i)*50*time.Millisecond)
			}
		}
	}
	// In event-time order, as a live stream comes.
	slices.SortStableFunc(recs, func(a, b *kgo.Record) int { return a.Timestamp.Compare(b.Timestamp) })
	for _, r := range recs {
		r.Timestamp = time.Time{}
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if _, err := pipeline.Punctuate(ctx, brokers, pipeline.DefaultTopic, t0.Add(5*time.Minute)); err != nil {
		t.Fatal(err)
	}

	st := store.NewStore(rdb)
	var dyn []*rules.DynamicRule
	for deadline := time.Now().Add(30 * time.Second); len(dyn) == 0; {
		if time.Now().After(deadline) {
			r, _ := http.Get("http://" + metricsAddr + "/metrics")
			b, _ := io.ReadAll(r.Body)
			t.Fatalf("no dynamic rule in Redis within 30 s:\n%s\n%s", log, regexp.MustCompile(`(?m)^sluice.*$`).FindAllString(string(b), -1))
		}
		time.Sleep(50 * time.Millisecond)
		if dyn, err = st.Dynamic(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if len(dyn) != 1 || dyn[0].Match[0].Value != "198.51.100.7" || dyn[0].Mode != rules.Shadow {
		t.Fatalf("dynamic rules %+v: want one shadow rule on the scraper", dyn)
	}
	r, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	want := fmt.Sprintf(`sluice_pipeline_records_in_total{stage="fetch"} %d`, len(recs)+4)
	if !strings.Contains(string(b), want) || !strings.Contains(string(b), `sluice_pipeline_records_in_total{stage="heavy-hitters"}`) {
		t.Fatalf("metrics lack %q:\n%s", want, b)
	}
}

func TestPipelineFlags(t *testing.T) {
	for args, want := range map[string]string{
		"":                                     "--brokers is required",
		"--brokers 127.0.0.1:1":                "--region is required: name each region, e.g. --region us-east",
		"--brokers 127.0.0.1:1 --output redis": "--region is required: name each region's Redis",
		"--brokers 127.0.0.1:1 --output file --region eu":                                                         `--output "file": want kafka`,
		"--brokers 127.0.0.1:1 --output redis --region eu":                                                        `--region "eu": want NAME=REDIS_ADDR`,
		"--brokers 127.0.0.1:1 --region eu=x":                                                                     `--region "eu=x": with --output kafka the pipeline writes to no Redis: name the region only (--region eu) and run sluice apply --region eu --redis x`,
		"--brokers 127.0.0.1:1 --region e/u":                                                                      `--region "e/u": want a NAME`,
		"--brokers 127.0.0.1:1 --region eu --region eu":                                                           "--region eu is given twice",
		"--brokers 127.0.0.1:1 --output redis --region eu=x --region eu=y":                                        "--region eu is given twice",
		"--brokers 127.0.0.1:1 --region eu --role all":                                                            `--role "all"`,
		"--brokers 127.0.0.1:1 --region eu --partitions -3":                                                       "--partitions -3",
		"--brokers 127.0.0.1:1 --region eu --share-interval -1s":                                                  "--share-interval -1s",
		"--brokers 127.0.0.1:1 --region eu --detector-window 0":                                                   "--detector-window 0s",
		"--brokers 127.0.0.1:1 --region eu --share-default-split eu":                                              `--share-default-split "eu": want REGION=FRACTION`,
		"--brokers 127.0.0.1:1 --region eu --share-default-split eu=x":                                            `--share-default-split "eu=x": want REGION=FRACTION`,
		"--brokers 127.0.0.1:1 --region eu --share-default-split us=0.5":                                          `the default split names region "us"`,
		"--brokers 127.0.0.1:1 --region eu --region us --share-default-split eu=0.6 --share-default-split us=0.6": "the default split sums to 1.2000",
		"--brokers 127.0.0.1:1 --region eu --share-default-split eu=1 --share-default-split eu=1":                 "names region eu twice",
		"--brokers 127.0.0.1:1 --region eu --region us --share-floor 0.5":                                         "every region keeps a floor share of 0.500",
		"--brokers 127.0.0.1:1 --region eu --idle-timeout 0":                                                      "--idle-timeout 0s",
		"--brokers 127.0.0.1:1 --region eu --topic sluice-pipeline.partials":                                      `topic "sluice-pipeline.partials" is given two roles`,
		"--brokers 127.0.0.1:1 --region eu --output-topic sluice-pipeline.partials":                               `topic "sluice-pipeline.partials" is given two roles`,
	} {
		root := newRoot()
		root.SetArgs(append([]string{"pipeline"}, strings.Fields(args)...))
		root.SetErr(io.Discard)
		root.SetOut(io.Discard)
		if err := root.Execute(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", args, err, want)
		}
	}
}

func TestApplyFlags(t *testing.T) {
	for args, want := range map[string]string{
		"":                                   "--brokers is required",
		"--brokers 127.0.0.1:1":              "--region is required",
		"--brokers 127.0.0.1:1 --region e/u": `--region "e/u": want 1-64 letters`,
		"--brokers 127.0.0.1:1 --region eu":  "--redis is required",
		"--brokers 127.0.0.1:1 --region eu --redis localhost":   `--redis "localhost": want HOST:PORT`,
		"--brokers 127.0.0.1:1 --region eu --redis x:1 extra":   `unknown command "extra"`,
		"--brokers 127.0.0.1:1 --region eu --redis x:1 --bogus": "unknown flag: --bogus",
	} {
		root := newRoot()
		root.SetArgs(append([]string{"apply"}, strings.Fields(args)...))
		root.SetErr(io.Discard)
		root.SetOut(io.Discard)
		if err := root.Execute(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", args, err, want)
		}
	}
}

// /healthz answers while the process serves; /readyz only while every
// Redis it writes to answers.
func TestReadyzFollowsRedis(t *testing.T) {
	live := redis.NewClient(&redis.Options{Addr: redistest.Addr(t)})
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { live.Close(); dead.Close() })
	for _, tc := range []struct {
		clients map[string]*redis.Client
		ready   int
	}{
		{map[string]*redis.Client{"eu": live}, http.StatusOK},
		{map[string]*redis.Client{"eu": live, "us": dead}, http.StatusServiceUnavailable},
	} {
		addr, serve, stop, err := serveMetrics(prometheus.NewRegistry(), "127.0.0.1:0", pingAll(tc.clients))
		if err != nil {
			t.Fatal(err)
		}
		served := make(chan error, 1)
		go func() { served <- serve() }()
		for path, want := range map[string]int{"/healthz": http.StatusOK, "/readyz": tc.ready} {
			resp, err := http.Get("http://" + addr + path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != want {
				t.Errorf("%d clients, %s: %d %q, want %d", len(tc.clients), path, resp.StatusCode, body, want)
			}
		}
		stop()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve after stop: %v, want http.ErrServerClosed", err)
		}
	}
}
