package faultload

import (
	"fmt"
	"testing"
	"time"
)

// MinRate is the lowest rate, in requests per second, that Controlled
// halves a fault case's load to: a run at it is judged whatever its
// control did.
const MinRate = 250

// Controlled runs a fault case beside a control, at rate requests per
// second and, while the control falls behind, at half that, down to
// MinRate. run offers the case's load at the rate it is given, to the
// sidecar under the fault and, at the same instants, to a control sidecar
// on a Redis of its own that stays healthy, and returns the control's
// shots and a judge of the run. A run whose control answered requests
// late, failed or left them unsent for a pile-up (Behind) measured the
// machine, not the fault (the machine got busier than the calibration,
// Sustained, found it): it is void, and the case runs again at half the
// rate. At MinRate a run is judged as it is, against its control
// (CheckAgainstControl). On a quiet machine the first run is judged.
//
// Each run is a subtest of t named by its rate ("2000-per-s"), so that
// what a void run started (servers, sidecars, their connections) is
// closed before the next one starts. *rate is left at the rate judged:
// cases run one after the other start where the last one ended.
func Controlled(t *testing.T, rate *int, run func(t *testing.T, rate int) (ctl []Shot, judge func())) {
	t.Helper()
	for {
		void, r := false, *rate
		t.Run(fmt.Sprintf("%d-per-s", r), func(t *testing.T) {
			ctl, judge := run(t, r)
			if bad := Behind(ctl); bad > 0 && r > MinRate {
				t.Logf("at %d requests/s the control answered %d requests late or not at all: the machine did not keep up, the run is void; again at %d/s",
					r, bad, max(MinRate, r/2))
				void = true
				return
			}
			judge()
		})
		if !void {
			return
		}
		*rate = max(MinRate, r/2)
	}
}

// Behind counts a control's requests that failed, were answered 5xx or
// later than Ceiling, or were not sent for a pile-up: what the machine,
// not a fault, did to a sidecar whose Redis and Kafka stay healthy.
func Behind(ctl []Shot) int {
	a := Tally(ctl)
	return a.Errors + a.FiveXX + a.Slow + NotSent(ctl)
}

// CheckAgainstControl fails t if the sidecar under a fault answered worse
// than the control, which took the same requests at the same instants on
// the same machine: any transport error, 5xx or answer later than
// Ceiling, or a pile-up (requests not sent to either), where the control
// had none; where the control had some (the machine could not keep up
// with the load), more than twice the control's plus 1% of the requests.
// A pile-up is the run's, not one sidecar's: it is counted, and the rest
// is judged. what names the fault in the messages.
//
// held, if not empty, is the span in which the fault holds requests by
// design (a silent or slow Redis, until the breaker opens: each request
// waits up to the queue wait and twice the budget). Where the control
// kept up, its requests are judged as every other; where it did not, the
// machine stretches each of those waits (a loaded machine wakes timers
// tens of milliseconds late), and its late answers there are counted
// apart, not judged.
func CheckAgainstControl(t *testing.T, what string, fault, ctl []Shot, held Phase) {
	t.Helper()
	af, ac := Tally(fault), Tally(ctl)
	badF := af.Errors + af.FiveXX + af.Slow
	badC := ac.Errors + ac.FiveXX + ac.Slow
	piled := NotSent(fault)
	t.Logf("%d requests not sent (a pile-up); %s: %+v; control: %+v", piled, what, af, ac)
	if badC == 0 {
		CheckAnswers(t, fault)
		if piled > 0 {
			t.Errorf("%d requests not sent for a pile-up, while the control answered every request in time", piled)
		}
		return
	}
	t.Logf("the control run had %d requests failed or later than %v: the machine did not keep up with the load; judged against it", badC, Ceiling)
	if held.To > held.From {
		inHeld := 0
		for i := range fault {
			if s := &fault[i]; s.Done && s.Err == nil && s.Resp.Status < 500 && s.Took > Ceiling && s.At >= held.From && s.At < held.To {
				inHeld++
			}
		}
		t.Logf("%d answers later than %v were to requests the fault held by design (%s, %v-%v): not judged", inHeld, Ceiling, held.Name, held.From, held.To)
		badF -= inHeld
	}
	if limit := 2*badC + len(fault)/100; badF > limit {
		t.Errorf("%s: %d requests not sent, failed or later than %v, the control %d: want at most %d", what, badF, Ceiling, badC, limit)
	}
}

// Sent counts the shots scheduled in [from, to) that were sent.
func Sent(shots []Shot, from, to time.Duration) int {
	n := 0
	for i := range shots {
		if s := &shots[i]; s.Done && s.At >= from && s.At < to {
			n++
		}
	}
	return n
}

// RedisShare is the share (0 to 1) of the answered requests scheduled in
// [from, to) that Redis decided (Recorded.Decided), and how many were
// answered.
func RedisShare(shots []Shot, rec *Recorder, from, to time.Duration) (float64, int) {
	var n, redis int
	for i := range shots {
		if s := &shots[i]; s.Done && s.At >= from && s.At < to {
			n++
			if rec.Recs[i].Decided() {
				redis++
			}
		}
	}
	if n == 0 {
		return 0, 0
	}
	return float64(redis) / float64(n), n
}

// CheckRedisDecidesBeside is CheckRedisDecides judged against a control
// (ctl, ctlRec: the same requests to a sidecar whose Redis stayed
// healthy): Redis must decide at least share of the answered requests, or,
// where the control's own Redis decided less than 90% and less than twice
// share (its answers missed the budget on a loaded machine), at least half
// the control's share.
func CheckRedisDecidesBeside(t *testing.T, shots []Shot, rec *Recorder, ctl []Shot, ctlRec *Recorder, from, to time.Duration, share float64) {
	t.Helper()
	c, _ := RedisShare(ctl, ctlRec, from, to)
	if want := c / 2; c < 0.9 && want < share {
		t.Logf("the control's Redis decided %.0f%% of its requests from %v to %v (late answers on a loaded machine): judged against half of that", 100*c, from, to)
		share = want
	}
	CheckRedisDecides(t, shots, rec, from, to, share)
}
