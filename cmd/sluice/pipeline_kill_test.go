package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/syncbuf"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/pipeline"
	"github.com/sluice-rl/sluice/rules/store"
)

// TestPipelineKilledMidStream: `sluice pipeline` (a process of its own)
// SIGKILLed three times at random points while the decision stream comes
// in, each time restarted under the same --instance, ends with the same
// dynamic rules and shares in both regions' Redis as a run that was never
// interrupted; and each restart reads on from its partitions' committed
// positions (open-window states, --state-interval), not from the topic's
// start, which the detector's hour-long windows made it do before. Kafka
// (kfake, over TCP) runs in the test, outside the killed process, and
// keeps the groups' offsets and the checkpoint topic across the kills.
func TestPipelineKilledMidStream(t *testing.T) {
	t.Parallel() // its own kfake, redis-servers and processes; it mostly waits on them
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, pipeline.DefaultTopic))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	broker := kc.ListenAddrs()[0]
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rulesFile, []byte("domain: d\nrules:\n  - {id: g, match: [{key: client_ip}], limit: 6000, period: 1m, global: true}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 38))
	t0 := time.Now().Add(-10 * time.Minute).Truncate(time.Minute)
	recs := killScenario(t, t0)
	args := func(group, eu, us string) []string {
		return []string{"pipeline", "--brokers", broker, "--output", "redis", "--region", "eu=" + eu, "--region", "us=" + us,
			"--rules", rulesFile, "--group", group, "--metrics", "127.0.0.1:0", "--lateness", "1s", "--idle-timeout", "10m",
			"--state-interval", "100ms"}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.DefaultProduceTopic(pipeline.DefaultTopic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()

	// The interrupted run: the stream in 8 slices, the process killed while
	// it processes 3 of them, at a random moment; between slices it catches
	// up and commits (every second).
	crashEU, crashUS := redistest.Addr(t), redistest.Addr(t)
	kills := map[int]bool{}
	for len(kills) < 3 {
		kills[1+r.IntN(6)] = true
	}
	p := startPipeline(t, args("crash", crashEU, crashUS))
	produced, restarted := 0, false
	produce := func(to int) {
		if err := cl.ProduceSync(ctx, recs[produced:to]...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		produced = to
	}
	for i := range 8 {
		produce((i + 1) * len(recs) / 8)
		p.caughtUp(t)
		if restarted {
			// The restart has read on from the committed positions: the
			// slice it was killed in (from its last commit) and this one.
			decoded := p.metric(t, `sluice_pipeline_records_in_total{stage="decode"}`)
			t.Logf("restarted, then slice %d: it decoded %d of the %d records produced", i, decoded, produced)
			if decoded >= produced {
				t.Errorf("the restart decoded %d records, all %d produced: it read again from the start rather than from its committed positions", decoded, produced)
			}
			restarted = false
		}
		if kills[i] {
			// Killed while the first records of the next slice come in.
			produce(produced + r.IntN(20))
		}
		time.Sleep(time.Duration(r.IntN(1500)) * time.Millisecond) // a commit, or not
		if kills[i] {
			p.kill(t)
			p, restarted = startPipeline(t, args("crash", crashEU, crashUS)), true
		}
	}
	if _, err := pipeline.Punctuate(ctx, []string{broker}, pipeline.DefaultTopic, t0.Add(5*time.Minute)); err != nil {
		t.Fatal(err)
	}
	p.settle(t)
	crash := killOutputs(t, crashEU, crashUS)
	if p.metric(t, "sluice_pipeline_partition_states_total") == 0 {
		t.Errorf("the last process wrote no open-window state")
	}

	// The same stream read by one process that nothing interrupts.
	refEU, refUS := redistest.Addr(t), redistest.Addr(t)
	ref := startPipeline(t, args("reference", refEU, refUS))
	ref.settle(t)
	want := killOutputs(t, refEU, refUS)
	if !strings.Contains(want, "198.51.100.7") || !strings.Contains(want, `"region":"us"`) {
		t.Fatalf("the uninterrupted run wrote no rule on the scraper or no share for us:\n%s", want)
	}
	if crash != want {
		t.Errorf("after three kills and restarts the regions hold\n%s\nwithout them\n%s", crash, want)
	}
}

// killScenario is four minutes of decisions from two regions: 100 clients
// at 2 requests a minute, and a scraper at 900 in the fourth minute, all
// matching the global rule g; in event-time order, as a live stream comes.
func killScenario(t *testing.T, t0 time.Time) []*kgo.Record {
	t.Helper()
	type ev struct {
		ip     string
		at     time.Duration
		region string
	}
	var evs []ev
	for m := range 4 {
		for c := range 100 {
			for i := range 2 {
				evs = append(evs, ev{fmt.Sprintf("192.0.2.%d", c), time.Duration(m)*time.Minute + time.Duration(c*500+i*20000)*time.Millisecond, []string{"eu", "us"}[c%2]})
			}
		}
	}
	for i := range 900 {
		evs = append(evs, ev{"198.51.100.7", 3*time.Minute + time.Duration(i)*50*time.Millisecond, "eu"})
	}
	slices.SortStableFunc(evs, func(a, b ev) int { return int(a.at - b.at) })
	var recs []*kgo.Record
	for _, e := range evs {
		b, err := proto.Marshal(&decisionpb.Decision{Version: 1, EventTimeMs: t0.Add(e.at).UnixMilli(), Region: e.region,
			Outcome: decisionpb.Outcome_OUTCOME_ALLOWED, MatchedRules: []string{"g"}, Descriptors: &decisionpb.Descriptors{ClientIp: e.ip}})
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, &kgo.Record{Key: []byte(e.ip), Value: b})
	}
	return recs
}

// killOutputs is what the pipeline wrote to the regions' Redis, named by
// their order: the dynamic rules (without the writer's wall-clock creation
// time) and the shares, sorted.
func killOutputs(t *testing.T, addrs ...string) string {
	t.Helper()
	var out []string
	for i, a := range addrs {
		rdb := redis.NewClient(&redis.Options{Addr: a})
		dyn, err := store.NewStore(rdb).Dynamic(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range dyn {
			b, _ := json.Marshal(d.Rule)
			out = append(out, fmt.Sprintf("region%d rule %s", i, b))
		}
		shares, err := rdb.HGetAll(context.Background(), store.SharesKey).Result()
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range shares {
			out = append(out, fmt.Sprintf("region%d share %s %s", i, k, v))
		}
		rdb.Close()
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

// pipelineProc is a `sluice pipeline` process: this test binary run as
// main.
type pipelineProc struct {
	cmd     *exec.Cmd
	log     *syncbuf.Buffer
	metrics string
}

var pipelineMetricsAddr = regexp.MustCompile(`metrics=(127\.0\.0\.1:\d+)`)

// startPipeline starts `sluice pipeline args...` as a static member
// (--instance crash) and waits for its metrics address; the test's cleanup
// stops it.
func startPipeline(t *testing.T, args []string) *pipelineProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], append(args, "--instance", "p")...)
	cmd.Env = append(os.Environ(), "SLUICE_TEST_AS_MAIN=1", "OTEL_SDK_DISABLED=true")
	p := &pipelineProc{cmd: cmd, log: new(syncbuf.Buffer)}
	cmd.Stderr, cmd.Stdout = p.log, io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	for deadline := time.Now().Add(30 * time.Second); p.metrics == ""; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("sluice pipeline did not start within 30 s:\n%s", p.log)
		}
		if m := pipelineMetricsAddr.FindStringSubmatch(p.log.String()); m != nil {
			p.metrics = m[1]
		}
	}
	return p
}

// kill sends SIGKILL and waits for the process to end.
func (p *pipelineProc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Wait()
}

// metric returns the value of the series named by line's start, 0 when it
// is not there yet.
func (p *pipelineProc) metric(t *testing.T, series string) int {
	t.Helper()
	resp, err := http.Get("http://" + p.metrics + "/metrics")
	if err != nil {
		t.Fatalf("metrics: %v\n%s", err, p.log)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return int(f)
		}
	}
	return 0
}

// caughtUp waits until the process owns the topic's 4 partitions, has
// fetched, and has processed every record it fetched.
func (p *pipelineProc) caughtUp(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the pipeline did not catch up within 60 s:\n%s", p.log)
		}
		if p.metric(t, "sluice_pipeline_partitions_owned") == 4 && p.metric(t, `sluice_pipeline_records_in_total{stage="fetch"}`) > 0 &&
			p.metric(t, `sluice_pipeline_consumer_lag_records{tier="partition"}`) == 0 {
			return
		}
	}
}

// settle waits until both tiers have no record left to process and the
// outputs written have not changed for a second.
func (p *pipelineProc) settle(t *testing.T) {
	t.Helper()
	last, since := -1, time.Now()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the pipeline did not settle within 60 s:\n%s", p.log)
		}
		lag := p.metric(t, `sluice_pipeline_consumer_lag_records{tier="partition"}`) + p.metric(t, `sluice_pipeline_consumer_lag_records{tier="merge"}`)
		out := p.metric(t, "sluice_pipeline_outputs_total")
		if lag != 0 || out == 0 || out != last {
			last, since = out, time.Now()
			continue
		}
		if time.Since(since) >= time.Second {
			return
		}
	}
}
