package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// maxDecisionPartitions bounds the partitions EnsureTopics creates: the
// merge tier keeps a watermark per partition.
const maxDecisionPartitions = 4096

// maxPartialBytes bounds a record of the partials and checkpoint topics:
// the producer's batch limit and the topics' max.message.bytes.
const maxPartialBytes = 16 << 20

// EnsureTopics creates the topics the pipeline uses, if they do not exist:
// the decision topic with decisionPartitions partitions (0 leaves it to the
// producers or the operator) and message.timestamp.type=LogAppendTime (see
// Options.MaxFuture), and the partials, checkpoint and dead-letter topics
// with one partition each, the first two taking records of up to 16 MiB,
// and the output topic (see EnsureOutputTopic). It returns an error if the
// partials or checkpoint topic exists with more than one partition: the
// merge tier relies on one total order of partials.
func EnsureTopics(ctx context.Context, o Options, decisionPartitions int32) error {
	if err := o.defaults(); err != nil {
		return err
	}
	if decisionPartitions < 0 || decisionPartitions > maxDecisionPartitions {
		return fmt.Errorf("pipeline: %d partitions for %s: want 0 (leave the topic to the operator) to %d", decisionPartitions, o.Topic, maxDecisionPartitions)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(o.Brokers...))
	if err != nil {
		return fmt.Errorf("pipeline: kafka admin: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	big := strconv.Itoa(maxPartialBytes)
	logTime := "LogAppendTime"
	type spec struct {
		n    int32
		conf map[string]*string
	}
	want := map[string]spec{
		o.PartialsTopic:   {1, map[string]*string{"max.message.bytes": &big}},
		o.CheckpointTopic: {1, map[string]*string{"max.message.bytes": &big}},
		o.DeadLetterTopic: {1, nil},
		o.OutputTopic:     {1, outputTopicConfig()},
	}
	if decisionPartitions > 0 {
		want[o.Topic] = spec{decisionPartitions, map[string]*string{"message.timestamp.type": &logTime}}
	}
	for topic, sp := range want {
		resp, err := adm.CreateTopic(ctx, sp.n, -1, sp.conf, topic)
		if err == nil {
			err = resp.Err
		}
		if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("pipeline: creating topic %s: %w", topic, err)
		}
	}
	for _, topic := range []string{o.PartialsTopic, o.CheckpointTopic} {
		n, err := partitions(ctx, adm, topic)
		if err != nil {
			return err
		}
		if n != 1 {
			return fmt.Errorf("pipeline: topic %s has %d partitions; the merge tier needs exactly 1", topic, n)
		}
	}
	return nil
}

// DeleteTopics deletes the topics of one pipeline run: o's decision topic,
// its dead-letter topic, and the merge tier's partials and checkpoint topics
// (not the output topic, which outlives runs). Topics that do not exist are
// skipped. A replay on a shared cluster cleans up with it.
func DeleteTopics(ctx context.Context, o Options) error {
	if err := o.defaults(); err != nil {
		return err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(o.Brokers...))
	if err != nil {
		return fmt.Errorf("pipeline: kafka admin: %w", err)
	}
	defer cl.Close()
	resps, err := kadm.NewClient(cl).DeleteTopics(ctx, o.Topic, o.DeadLetterTopic, o.PartialsTopic, o.CheckpointTopic)
	if err != nil {
		return fmt.Errorf("pipeline: deleting topics: %w", err)
	}
	for _, r := range resps.Sorted() {
		if r.Err != nil && !errors.Is(r.Err, kerr.UnknownTopicOrPartition) {
			return fmt.Errorf("pipeline: deleting topic %s: %w", r.Topic, r.Err)
		}
	}
	return nil
}

// outputRetention is how long the output topic keeps a record that is not
// the newest of its key: a week. Nothing older matters: a dynamic rule lives
// at most rules.MaxDynamicTTL (a day) from its write, and the aggregator
// rewrites every live share at least every heartbeat (seconds).
const outputRetention = 7 * 24 * time.Hour

// outputTopicConfig is the output topic's: compacted by key, so that it
// keeps the newest rule or share of each key and an Applier of a new region
// reads the state in force rather than the whole history; and deleted after
// outputRetention, so that the keys of rules that expired long ago (a rule
// id per flagged scope) do not pile up for ever.
func outputTopicConfig() map[string]*string {
	policy, retention := "compact,delete", strconv.FormatInt(outputRetention.Milliseconds(), 10)
	return map[string]*string{"cleanup.policy": &policy, "retention.ms": &retention}
}

// EnsureOutputTopic creates the output topic (DefaultOutputTopic if topic is
// empty), if it does not exist, with one partition, cleanup.policy
// compact,delete and retention.ms of a week (see OutputRecord). One
// partition is enough and keeps one order: every region's Applier reads
// every record (rules go to every region), so partitions would add no
// parallelism within a region, and the output is a few records per window.
// An Applier also works over a topic with more partitions (each key stays in
// order on its partition).
func EnsureOutputTopic(ctx context.Context, brokers []string, topic string) error {
	if topic == "" {
		topic = DefaultOutputTopic
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return fmt.Errorf("pipeline: kafka admin: %w", err)
	}
	defer cl.Close()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, 1, -1, outputTopicConfig(), topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("pipeline: creating topic %s: %w", topic, err)
	}
	return nil
}

// partitions returns the number of partitions of topic.
func partitions(ctx context.Context, adm *kadm.Client, topic string) (int32, error) {
	td, err := adm.ListTopics(ctx, topic)
	if err != nil {
		return 0, fmt.Errorf("pipeline: listing topic %s: %w", topic, err)
	}
	d, ok := td[topic]
	if !ok || d.Err != nil {
		if ok {
			err = d.Err
		}
		return 0, fmt.Errorf("pipeline: topic %s: %w", topic, cmpErr(err, errors.New("not found")))
	}
	return int32(len(d.Partitions)), nil
}

func cmpErr(err, def error) error {
	if err != nil {
		return err
	}
	return def
}

// Punctuate writes a punctuation (see PunctuationHeader) for event time t to
// every partition of the decision topic: the windows that end at or before
// t close once the pipeline reads it. A replay calls it at the end of its
// input with a time past its last record plus the longest window. It
// returns the number of partitions punctuated.
func Punctuate(ctx context.Context, brokers []string, topic string, t time.Time) (int32, error) {
	p, err := NewPunctuator(brokers, topic)
	if err != nil {
		return 0, err
	}
	defer p.Close()
	return p.Punctuate(ctx, t)
}

// Punctuator writes punctuations to every partition of a decision topic
// with one client, for a source that punctuates often (a replay, at each
// step of event time). Safe for concurrent use; Close it when done.
type Punctuator struct {
	cl    *kgo.Client
	adm   *kadm.Client
	topic string
}

// NewPunctuator connects a punctuator for topic (DefaultTopic if empty).
func NewPunctuator(brokers []string, topic string) (*Punctuator, error) {
	if topic == "" {
		topic = DefaultTopic
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return nil, fmt.Errorf("pipeline: kafka producer: %w", err)
	}
	return &Punctuator{cl: cl, adm: kadm.NewClient(cl), topic: topic}, nil
}

// Punctuate writes a punctuation at t to every partition and returns how
// many there are.
func (p *Punctuator) Punctuate(ctx context.Context, t time.Time) (int32, error) {
	if ms := t.UnixMilli(); ms <= 0 || ms >= decision.MaxEventTimeMs {
		return 0, fmt.Errorf("pipeline: punctuation at %v: the time must be between 1970 and the year 9000", t)
	}
	n, err := partitions(ctx, p.adm, p.topic)
	if err != nil {
		return 0, err
	}
	v := []byte(strconv.FormatInt(t.UnixMilli(), 10))
	recs := make([]*kgo.Record, n)
	for i := range n {
		recs[i] = &kgo.Record{Topic: p.topic, Partition: i, Headers: []kgo.RecordHeader{{Key: stage.PunctuationHeader, Value: v}}}
	}
	if err := p.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return 0, fmt.Errorf("pipeline: punctuating %s: %w", p.topic, err)
	}
	return n, nil
}

// Close closes the client.
func (p *Punctuator) Close() { p.cl.Close() }

// eachFetched calls fn for every partition of an offset fetch response, in
// its per-topic or per-group form.
func eachFetched(resp *kmsg.OffsetFetchResponse, fn func(topic string, p int32, offset int64, meta *string)) {
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			fn(t.Topic, p.Partition, p.Offset, p.Metadata)
		}
	}
	for _, g := range resp.Groups {
		for _, t := range g.Topics {
			for _, p := range t.Partitions {
				fn(t.Topic, p.Partition, p.Offset, p.Metadata)
			}
		}
	}
}

// readRecordAt returns the value of the record at offset off of partition 0
// of topic, within 10 s.
func readRecordAt(ctx context.Context, brokers []string, topic string, off int64) ([]byte, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.FetchMaxPartitionBytes(maxPartialBytes),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().At(off)}}))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		fs := cl.PollRecords(rctx, 1)
		if err := rctx.Err(); err != nil {
			return nil, fmt.Errorf("no record at offset %d of %s within 10 s: %w", off, topic, err)
		}
		if errs := fs.Errors(); len(errs) > 0 {
			return nil, errs[0].Err
		}
		for _, r := range fs.Records() {
			if r.Offset != off {
				return nil, fmt.Errorf("the record at offset %d of %s is gone (retention?); the first one is at %d", off, topic, r.Offset)
			}
			return r.Value, nil
		}
	}
}
