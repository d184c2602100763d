package enforcer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// TestDebtCurveMatchesTheBucket: a debtCurve built from random grants and
// gaps gives, for every starting level, the level a token bucket reaches
// when each grant is taken at its time (lazy refill capped at the burst,
// grants taken whether or not they fit, as the fallback's were), and so
// does a curve owed again after a failed charge (then).
func TestDebtCurveMatchesTheBucket(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for run := range 2000 {
		r := knownRule{alg: int64(rules.TokenBucket), limit: 1 + rng.Int64N(50), burst: 1 + rng.Int64N(30), period: 1 + rng.Int64N(5000)}
		full := r.burst * r.period
		type grant struct{ at, units int64 }
		var gs []grant
		at := rng.Int64N(1 << 40)
		for range 1 + rng.IntN(40) {
			at += rng.Int64N(3 * r.period)
			gs = append(gs, grant{at, 1 + rng.Int64N(r.burst+2)})
		}
		split := rng.IntN(len(gs) + 1) // the first part's charge failed, the rest was owed since
		var first, rest debtCurve
		for i, g := range gs {
			if i < split {
				first.grant(g.at, g.units, r)
			} else {
				rest.grant(g.at, g.units, r)
			}
		}
		c := first.then(rest, r)
		for _, x := range []int64{0, 1, full / 3, full - 1, full} {
			level, last := x, gs[0].at
			for _, g := range gs {
				level = min(full, level+(g.at-last)*r.limit) - g.units*r.period
				last = g.at
			}
			if got := min(c.a, x+c.b); got != level {
				t.Fatalf("run %d, rule %+v, grants %v (split at %d), from %d: curve says %d, the bucket %d", run, r, gs, split, x, got, level)
			}
		}
		if c.t0 != gs[0].at || c.tl != gs[len(gs)-1].at {
			t.Fatalf("run %d: curve spans %d-%d, the grants %d-%d", run, c.t0, c.tl, gs[0].at, gs[len(gs)-1].at)
		}
	}
}

// TestChargeAfterAnOutage: charge.lua with the grants' curve, against a
// real Redis. Found by a fresh user: a client at 7/s under a 10/s limit
// (burst 20), granted 70 by the fallback over a 10 s outage, was denied
// for seconds after Redis came back, as the charge took all 70 at once from
// a bucket whose refill over the outage had been capped at 20.
func TestChargeAfterAnOutage(t *testing.T) {
	rdb := redistest.Server(t)
	ctx := context.Background()
	r := knownRule{alg: int64(rules.TokenBucket), limit: 10, burst: 20, period: 1000}
	redisNow := func() int64 {
		tm, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixMilli()
	}
	// charge owes grants at the given ages (ms before now on this host),
	// with the key last written by Redis at stateAge ms before now (full;
	// -1: no key), charges them, and returns the tokens left and the
	// refill time's lead over Redis's now (ms; > 0: in debt beyond empty).
	charge := func(name string, stateAge int64, ages []int64) (tokens float64, lead int64) {
		key := "sl:{debt-" + name + "}:r:0"
		if stateAge >= 0 {
			if err := rdb.Set(ctx, key, fmt.Sprintf("%d %d %d", r.burst*r.period, redisNow()-stateAge, r.period), 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
		k := newLastKnown(64)
		host := hostMs()
		for _, a := range ages {
			k.owe([]byte(key), r, 1, host-a, 0, 0)
		}
		ds := k.debts(make([]debt, 0, 1))
		if len(ds) != 1 || ds[0].units != int64(len(ages)) {
			t.Fatalf("%s: debts %+v, want one of %d units", name, ds, len(ages))
		}
		d := &ds[0]
		args := []any{d.now, d.rule.alg, d.rule.limit, d.rule.period, d.rule.burst, d.units, d.ttl}
		ref := hostMs()
		args = append(args, d.curve.a, d.curve.b, ref-d.curve.t0, ref-d.curve.tl)
		if err := chargeScript.Run(ctx, rdb, []string{key}, args...).Err(); err != nil {
			t.Fatal(err)
		}
		v, err := rdb.Get(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(v)
		u, _ := strconv.ParseInt(f[0], 10, 64)
		ts, _ := strconv.ParseInt(f[1], 10, 64)
		return float64(u) / float64(r.period), ts - redisNow()
	}
	steady := make([]int64, 70) // 7 a second for 10 s, the last just now
	for i := range steady {
		steady[i] = int64(69-i) * 1000 / 7
	}
	if tok, lead := charge("steady", 10_500, steady); tok < 18 || lead > 0 {
		t.Errorf("a client at 7/s through a 10 s outage, under 10/s: %.1f tokens left (lead %d ms) after the charge, want at least 18 (it never emptied the bucket)", tok, lead)
	}
	if tok, lead := charge("lost", -1, steady); tok < 18 || lead > 0 {
		t.Errorf("the same with the key lost by Redis: %.1f tokens left (lead %d ms), want at least 18", tok, lead)
	}
	burst := make([]int64, 30) // 30 at once at the end: 10 more than the bucket holds
	if tok, lead := charge("burst", 10_500, burst); tok != 0 || lead < 900 {
		t.Errorf("30 granted at once from a full bucket of 20: %.1f tokens left, refill %d ms ahead, want 0 and about 1 000 ms (10 tokens owed)", tok, lead)
	}
	// Written by others since the first grant: every unit at once, at now.
	if tok, lead := charge("newer", 2_000, steady); tok != 0 || lead < 4_500 {
		t.Errorf("state newer than the first grant: %.1f tokens left, refill %d ms ahead, want 0 and about 5 000 (70 charged at once from 20)", tok, lead)
	}
}

func hostMs() int64 { return time.Now().UnixMilli() }
