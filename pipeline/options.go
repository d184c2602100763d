package pipeline

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluice-rl/sluice/pipeline/stage"
	"go.opentelemetry.io/otel/trace"
)

// DefaultGroup is the partition tier's consumer group.
const DefaultGroup = "sluice-pipeline"

// Options configure the pipeline's two tiers: the Consumer, a consumer group
// on the decision topic that keeps per-partition window state, and the
// Merger, a consumer group on the partials topic that merges it and runs
// each stage's Finish. Both take the same Options; a process may run either
// or both.
type Options struct {
	Brokers []string // required
	// Topic is the decision topic; default DefaultTopic.
	Topic string
	// PartialsTopic carries window states and watermarks from the
	// Consumer to the Merger. It must have exactly one partition (see
	// EnsureTopics) and belong to one pipeline: two pipelines sharing it
	// would merge each other's windows. Default Group + ".partials".
	PartialsTopic string
	// CheckpointTopic holds the Merger's checkpoints (one partition);
	// default Group + ".checkpoints".
	CheckpointTopic string
	// DeadLetterTopic receives records that fail to decode, with the error
	// and their original topic, partition and offset in headers; default
	// Topic + ".dead-letter".
	DeadLetterTopic string
	// LateToDeadLetter also sends late records to the dead-letter topic
	// (with error "late: ..."); by default they are only counted.
	LateToDeadLetter bool
	// Group is the Consumer's consumer group; the Merger's is Group +
	// "-merge". Default DefaultGroup.
	Group string
	// InstanceID, when set, makes this process a static member of both
	// groups (Kafka's group.instance.id, KIP-345): restarted with the same
	// ID within the session timeout (45 s), it takes its partitions back
	// without a rebalance; it does not leave the groups when it closes, so
	// a member that does not come back holds its partitions until the
	// session timeout. Unique per process (a StatefulSet pod's name).
	// Default "": a dynamic member.
	InstanceID string
	// Stages run in both tiers, in this order. Their names must be unique.
	Stages []stage.Stage
	// Writer receives the Merger's output. Required by the Merger: a
	// TopicWriter (to OutputTopic, applied by an Applier per region) or a
	// RegionWriter (to every region's Redis directly).
	Writer stage.Writer
	// OutputTopic is the topic EnsureTopics creates for a TopicWriter;
	// default DefaultOutputTopic.
	OutputTopic string

	// Lateness is how far behind the newest event time of its partition
	// the watermark trails: a record older than the watermark is late,
	// counted and left out. Default 10 s (sluice pipeline passes 1 s, so
	// that the aggregator's 250 ms shares are published within about a
	// second).
	Lateness time.Duration
	// MaxFuture is how far past its Kafka timestamp a record's event time
	// (or a punctuation's time) may be: a record further ahead is late
	// (reason "future") and does not move the watermark. The guard is as
	// good as the timestamp: give the decision topic
	// message.timestamp.type=LogAppendTime (EnsureTopics does when it
	// creates it) so that the broker's clock, not the producer's, sets it.
	// Default 1 minute; negative turns the check off, as a replay does, whose
	// clock is the log's.
	MaxFuture time.Duration
	// IdleTimeout: a partition with no record for this long (wall time)
	// while nothing of it is queued is idle: it closes the windows it holds
	// open (a record that comes later for them is late) and does not hold
	// back the merge watermark until its next record. Default 30 s. A
	// replay, which punctuates instead, sets it to a day.
	IdleTimeout time.Duration
	// QueueBatches bounds each partition's queues (fetched and decoded
	// batches). When its fetch queue is full, a partition's fetching is
	// paused until its stages catch up. Default 4.
	QueueBatches int
	// MaxPollRecords bounds one poll; default 10 000.
	MaxPollRecords int
	// CommitInterval is how often processed offsets are committed; default
	// 1 s. Offsets only ever move past records whose effects are sent.
	CommitInterval time.Duration
	// CheckpointInterval is how often, at most, the Merger checkpoints
	// after finishing windows; default 5 s.
	CheckpointInterval time.Duration
	// StateInterval is how often, at most, a partition whose open windows
	// reach back before the next record to read writes their state (the
	// open windows' partials and the watermark state) to CheckpointTopic
	// and commits the next record's offset with it, so that whoever takes
	// the partition over after a crash or a rebalance restores the windows
	// and reads on from there, rather than reading again from the first
	// record of the oldest open window (an hour back with an hour's
	// window). Between states, the last one's position stays committed.
	// Default 10 s; negative writes none (the position is then the oldest
	// open window's first record).
	StateInterval time.Duration

	Logger     *slog.Logger          // default slog.Default()
	Registerer prometheus.Registerer // nil registers no metrics
	// Tracer, when set, traces the tiers' work (SpanConsume, SpanMerge,
	// SpanStage, SpanWrite); nil traces nothing.
	Tracer trace.Tracer
}

func (o *Options) defaults() error {
	if len(o.Brokers) == 0 {
		return errors.New("pipeline: no Kafka brokers")
	}
	if o.Topic == "" {
		o.Topic = DefaultTopic
	}
	if o.Group == "" {
		o.Group = DefaultGroup
	}
	if o.PartialsTopic == "" {
		o.PartialsTopic = o.Group + ".partials"
	}
	if o.CheckpointTopic == "" {
		o.CheckpointTopic = o.Group + ".checkpoints"
	}
	if o.DeadLetterTopic == "" {
		o.DeadLetterTopic = o.Topic + ".dead-letter"
	}
	if o.OutputTopic == "" {
		o.OutputTopic = DefaultOutputTopic
	}
	topics := []string{o.Topic, o.PartialsTopic, o.CheckpointTopic, o.DeadLetterTopic, o.OutputTopic}
	for i, t := range topics {
		if slices.Contains(topics[i+1:], t) {
			return fmt.Errorf("pipeline: topic %q is given two roles (decisions, partials, checkpoints, dead letters, output): each needs its own", t)
		}
	}
	for name, d := range map[string]*time.Duration{"lateness": &o.Lateness, "idle timeout": &o.IdleTimeout,
		"commit interval": &o.CommitInterval, "checkpoint interval": &o.CheckpointInterval} {
		if *d < 0 {
			return fmt.Errorf("pipeline: negative %s %v", name, *d)
		}
	}
	if o.Lateness == 0 {
		o.Lateness = 10 * time.Second
	}
	if o.StateInterval == 0 {
		o.StateInterval = 10 * time.Second
	}
	if o.MaxFuture == 0 {
		o.MaxFuture = time.Minute
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = 30 * time.Second
	}
	if o.QueueBatches <= 0 {
		o.QueueBatches = 4
	}
	if o.MaxPollRecords <= 0 {
		o.MaxPollRecords = 10_000
	}
	if o.CommitInterval == 0 {
		o.CommitInterval = time.Second
	}
	if o.CheckpointInterval == 0 {
		o.CheckpointInterval = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	seen := map[string]bool{}
	for _, s := range o.Stages {
		n := s.Name()
		switch {
		case !stage.StageName.MatchString(n):
			return fmt.Errorf("pipeline: stage name %q: use 1 to 64 of a-z, 0-9, _ and -", n)
		case n == "fetch" || n == "decode" || n == "merge":
			return fmt.Errorf("pipeline: stage name %q is taken by a step of the pipeline", n)
		case seen[n]:
			return fmt.Errorf("pipeline: two stages are named %q", n)
		case s.Window() < time.Millisecond:
			return fmt.Errorf("pipeline: stage %s: window %v is shorter than 1 ms", n, s.Window())
		}
		seen[n] = true
	}
	return nil
}

// static is the group option of Options.InstanceID, if set.
func (o *Options) static() []kgo.Opt {
	if o.InstanceID == "" {
		return nil
	}
	return []kgo.Opt{kgo.InstanceID(o.InstanceID)}
}
