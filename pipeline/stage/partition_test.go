package stage_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/internal/stagetest"
	"github.com/sluice-rl/sluice/pipeline/stage"
)

// rec is one record of a synthetic partition: a decision, or a punctuation
// when punct > 0.
type rec struct {
	d     *decisionpb.Decision
	ts    int64 // Kafka timestamp, ms
	punct int64
}

// partitionStream is a partition's records: event times that mostly move
// forward with jitter, some far behind (late), a few far ahead of their
// Kafka timestamp (future), and a punctuation now and then.
func partitionStream(seed uint64, n int) []rec {
	r := rand.New(rand.NewPCG(seed, 1))
	t0 := int64(1_700_000_000_000)
	out := make([]rec, 0, n)
	for i := range n {
		now := t0 + int64(i)*37
		et := now - r.Int64N(3000) // up to 3 s out of order
		switch x := r.IntN(100); {
		case x < 3:
			et = now - 60_000 // a minute behind: late
		case x < 4:
			et = now + 10*60_000 // ten minutes past its timestamp
		case x < 5:
			out = append(out, rec{punct: now - 20_000})
			continue
		}
		out = append(out, rec{ts: now, d: &decisionpb.Decision{
			Version: 1, EventTimeMs: et, Outcome: decisionpb.Outcome_OUTCOME_ALLOWED,
			Descriptors: &decisionpb.Descriptors{ClientIp: fmt.Sprintf("192.0.2.%d", r.IntN(20))},
		}})
	}
	return out
}

type emitted struct {
	stage      int
	start, end int64
	body       string
}

// feed runs recs[from:] through s in batches of random size, cutting after
// the batch that ends at or past stopAt; it returns what was sent and the
// commit position after the last batch.
func feed(t *testing.T, s *stage.Partition, recs []rec, from, stopAt int, r *rand.Rand) ([]emitted, int64, stage.PartitionCheckpoint) {
	out, off, ck, _ := feedNext(t, s, recs, from, stopAt, r)
	return out, off, ck
}

// feedNext is feed that also returns the next record to read.
func feedNext(t *testing.T, s *stage.Partition, recs []rec, from, stopAt int, r *rand.Rand) ([]emitted, int64, stage.PartitionCheckpoint, int) {
	t.Helper()
	var out []emitted
	in := make([]int64, s.Stages())
	i := from
	var off int64
	var ck stage.PartitionCheckpoint
	for i < len(recs) {
		n := 1 + r.IntN(50)
		end := min(len(recs), i+n)
		for ; i < end; i++ {
			x := recs[i]
			if x.punct > 0 {
				s.Punctuate(x.punct)
				continue
			}
			s.Observe(x.d, int64(i), x.ts, in)
		}
		for _, c := range s.Due() {
			b, err := c.Partial.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, emitted{c.Stage, c.Start, c.End, string(b)})
		}
		off, ck = s.Checkpoint(int64(i))
		if i >= stopAt {
			break
		}
	}
	return out, off, ck, i
}

// A partition consumed in one go, and the same partition consumed with
// restarts at random points from the committed offset and watermark state,
// send exactly the same window partials: nothing missing, nothing twice,
// byte for byte. This is what makes a rebalance invisible downstream.
func TestPartitionRestartSendsTheSamePartials(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			recs := partitionStream(seed, 3000)
			stages := []stage.Stage{&stagetest.CountStage{ID: "a", Size: 2 * time.Second}, &stagetest.CountStage{ID: "b", Size: 7 * time.Second}}
			newState := func(ck stage.PartitionCheckpoint) *stage.Partition {
				return stage.NewPartition(stages, 1500, 60_000, ck)
			}
			r := rand.New(rand.NewPCG(seed, 2))
			want, _, _ := feed(t, newState(stage.FreshCheckpoint), recs, 0, len(recs), r)
			if len(want) < 20 {
				t.Fatalf("only %d windows sent", len(want))
			}

			var got []emitted
			from, ck := 0, stage.FreshCheckpoint
			for restarts := 0; from < len(recs); restarts++ {
				stop := from + r.IntN(600)
				if restarts > 12 {
					stop = len(recs)
				}
				out, off, next := feed(t, newState(ck), recs, from, stop, r)
				got = append(got, out...)
				if int(off) < from {
					t.Fatalf("commit position went back from %d to %d", from, off)
				}
				if stop >= len(recs) {
					break
				}
				from, ck = int(off), next
			}
			if len(got) != len(want) {
				t.Fatalf("with restarts %d windows sent, without %d", len(got), len(want))
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("window %d: with restarts stage %d [%d,%d), without stage %d [%d,%d) (or different contents)",
						i, got[i].stage, got[i].start, got[i].end, want[i].stage, want[i].start, want[i].end)
				}
			}
		})
	}
}

// The same with restarts from open-window states (MarshalOpen,
// RestorePartition) at random points, mixed with restarts from the
// committed offset: the same partials, byte for byte, while each restart
// from a state reads on from where the last one stopped rather than from
// the oldest open window's first record.
func TestRestoreOpenSendsTheSamePartials(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			recs := partitionStream(seed, 3000)
			stages := []stage.Stage{&stagetest.CountStage{ID: "a", Size: 2 * time.Second}, &stagetest.CountStage{ID: "b", Size: 7 * time.Second},
				&stagetest.CountStage{ID: "c", Size: time.Hour}}
			r := rand.New(rand.NewPCG(seed, 3))
			want, _, _ := feed(t, stage.NewPartition(stages, 1500, 60_000, stage.FreshCheckpoint), recs, 0, len(recs), r)

			var got []emitted
			s := stage.NewPartition(stages, 1500, 60_000, stage.FreshCheckpoint)
			from, states, reread := 0, 0, 0
			for restarts := 0; ; restarts++ {
				stop := from + r.IntN(600)
				if restarts > 12 {
					stop = len(recs)
				}
				out, off, ck, next := feedNext(t, s, recs, from, stop, r)
				got = append(got, out...)
				if stop >= len(recs) {
					break
				}
				if r.IntN(3) > 0 || s.Restored() {
					b, err := s.MarshalOpen(int64(next))
					if err != nil {
						t.Fatal(err)
					}
					var at int64
					if s, at, err = stage.RestorePartition(stages, 1500, 60_000, b); err != nil || at != int64(next) {
						t.Fatalf("restoring at %d: %v, reading on from %d", next, err, at)
					}
					from = next
					states++
					continue
				}
				s, from = stage.NewPartition(stages, 1500, 60_000, ck), int(off)
				reread += next - from
			}
			if len(got) != len(want) {
				t.Fatalf("with restarts %d windows sent, without %d", len(got), len(want))
			}
			for i := range want {
				g, w := got[i], want[i]
				if g.stage != w.stage || g.start != w.start || g.end != w.end || held(t, g) != held(t, w) {
					t.Fatalf("window %d: with restarts stage %d [%d,%d) %s, without stage %d [%d,%d) %s",
						i, g.stage, g.start, g.end, held(t, g), w.stage, w.start, w.end, held(t, w))
				}
			}
			if states == 0 {
				t.Fatal("no restart from a state")
			}
			t.Logf("%d restarts from a state; %d records read again by the others", states, reread)
		})
	}
}

// held is what a CountStage partial holds, as its window's output says it:
// the count, the distinct estimate and the top clients. (Its encoding may
// list a HyperLogLog's pending entries in another order after a decode: the
// same set, other bytes. The merge tier keys partials by partition and
// window, not by bytes.)
func held(t *testing.T, e emitted) string {
	t.Helper()
	st := &stagetest.CountStage{ID: "held", Size: time.Second}
	p, err := st.DecodePartial([]byte(e.body))
	if err != nil {
		t.Fatal(err)
	}
	return st.Finish(stage.Window{}, p).Shares[0].Key
}

// TestRestorePartitionRefuses: bytes MarshalOpen did not write, or written
// for other stages, are an error, never a panic.
func TestRestorePartitionRefuses(t *testing.T) {
	a, b := &stagetest.CountStage{ID: "a", Size: time.Second}, &stagetest.CountStage{ID: "b", Size: time.Second}
	s := stage.NewPartition([]stage.Stage{a}, 0, -1, stage.FreshCheckpoint)
	in := make([]int64, 1)
	s.Observe(&decisionpb.Decision{EventTimeMs: 1_700_000_000_000, Descriptors: &decisionpb.Descriptors{ClientIp: "x"}}, 0, 0, in)
	good, err := s.MarshalOpen(1)
	if err != nil {
		t.Fatal(err)
	}
	if _, next, err := stage.RestorePartition([]stage.Stage{a}, 0, -1, good); err != nil || next != 1 {
		t.Fatalf("restoring what was written: %v, next %d", err, next)
	}
	for name, c := range map[string]struct {
		stages []stage.Stage
		b      []byte
	}{
		"other stage": {[]stage.Stage{b}, good},
		"two stages":  {[]stage.Stage{a, b}, good},
		"empty":       {[]stage.Stage{a}, nil},
		"magic":       {[]stage.Stage{a}, append([]byte("XXXX"), good[4:]...)},
	} {
		if _, _, err := stage.RestorePartition(c.stages, 0, -1, c.b); !errors.Is(err, stage.ErrBadOpenState) {
			t.Errorf("%s: %v, want ErrBadOpenState", name, err)
		}
	}
	for i := range good {
		if _, _, err := stage.RestorePartition([]stage.Stage{a}, 0, -1, good[:i]); err == nil {
			t.Errorf("truncated to %d bytes: no error", i)
		}
	}
}

// The watermark policy, step by step: lateness trails the newest event
// time, a record far past its Kafka timestamp is late and does not move the
// watermark, a punctuation closes windows.
func TestPartitionWatermarkPolicy(t *testing.T) {
	st := &stagetest.CountStage{ID: "a", Size: 10 * time.Second}
	s := stage.NewPartition([]stage.Stage{st}, 5000, 60_000, stage.FreshCheckpoint)
	in := make([]int64, 1)
	at := func(et, ts int64) stage.Lateness {
		return s.Observe(&decisionpb.Decision{EventTimeMs: et, Descriptors: &decisionpb.Descriptors{ClientIp: "x"}}, 0, ts, in)
	}
	base := int64(1_700_000_000_000) // a multiple of 10 s
	steps := []struct {
		et, ts int64
		want   stage.Lateness
		wm     int64
		due    int
	}{
		{base + 1000, base + 1000, stage.OnTime, base - 4000, 0},
		{base + 12_000, base + 12_000, stage.OnTime, base + 7000, 0},
		{base + 8000, base + 12_000, stage.OnTime, base + 7000, 0},                       // behind, but not past the watermark
		{base + 16_000, base + 16_000, stage.OnTime, base + 11_000, 1},                   // [0,10) closes
		{base + 9000, base + 16_000, stage.LatePast, base + 11_000, 0},                   // its window has closed
		{base + 10*60_000, base + 17_000, stage.LateFuture, base + 11_000, 0},            // ten minutes ahead of its timestamp
		{base + 17_000 + 60_000, base + 17_000, stage.OnTime, base + 17_000 + 55_000, 1}, // exactly MaxFuture ahead is on time
	}
	for i, x := range steps {
		if got := at(x.et, x.ts); got != x.want {
			t.Fatalf("step %d: lateness %d, want %d", i, got, x.want)
		}
		if wm := s.Watermark(); wm != x.wm {
			t.Fatalf("step %d: watermark %d, want %d", i, wm-base, x.wm-base)
		}
		if d := s.Due(); len(d) != x.due {
			t.Fatalf("step %d: %d windows closed, want %d", i, len(d), x.due)
		}
	}
	s.Punctuate(base + 200_000)
	if d := s.Due(); len(d) != 1 || d[0].End != base+80_000 {
		t.Fatalf("punctuation closed %+v, want the window ending at +80 s", d)
	}
	if in[0] != 5 {
		t.Fatalf("stage observed %d records, want the 5 on time", in[0])
	}
}
