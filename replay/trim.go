package replay

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluice-rl/sluice/pipeline"
	"github.com/sluice-rl/sluice/pipeline/stage"
)

// kfakeSegmentBytes is the in-process broker's segment size. kfake keeps a
// partition's log in memory and frees it a whole segment at a time, so
// trimming (see trimmer) frees memory only in segments this small; its
// default, 100 MiB per partition, would hold half a gigabyte of decision
// records before the first segment could go.
const kfakeSegmentBytes = 1 << 20

// trimmer deletes the records of a run's topics that the pipeline has
// committed past, as Kafka's retention would: the decision topic below the
// committed offsets of the consumer group and of every other reader, the partials topic below the merge
// group's, and the checkpoint topic below the checkpoint that commit names.
// A consumer that restarted would resume from exactly those offsets, so no
// record it could read again is deleted. Only the in-process broker needs
// it: kfake has no retention by size that a replay could rely on, and keeps
// every record in memory.
type trimmer struct {
	cl  *kgo.Client
	adm *kadm.Client
	o   pipeline.Options // the run's, with its topics and group filled in
	// readers are other groups that read the decision topic (the
	// ClickHouse sink's), whose committed offsets bound its trim too.
	readers []string
}

func newTrimmer(po pipeline.Options) (*trimmer, error) {
	o := po
	if o.PartialsTopic == "" {
		o.PartialsTopic = o.Group + ".partials"
	}
	if o.CheckpointTopic == "" {
		o.CheckpointTopic = o.Group + ".checkpoints"
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(o.Brokers...))
	if err != nil {
		return nil, fmt.Errorf("replay: kafka admin: %w", err)
	}
	return &trimmer{cl: cl, adm: kadm.NewClient(cl), o: o}, nil
}

func (t *trimmer) Close() { t.cl.Close() }

// trim deletes what the groups have committed past.
func (t *trimmer) trim(ctx context.Context) error {
	del := kadm.Offsets{}
	// The decision topic: below every reading group's committed offset; a
	// partition a group has not committed yet is left whole.
	var low map[int32]int64
	for i, g := range append([]string{t.o.Group}, t.readers...) {
		dec, err := t.adm.FetchOffsets(ctx, g)
		if err != nil {
			return fmt.Errorf("fetching the committed offsets of %s: %w", g, err)
		}
		at := map[int32]int64{}
		dec.Each(func(r kadm.OffsetResponse) {
			if r.Err == nil && r.Topic == t.o.Topic && r.At > 0 {
				at[r.Partition] = r.At
			}
		})
		if i == 0 {
			low = at
			continue
		}
		for p, off := range low {
			if o, ok := at[p]; !ok {
				delete(low, p)
			} else if o < off {
				low[p] = o
			}
		}
	}
	for p, off := range low {
		del.Add(kadm.Offset{Topic: t.o.Topic, Partition: p, At: off})
	}
	mg, err := t.adm.FetchOffsets(ctx, t.o.Group+"-merge")
	if err != nil {
		return fmt.Errorf("fetching the committed offsets of %s-merge: %w", t.o.Group, err)
	}
	if r, ok := mg.Lookup(t.o.PartialsTopic, 0); ok && r.Err == nil && r.At > 0 {
		del.Add(kadm.Offset{Topic: t.o.PartialsTopic, Partition: 0, At: r.At})
		if ck, ok := stage.ParseMergeMeta(r.Metadata); ok && ck > 0 {
			del.Add(kadm.Offset{Topic: t.o.CheckpointTopic, Partition: 0, At: ck})
		}
	}
	if len(del) == 0 {
		return nil
	}
	resps, err := t.adm.DeleteRecords(ctx, del)
	if err != nil {
		return fmt.Errorf("deleting consumed records: %w", err)
	}
	if err := resps.Error(); err != nil {
		return fmt.Errorf("deleting consumed records: %w", err)
	}
	return nil
}
