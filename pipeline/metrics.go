package pipeline

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluice-rl/sluice/pipeline/stage"
)

// consumerMetrics are a Consumer's counters. Each is a plain atomic
// counter (Counter) or histogram: a batch adds its totals once.
type consumerMetrics struct {
	fetched, decoded     *Counter
	stageIn              []*Counter // per stage
	decodeErrors         *Counter
	latePast, lateFuture *Counter
	resent               *Counter
	deadLetters          *Counter
	partials, markers    *Counter
	batch                prometheus.Observer
	pauses               *Counter
	commitErrors         *Counter
	tooLarge             *Counter
	states, stateFails   *Counter // open-window states written; restores that failed
}

// mergeMetrics are a Merger's counters.
type mergeMetrics struct {
	in           *Counter
	partials     [stage.NumPartialResults]*Counter
	mergeErrors  *Counter
	outputs      *Counter
	writeErrors  *Counter
	checkpoints  *Counter
	ckptErrors   *Counter
	restoreFails *Counter
	batch        prometheus.Observer
}

var batchBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}

// Registry registers collectors on a prometheus.Registerer (nil registers
// nothing), remembering the first error (Err). Build one with NewRegistry.
type Registry struct {
	reg prometheus.Registerer
	err error
}

// NewRegistry returns a Registry over reg (nil: register nothing).
func NewRegistry(reg prometheus.Registerer) *Registry { return &Registry{reg: reg} }

// Err returns the first registration error, nil if none.
func (r *Registry) Err() error { return r.err }

// Counter is a count kept in an atomic integer: Stats methods read it as it
// is, and Prometheus reads it through a CounterFunc (Registry.Counter), so
// both show the same number and neither goes through the other. Safe for
// concurrent use; the zero value counts from 0.
type Counter struct{ n atomic.Int64 }

// Inc adds 1.
func (c *Counter) Inc() { c.n.Add(1) }

// Add adds n ≥ 0.
func (c *Counter) Add(n int64) { c.n.Add(n) }

// Value returns the count.
func (c *Counter) Value() int64 { return c.n.Load() }

// Counter registers and returns a counter with constant labels.
func (r *Registry) Counter(name, help string, labels prometheus.Labels) *Counter {
	c := new(Counter)
	r.register(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels},
		func() float64 { return float64(c.Value()) }))
	return c
}

// batchHistogram is a tier's processing time per batch.
func (r *Registry) batchHistogram(tier string) prometheus.Observer {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_pipeline_batch_duration_seconds", Help: "Time to process one batch of records, by tier.",
		Buckets: batchBuckets, ConstLabels: prometheus.Labels{"tier": tier}})
	r.register(h)
	return h
}

func (r *Registry) register(c prometheus.Collector) {
	if r.reg == nil || r.err != nil {
		return
	}
	if err := r.reg.Register(c); err != nil {
		r.err = fmt.Errorf("pipeline: registering metrics: %w", err)
	}
}

const (
	helpRecordsIn = "Records taken in by each step: fetch and decode (decision records), each stage (records observed), merge (partial records)."
	nameRecordsIn = "sluice_pipeline_records_in_total"
)

func newConsumerMetrics(reg prometheus.Registerer, stages []stage.Stage) (*consumerMetrics, error) {
	r := &Registry{reg: reg}
	m := &consumerMetrics{
		fetched:      r.Counter(nameRecordsIn, helpRecordsIn, prometheus.Labels{"stage": "fetch"}),
		decoded:      r.Counter(nameRecordsIn, helpRecordsIn, prometheus.Labels{"stage": "decode"}),
		decodeErrors: r.Counter("sluice_pipeline_decode_errors_total", "Decision records that failed to decode, sent to the dead-letter topic.", nil),
		latePast: r.Counter("sluice_pipeline_late_records_total", "Decision records left out by the watermark policy: behind their partition's watermark (past) or too far past their Kafka timestamp (future).",
			prometheus.Labels{"reason": "past"}),
		lateFuture: r.Counter("sluice_pipeline_late_records_total", "Decision records left out by the watermark policy: behind their partition's watermark (past) or too far past their Kafka timestamp (future).",
			prometheus.Labels{"reason": "future"}),
		resent:       r.Counter("sluice_pipeline_replayed_records_total", "Records read again after a rebalance or restart whose windows had already been sent.", nil),
		deadLetters:  r.Counter("sluice_pipeline_dead_letters_total", "Records written to the dead-letter topic.", nil),
		partials:     r.Counter("sluice_pipeline_partials_sent_total", "Per-partition window states sent to the merge tier.", nil),
		markers:      r.Counter("sluice_pipeline_watermarks_sent_total", "Watermark markers sent to the merge tier.", nil),
		pauses:       r.Counter("sluice_pipeline_partition_pauses_total", "Times a partition's fetching was paused because its queue was full.", nil),
		commitErrors: r.Counter("sluice_pipeline_commit_errors_total", "Offset commits that failed (the records are read again after a restart).", prometheus.Labels{"tier": "partition"}),
		tooLarge:     r.Counter("sluice_pipeline_too_large_total", "Partials or dead letters larger than Kafka takes, left out.", nil),
		states:       r.Counter("sluice_pipeline_partition_states_total", "Open-window states written to the checkpoint topic, each committed as its partition's position (Options.StateInterval).", nil),
		stateFails: r.Counter("sluice_pipeline_partition_state_restore_failures_total",
			"Open-window states that could not be read back when a partition was taken over: its records were read again from the state's rewind point.", nil),
	}
	for _, s := range stages {
		m.stageIn = append(m.stageIn, r.Counter(nameRecordsIn, helpRecordsIn, prometheus.Labels{"stage": s.Name()}))
	}
	m.batch = r.batchHistogram("partition")
	return m, r.err
}

func newMergeMetrics(reg prometheus.Registerer) (*mergeMetrics, error) {
	r := &Registry{reg: reg}
	m := &mergeMetrics{
		in:           r.Counter(nameRecordsIn, helpRecordsIn, prometheus.Labels{"stage": "merge"}),
		mergeErrors:  r.Counter("sluice_pipeline_merge_errors_total", "Partials that failed to decode or merge when their window finished, left out of it.", nil),
		outputs:      r.Counter("sluice_pipeline_outputs_total", "Dynamic rules and shares written by finished windows.", nil),
		writeErrors:  r.Counter("sluice_pipeline_write_errors_total", "Failed attempts to write stage output (retried until they succeed).", nil),
		checkpoints:  r.Counter("sluice_pipeline_checkpoints_total", "Merge-tier checkpoints written.", nil),
		ckptErrors:   r.Counter("sluice_pipeline_commit_errors_total", "Offset commits that failed (the records are read again after a restart).", prometheus.Labels{"tier": "merge"}),
		restoreFails: r.Counter("sluice_pipeline_checkpoint_restore_failures_total", "Merge-tier checkpoints that could not be read back: the stages started without their cross-window state.", nil),
	}
	for i, name := range stage.PartialResultNames {
		m.partials[i] = r.Counter("sluice_pipeline_partials_total", "Partial records taken by the merge tier, by what became of them: merged, duplicate (already had it), finished (its window had finished), bad.",
			prometheus.Labels{"result": name})
	}
	m.batch = r.batchHistogram("merge")
	return m, r.err
}

// lagGauge reports the records behind the newest offset, summed over the
// partitions a tier owns.
func registerLag(reg prometheus.Registerer, tier string, f func() float64) error {
	if reg == nil {
		return nil
	}
	err := reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_pipeline_consumer_lag_records", Help: "Records between the newest offset and the next one to process, summed over the partitions this process owns, by tier.",
		ConstLabels: prometheus.Labels{"tier": tier},
	}, f))
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		return fmt.Errorf("pipeline: registering metrics: %w", err)
	}
	return err
}
