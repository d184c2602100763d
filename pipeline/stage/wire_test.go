package stage

import (
	"errors"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/decision/decisionpb"
)

// bytesStage is the smallest stage: a partial is its bytes, which it keeps
// as they come, so that the fuzzer reaches the merge tier's code rather than
// a stage's decoder (the stages' own fuzzers cover those).
type bytesStage struct{}

type bytesPartial []byte

func (bytesStage) Name() string          { return "short" }
func (bytesStage) Window() time.Duration { return time.Second }
func (bytesStage) NewPartial() Partial   { return new(bytesPartial) }
func (bytesStage) DecodePartial(b []byte) (Partial, error) {
	if len(b) > 1<<10 {
		return nil, errors.New("bytes partial over 1 KiB")
	}
	p := bytesPartial(b)
	return &p, nil
}
func (bytesStage) Finish(Window, Partial) Output { return Output{} }

func (p *bytesPartial) Observe(*decisionpb.Decision) {}
func (p *bytesPartial) Merge(o Partial) error {
	x, ok := o.(*bytesPartial)
	if !ok {
		return errors.New("not a bytes partial")
	}
	*p = append(*p, *x...)
	return nil
}
func (p *bytesPartial) MarshalBinary() ([]byte, error) { return *p, nil }

// Records of the partials topic and merge checkpoints round-trip, and
// corrupt bytes give an error, never a panic.
func FuzzPartialRecords(f *testing.F) {
	p := PartialRecord{Kind: KindPartial, Source: 3, WM: 1_700_000_000_000, Stage: "heavy-hitters", Start: 0, End: 60_000, Body: []byte("state")}
	f.Add(p.AppendTo(nil))
	f.Add((&PartialRecord{Kind: KindMarker, Source: 1, WM: 5, Idle: true}).AppendTo(nil))
	ck := MergeCheckpoint{finished: 9, sources: []sourceWM{{partition: 0, wm: 1}, {partition: 1, wm: 2, idle: true}}, states: map[string][]byte{"a": []byte("x")}}
	f.Add(ck.Marshal())
	f.Add([]byte("sluice/p1 1 2 3"))
	stages := []Stage{bytesStage{}}
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := DecodePartialRecord(b); err == nil {
			if got := r.AppendTo(nil); string(got) != string(b) {
				t.Fatalf("re-encoded %x, read %x", got, b)
			}
			m := NewMerge(stages, 4)
			m.Add(&r, 0)
			m.Advance()
		}
		if c, err := UnmarshalMergeCheckpoint(b); err == nil {
			if err := NewMerge(stages, 4).Restore(c); err != nil && c.states["short"] == nil {
				t.Fatalf("restore without state for the stage failed: %v", err)
			}
		}
		ParsePartitionCheckpoint(string(b))
		ParseMergeMeta(string(b))
	})
}
