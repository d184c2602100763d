package enforcer

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/rules"
)

// The remembered Redis state (lastKnown) on synthetic times: what the
// fallback may grant from Redis's last answer, its debts, and its bounds.

var (
	tb10 = knownRule{alg: int64(rules.TokenBucket), limit: 10, burst: 10, period: 1000} // 10 a second
	fw5  = knownRule{alg: int64(rules.FixedWindow), limit: 5, burst: 5, period: 60000}
)

// takeN takes cost 1 n times at now and returns how many were allowed and
// the last wait.
func takeN(k *lastKnown, key string, r knownRule, n int, share, headroom float64, now int64) (allowed int, wait int64) {
	for range n {
		known, ok, w := k.take([]byte(key), r, 1, share, headroom, now, 0, 0, true)
		if !known {
			return -1, 0
		}
		if ok {
			allowed++
		}
		wait = w
	}
	return allowed, wait
}

func TestLastKnownTokenBucket(t *testing.T) {
	for _, tc := range []struct {
		name            string
		rem             int64
		share, headroom float64
		after           int64 // ms after Redis's answer
		want            int
		wantWait        int64
	}{
		// An exhausted key stays denied: its refill only.
		{"exhausted", 0, 1, 1, 0, 0, 100},
		{"exhausted, 100 ms later: one token", 0, 1, 1, 100, 1, 100},
		{"exhausted, 350 ms later", 0, 1, 1, 350, 3, 50},
		// R remaining: this enforcer's share of R, plus its share of the refill with headroom.
		{"9 left, one of three", 9, 1.0 / 3, 1.2, 0, 3, 250},
		{"9 left, one of three, 1 s later", 9, 1.0 / 3, 1.2, 1000, 4, 250}, // 3 + 4 refilled = 7, capped at 10 × 1.2 / 3 = 4
		{"full, alone", 10, 1, 1.2, 0, 10, 84},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := newLastKnown(64)
			if known, _, _ := k.take([]byte("k"), tb10, 1, 1, 1, 0, 0, 0, true); known {
				t.Fatal("a key never recorded is known")
			}
			k.record([]byte("k"), tb10, tc.rem, 0, 1000, 0)
			got, wait := takeN(k, "k", tb10, 20, tc.share, tc.headroom, 1000+tc.after)
			if got != tc.want || wait != tc.wantWait {
				t.Errorf("allowed %d (last wait %d ms), want %d (wait %d ms)", got, wait, tc.want, tc.wantWait)
			}
			if owed := k.owedFor([]byte("k")); owed != int64(got) {
				t.Errorf("owed %d, want the %d granted", owed, got)
			}
		})
	}
}

func TestLastKnownFixedWindow(t *testing.T) {
	k := newLastKnown(64)
	k.record([]byte("w"), fw5, 3, 400, 1000, 0) // 3 left, 400 ms to the window's end
	if got, wait := takeN(k, "w", fw5, 5, 1, 1.2, 1100); got != 3 || wait != 300 {
		t.Errorf("allowed %d (wait %d), want 3 and a wait to the window's end, 300 ms", got, wait)
	}
	if got, _ := takeN(k, "w", fw5, 1, 1, 1.2, 1300); got != 0 {
		t.Errorf("a fixed window refilled before its end: %d allowed", got)
	}
	if known, _, _ := k.take([]byte("w"), fw5, 1, 1, 1.2, 1400, 0, 0, true); known {
		t.Error("known after the window's end: a new window is a new key")
	}
	k.record([]byte("x"), fw5, 5, 1000, 1, 0)
	if got, _ := takeN(k, "x", fw5, 5, 0.5, 1.2, 10); got != 2 {
		t.Errorf("one of two enforcers allowed %d of 5 left, want 2 (no headroom on what Redis said is left)", got)
	}
}

func TestLastKnownAnswersInOrder(t *testing.T) {
	k := newLastKnown(64)
	key := []byte("k")
	k.record(key, tb10, 5, 0, 2000, 0)
	k.record(key, tb10, 9, 0, 1999, 0) // older: ignored
	k.record(key, tb10, 7, 0, 2000, 0) // same ms, more left: ignored
	if got, _ := takeN(k, "k", tb10, 10, 1, 1, 2000); got != 5 {
		t.Errorf("allowed %d, want 5: the newest answer, the lower of one millisecond's", got)
	}
	k.record(key, tb10, 2, 0, 2000, 0) // same ms, fewer left: kept, and the bucket seeded again
	if got, _ := takeN(k, "k", tb10, 10, 1, 1, 2000); got != 0 {
		t.Errorf("allowed %d, want 0: 2 left less the 5 owed", got)
	}
	changed := tb10
	changed.limit = 20
	if known, _, _ := k.take(key, changed, 1, 1, 1, 2000, 0, 0, true); known {
		t.Error("an answer for other rule values is used")
	}
}

func TestLastKnownDebts(t *testing.T) {
	k := newLastKnown(64)
	key := []byte("k")
	// Granted by the fallback's own bucket before any answer: owed.
	k.owe(key, tb10, 3, 0, 0, 0)
	if got := k.owedFor(key); got != 3 {
		t.Fatalf("owed %d, want 3", got)
	}
	// Redis says 5 left (it has not counted the 3): 2 for the fallback.
	k.record(key, tb10, 5, 0, 1000, 0)
	if got, _ := takeN(k, "k", tb10, 5, 1, 1, 1000); got != 2 {
		t.Errorf("allowed %d after an answer of 5 with 3 owed, want 2", got)
	}
	// A request another rule denied gives its unit back.
	if _, ok, _ := k.take(key, tb10, 1, 1, 1, 1100, 0, 0, true); !ok {
		t.Fatal("no token 100 ms later")
	}
	k.giveBack(key, tb10, 1)
	if got := k.owedFor(key); got != 5 {
		t.Errorf("owed %d after a give-back, want 5", got)
	}
	ds := k.debts(make([]debt, 0, 8))
	if len(ds) != 1 || ds[0].units != 5 || ds[0].key != "k" {
		t.Fatalf("debts %+v, want 5 units of k", ds)
	}
	if d := k.debts(make([]debt, 0, 8)); len(d) != 0 {
		t.Errorf("debts listed twice: %+v", d)
	}
	k.owe(key, tb10, 1, 0, 0, 0) // granted while the charge is under way
	k.settle(&ds[0], false)      // failed: owed again
	if got := k.owedFor(key); got != 6 {
		t.Errorf("owed %d after a failed charge, want 6", got)
	}
	sentBefore := time.Now().UnixNano()
	ds = k.debts(ds[:0])
	k.settle(&ds[0], true)
	if got := k.owedFor(key); got != 0 || k.owing.Load() != 0 {
		t.Errorf("owed %d (%d keys owing) after the charge, want none", got, k.owing.Load())
	}
	// An answer to a decision sent before the charge ended may leave the 6
	// charged units out: it is taken less them (the fallback then holds
	// 9 - 6 = 3); one sent after it is taken as it is.
	k.record(key, tb10, 9, 0, 3000, sentBefore)
	if got, _ := takeN(k, "k", tb10, 9, 1, 1, 3000); got != 3 {
		t.Errorf("allowed %d after an answer of 9 to a decision sent before a charge of 6, want 3", got)
	}
	k.giveBack(key, tb10, 3)
	k.record(key, tb10, 8, 0, 3001, time.Now().UnixNano())
	if got, _ := takeN(k, "k", tb10, 9, 1, 1, 3001); got != 8 {
		t.Errorf("allowed %d after an answer of 8 to a decision sent after the charge, want 8", got)
	}
	k.giveBack(key, tb10, 8)
	// No debt where Redis is not this region's, or not charged.
	k.take(key, tb10, 1, 1, 1, 5000, 0, 0, false)
	k.owe([]byte("g"), knownRule{alg: algGCounter, limit: 5, burst: 5, period: 1000}, 1, 0, 0, 0)
	if k.owing.Load() != 0 {
		t.Error("a pinned rule's grant or a G-Counter's is owed to this region's Redis")
	}
}

func TestLastKnownIsBounded(t *testing.T) {
	k := newLastKnown(8) // 4 sets of 2
	for i := range 1000 {
		key := []byte(fmt.Sprint("key", i))
		k.record(key, tb10, 5, 0, int64(1000+i), 0)
		k.owe(key, tb10, 1, 0, 0, 0)
	}
	if n := k.used.Load(); n > 8 || n < 1 {
		t.Errorf("%d keys remembered in a table of 8", n)
	}
	if n := k.owing.Load(); n > 8 {
		t.Errorf("%d keys owing in a table of 8", n)
	}
	if lost := k.lost.Load(); lost != 1000-uint64(k.owing.Load()) {
		t.Errorf("%d units lost with their evicted keys, want %d", lost, 1000-k.owing.Load())
	}
	// The newest answers stay: the last key is known.
	if known, _, _ := k.take([]byte("key999"), tb10, 1, 1, 1, 2000, 0, 0, true); !known {
		t.Error("the newest answer was evicted")
	}
	ds := k.debts(make([]debt, 0, 2000))
	if int64(len(ds)) != 8 && len(ds) != int(k.used.Load()) {
		t.Logf("%d debts listed", len(ds))
	}
	for i := range ds {
		k.settle(&ds[i], true)
	}
	if newLastKnown(0) != nil || newLastKnown(-1) != nil {
		t.Error("a table of no entries is not off")
	}
}

func TestLastKnownRecordAllocatesNothing(t *testing.T) {
	k := newLastKnown(1 << 10)
	key := []byte("sl:{abcdefghijklmnop}:rule:0")
	at := int64(0)
	if n := testing.AllocsPerRun(1000, func() {
		at++
		k.record(key, tb10, 3, 0, at, 0)
	}); n != 0 {
		t.Errorf("record allocates %v times", n)
	}
}

func TestLastKnownConcurrent(t *testing.T) {
	k := newLastKnown(256)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				key := []byte(fmt.Sprint("k", (w*7+i)%300))
				switch i % 3 {
				case 0:
					k.record(key, tb10, int64(i%11), 0, int64(i), 0)
				case 1:
					k.take(key, tb10, 1, 0.5, 1.2, int64(i), 0, 0, true)
				default:
					for _, d := range k.debts(make([]debt, 0, 16)) {
						k.settle(&d, i%2 == 0)
					}
				}
			}
		}()
	}
	wg.Wait()
	if n := k.used.Load(); n < 0 || n > 256 {
		t.Errorf("%d keys remembered in a table of 256", n)
	}
}
