package pipeline

import (
	"testing"
	"time"
)

// Records of the partials topic and merge checkpoints round-trip, and
// corrupt bytes give an error, never a panic.
func FuzzPartialRecords(f *testing.F) {
	p := PartialRecord{Kind: KindPartial, Source: 3, WM: 1_700_000_000_000, Stage: "heavy-hitters", Start: 0, End: 60_000, Body: []byte("state")}
	f.Add(p.AppendTo(nil))
	f.Add((&PartialRecord{Kind: KindMarker, Source: 1, WM: 5, Idle: true}).AppendTo(nil))
	ck := MergeCheckpoint{finished: 9, sources: []sourceWM{{partition: 0, wm: 1}, {partition: 1, wm: 2, idle: true}}, states: map[string][]byte{"a": []byte("x")}}
	f.Add(ck.Marshal())
	f.Add([]byte("sluice/p1 1 2 3"))
	stages := []Stage{&countStage{name: "short", window: time.Second}}
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
		if _, err := stages[0].DecodePartial(b); err != nil {
			return
		}
	})
}
