// Package stage is the I/O-free core of sluice's slow loop: the contract a
// stage implements (Stage, Partial, Window, Output, and the optional
// Checkpointer), the helpers stages encode their state with (AppendBytes,
// StateReader), and the state machines both Kafka tiers of package pipeline
// drive, which decide everything that must not depend on how records are
// consumed:
//
//   - Partition: one partition of the decision topic, in offset order: each
//     stage's open tumbling windows (aligned to the Unix epoch), the
//     partition's watermark (newest on-time event time − lateness, raised by
//     punctuations) and lateness, and checkpoints that resume it exactly.
//   - Merge: every partition's partial of each window, merged in partition
//     order once every non-idle partition's watermark has passed the
//     window's end, then the stage's Finish.
//   - PartialRecord, PartitionCheckpoint, MergeCheckpoint: their wire forms
//     (versioned, checked; every decode error wraps ErrBadPartial).
//   - Local: both in one process, without Kafka, for replays and tests.
//
// Windows and watermarks follow the Dataflow model (Akidau et al. 2015, "The
// Dataflow Model", VLDB): the output is the same with 1 consumer or N, live
// or replayed, across rebalances and restarts (docs/pipeline.md).
//
// It links no Kafka, Redis or ClickHouse client; it imports only decision
// and rules of sluice's.
package stage
