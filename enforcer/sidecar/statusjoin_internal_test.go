package sidecar

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/decision"
)

type sinkSlice struct {
	mu   sync.Mutex
	recs []decision.Record
}

func (s *sinkSlice) Log(r decision.Record) { s.mu.Lock(); s.recs = append(s.recs, r); s.mu.Unlock() }

// Held records are logged, without a status, once their wait ends, or
// when MaxPending is reached (the oldest first), or at Close; records of
// one request id are logged together; nothing is lost; each is stamped with
// the time it is logged at.
func TestStatusJoinExpiresEvictsAndFlushes(t *testing.T) {
	out := &sinkSlice{}
	j, err := NewStatusJoin(out, StatusJoinOptions{Wait: 5 * time.Second, MaxPending: 3})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_700_000_000, 0)
	now := t0
	j.now = func() time.Time { return now }
	logAt := func(at time.Duration, id string) {
		now = t0.Add(at)
		j.Log(decision.Record{RequestID: id, Time: now})
	}
	logAt(0, "a")
	logAt(0, "a") // the same request's second check
	logAt(time.Second, "b")
	logAt(2*time.Second, "c")
	if len(out.recs) != 0 {
		t.Fatalf("logged %d before any wait ended", len(out.recs))
	}
	logAt(3*time.Second, "d") // a fourth request id: a, the oldest, is evicted
	if ids := idsOf(out.recs); ids != "a a" {
		t.Fatalf("evicted %q, want a's two records", ids)
	}
	j.expire(t0.Add(5 * time.Second)) // b's wait ends at 6 s
	if ids := idsOf(out.recs); ids != "a a" {
		t.Fatalf("at 5 s: %q", ids)
	}
	j.expire(t0.Add(6 * time.Second))
	if ids := idsOf(out.recs); ids != "a a b" {
		t.Fatalf("at 6 s: %q, want b expired", ids)
	}
	now = t0.Add(7 * time.Second)
	j.Status("c", 404)
	now = t0.Add(8 * time.Second)
	j.Close()
	if ids := idsOf(out.recs); ids != "a a b c d" || out.recs[3].Status != 404 || out.recs[4].Status != 0 {
		t.Fatalf("after close: %q %+v", ids, out.recs)
	}
	for i, at := range []time.Duration{3, 3, 6, 7, 8} { // evicted, expired, joined, closed
		if got := out.recs[i].Time.Sub(t0); got != at*time.Second {
			t.Errorf("record %d (%s) stamped at %v, want %v", i, out.recs[i].RequestID, got, at*time.Second)
		}
	}
	j.Log(decision.Record{RequestID: "e"}) // after Close: passes at once
	if len(out.recs) != 6 {
		t.Fatalf("a record logged after Close was held")
	}
	if _, err := NewStatusJoin(out, StatusJoinOptions{Wait: -time.Second}); err == nil {
		t.Fatal("a negative wait was accepted")
	}
}

// A request id checked more than maxPerRequest times keeps the first ones
// for its status and logs the rest at once.
func TestStatusJoinBoundsOneRequest(t *testing.T) {
	out := &sinkSlice{}
	j, _ := NewStatusJoin(out, StatusJoinOptions{})
	for i := range maxPerRequest + 2 {
		j.Log(decision.Record{RequestID: "x", Instance: fmt.Sprint(i)})
	}
	if len(out.recs) != 2 {
		t.Fatalf("%d logged at once, want 2", len(out.recs))
	}
	j.Status("x", 200)
	if len(out.recs) != maxPerRequest+2 || out.recs[2].Status != 200 || out.recs[maxPerRequest+1].Status != 200 {
		t.Fatalf("%d records after the status", len(out.recs))
	}
}

func idsOf(recs []decision.Record) string {
	s := ""
	for i, r := range recs {
		if i > 0 {
			s += " "
		}
		s += r.RequestID
	}
	return s
}

// A request id used again after its status came waits its own full wait:
// the queue entry of its first use does not expire it.
func TestStatusJoinReusedID(t *testing.T) {
	out := &sinkSlice{}
	j, _ := NewStatusJoin(out, StatusJoinOptions{Wait: 5 * time.Second})
	t0 := time.Unix(1_700_000_000, 0)
	now := t0
	j.now = func() time.Time { return now }
	j.Log(decision.Record{RequestID: "x"})
	j.Status("x", 200)
	now = t0.Add(3 * time.Second)
	j.Log(decision.Record{RequestID: "x"})
	j.expire(t0.Add(5 * time.Second)) // the first use's deadline
	if len(out.recs) != 1 {
		t.Fatalf("%d logged at 5 s, want only the first use's", len(out.recs))
	}
	j.expire(t0.Add(8 * time.Second))
	if len(out.recs) != 2 || out.recs[1].Status != 0 {
		t.Fatalf("at 8 s: %+v, want the second use expired", out.recs)
	}
}
