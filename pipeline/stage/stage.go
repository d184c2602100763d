package stage

import (
	"context"
	"encoding"
	"time"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/rules"
)

// Output is what stages produce when windows close: dynamic rules for every
// region and shares for the regions they name.
type Output struct {
	Rules  []rules.Rule
	Shares []rules.Share
}

func (o *Output) Add(x Output) {
	o.Rules = append(o.Rules, x.Rules...)
	o.Shares = append(o.Shares, x.Shares...)
}

func (o *Output) Len() int { return len(o.Rules) + len(o.Shares) }

// Window is one tumbling event-time window, [Start, End). Windows are
// aligned to the Unix epoch, so every consumer cuts the same ones.
type Window struct {
	Start, End time.Time
}

// Stage is one windowed computation of the slow loop (the detector, the
// aggregator), split so that it gives the same output whatever the number of
// consumers:
//
//   - each Kafka partition of the decision topic keeps one Partial per open
//     window, fed in offset order (the map side, in a Consumer);
//   - when a partition's watermark passes a window's end, its Partial is
//     encoded and sent to the merge tier (the partials topic);
//   - the merge tier (a Merger) merges every partition's Partial of a window,
//     in partition order, once the slowest partition's watermark has passed
//     the window's end, and calls Finish with the result, in window order.
//
// A partition's records are the same whoever consumes them, so its partials
// are too, and the merge is of the same partials in the same order: 1 or N
// consumers, real time or a fast replay, the outputs are equal.
//
// Finish is called only for windows in which some partition observed a
// record. State that outlives a window (baselines, cool-downs) belongs to
// the Stage and is saved by implementing Checkpointer.
//
// A Stage is used by one goroutine at a time for Finish; NewPartial and
// DecodePartial may be called from many goroutines at once.
type Stage interface {
	// Name identifies the stage in partial records, checkpoints and metric
	// labels. It must be stable across releases and match [a-z0-9_-]{1,64}.
	Name() string
	// Window is the length of the stage's tumbling windows, at least 1 ms.
	Window() time.Duration
	// NewPartial returns the empty state of one window on one partition.
	NewPartial() Partial
	// DecodePartial decodes what a Partial's MarshalBinary wrote. It
	// returns an error, never panics, on bytes it did not write.
	DecodePartial(b []byte) (Partial, error)
	// Finish is the merged state of window w over every partition; it
	// returns what the window produced. merged is not used after Finish
	// returns.
	Finish(w Window, merged Partial) Output
}

// Partial is the state of one stage in one window on one partition.
// It is owned by one goroutine.
type Partial interface {
	// Observe folds in one on-time record.
	Observe(d *decisionpb.Decision)
	// Merge folds in another partition's partial of the same window, as
	// decoded by the stage's DecodePartial. It returns an error if o is not
	// of the stage's kind or shape.
	Merge(o Partial) error
	encoding.BinaryMarshaler
}

// Checkpointer is implemented by a Stage that keeps state across windows.
// The Merger saves it after windows finish, and a Merger that takes over
// the merge (after a rebalance or a restart) restores it before finishing
// any window.
type Checkpointer interface {
	MarshalState() ([]byte, error)
	// UnmarshalState replaces the stage's cross-window state; it returns an
	// error, never panics, on bytes MarshalState did not write.
	UnmarshalState(b []byte) error
}

// Writer delivers stage output, e.g. to every region's Redis.
type Writer interface {
	Write(ctx context.Context, o Output) error
}
