package pipeline

import (
	"testing"
	"time"
)

// Records of the partials topic and merge checkpoints round-trip, and
// corrupt bytes give an error, never a panic.
func FuzzPartialRecords(f *testing.F) {
	p := partialRecord{kind: kindPartial, source: 3, wm: 1_700_000_000_000, stage: "heavy-hitters", start: 0, end: 60_000, body: []byte("state")}
	f.Add(p.appendTo(nil))
	f.Add((&partialRecord{kind: kindMarker, source: 1, wm: 5, idle: true}).appendTo(nil))
	ck := mergeCheckpoint{finished: 9, sources: []sourceWM{{partition: 0, wm: 1}, {partition: 1, wm: 2, idle: true}}, states: map[string][]byte{"a": []byte("x")}}
	f.Add(ck.marshal())
	f.Add([]byte("sluice/p1 1 2 3"))
	stages := []Stage{&countStage{name: "short", window: time.Second}}
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := decodePartialRecord(b); err == nil {
			if got := r.appendTo(nil); string(got) != string(b) {
				t.Fatalf("re-encoded %x, read %x", got, b)
			}
			m := newMergeState(stages, 4)
			m.add(&r, 0)
			m.advance()
		}
		if c, err := unmarshalMergeCheckpoint(b); err == nil {
			if err := newMergeState(stages, 4).restore(c); err != nil && c.states["short"] == nil {
				t.Fatalf("restore without state for the stage failed: %v", err)
			}
		}
		parsePartCheckpoint(string(b))
		parseMergeMeta(string(b))
		if _, err := stages[0].DecodePartial(b); err != nil {
			return
		}
	})
}
