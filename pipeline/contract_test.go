package pipeline

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/pipeline/stage"
)

// The record contract, proven with an independent Kafka client: decision
// records written by segmentio/kafka-go (protobuf from decision.proto, keyed
// by entity, a punctuation header at the end) are consumed by the pipeline
// and counted exactly; a record that is not a decision goes to the
// dead-letter topic with its error and original partition and offset, which
// segmentio/kafka-go reads back; and consumption goes on past it.
func TestContractWithSegmentioKafkaGo(t *testing.T) {
	brokers := newKafka(t)
	w := &kafkago.Writer{Addr: kafkago.TCP(brokers...), Topic: DefaultTopic, Balancer: &kafkago.Hash{}, BatchTimeout: time.Millisecond, RequiredAcks: kafkago.RequireAll}
	defer w.Close()

	const n = 500
	var msgs []kafkago.Message
	perWindow := map[int64]int{}
	for i := range n {
		et := t0.Add(time.Duration(i) * 100 * time.Millisecond)
		ip := fmt.Sprintf("203.0.113.%d", i%50)
		b, err := proto.Marshal(&decisionpb.Decision{Version: 1, EventTimeMs: et.UnixMilli(), Region: "eu", Outcome: decisionpb.Outcome_OUTCOME_DENIED,
			Descriptors: &decisionpb.Descriptors{ClientIp: ip}, MatchedRules: []string{"per-ip"}})
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, kafkago.Message{Key: []byte("client_ip=" + ip), Value: b, Time: et})
		perWindow[stage.FloorDiv(et.UnixMilli(), 5000)]++
	}
	bad := kafkago.Message{Key: []byte("client_ip=203.0.113.7"), Value: []byte("not a decision record"), Time: t0}
	msgs = append(msgs[:250:250], append([]kafkago.Message{bad}, msgs[250:]...)...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	// The end of input: a punctuation on every partition.
	end := strconv.FormatInt(t0.Add(time.Hour).UnixMilli(), 10)
	pw := &kafkago.Writer{Addr: kafkago.TCP(brokers...), Topic: DefaultTopic, Balancer: &kafkago.RoundRobin{}, BatchTimeout: time.Millisecond, RequiredAcks: kafkago.RequireAll}
	defer pw.Close()
	var puncts []kafkago.Message
	for range testPartitions {
		puncts = append(puncts, kafkago.Message{Headers: []kafkago.Header{{Key: stage.PunctuationHeader, Value: []byte(end)}}})
	}
	if err := pw.WriteMessages(ctx, puncts...); err != nil {
		t.Fatal(err)
	}

	mw := &memWriter{}
	o := testOptions(brokers, mw)
	mg := startMerger(t, o)
	c := startConsumer(t, o)
	want := wantWindows(perWindow)
	waitFor(t, "every window", 30*time.Second, func() bool { return mw.count() >= want })
	if s := c.c.Stats(); s.Consumed != n+1+testPartitions || s.BadRecord != 1 || s.Late != 0 {
		t.Fatalf("consumer %+v: want %d decisions, 1 bad record and %d punctuations", s, n, testPartitions)
	}
	total := 0
	for _, l := range mw.lines() {
		if !strings.HasPrefix(l, "short@") {
			continue
		}
		var got int
		i := strings.Index(l, "n=")
		fmt.Sscanf(l[i:], "n=%d", &got)
		total += got
	}
	if total != n || mg.m.Stats().Windows != int64(want) {
		t.Fatalf("5 s windows counted %d records, %d windows in all; want %d in %d", total, mg.m.Stats().Windows, n, want)
	}

	r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: brokers, Topic: DefaultTopic + ".dead-letter", Partition: 0, MaxWait: 50 * time.Millisecond})
	defer r.Close()
	dl, err := r.ReadMessage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h := map[string]string{}
	for _, x := range dl.Headers {
		h[x.Key] = string(x.Value)
	}
	if string(dl.Value) != "not a decision record" || !strings.Contains(h["sluice-error"], "bad decision record") ||
		h["sluice-topic"] != DefaultTopic || h["sluice-partition"] == "" || h["sluice-offset"] == "" {
		t.Fatalf("dead letter %q with headers %v", dl.Value, h)
	}
	// The offset in the header is the bad record's own.
	p, _ := strconv.Atoi(h["sluice-partition"])
	off, _ := strconv.ParseInt(h["sluice-offset"], 10, 64)
	orig := kafkago.NewReader(kafkago.ReaderConfig{Brokers: brokers, Topic: DefaultTopic, Partition: p, MaxWait: 50 * time.Millisecond})
	defer orig.Close()
	if err := orig.SetOffset(off); err != nil {
		t.Fatal(err)
	}
	m, err := orig.ReadMessage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Value) != "not a decision record" {
		t.Fatalf("partition %d offset %d holds %q, not the bad record", p, off, m.Value)
	}
}
