package enforcer_test

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
)

// slotKeys returns the hash-tag edge cases and n random keys of random bytes
// with braces sprinkled in.
func slotKeys(n int) []string {
	keys := []string{
		"", "a", "123456789", "{", "}", "{}", "}{", "{{}}", "}{a}", "{}{a}", "{a}{b}",
		"a{b}c{d}", "a{}b{c}", "{a", "a}", "a{b", "{{a}}", "{user1000}.following",
		"{user1000}.followers", "foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}",
		"\x00", "\xff\xfe{\x00}", "{\r\n}", "sl:{0123456789abcdef0123456789abcdef}:r1",
		strings.Repeat("k", 10<<10), "{tag}" + strings.Repeat("\xff", 10<<10),
		strings.Repeat("{", 100) + "x}",
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range n {
		b := make([]byte, r.IntN(48))
		for i := range b {
			switch r.IntN(8) {
			case 0:
				b[i] = '{'
			case 1:
				b[i] = '}'
			default:
				b[i] = byte(r.Uint32())
			}
		}
		keys = append(keys, string(b))
	}
	return keys
}

// TestSlot checks Slot against a real server's CLUSTER KEYSLOT.
func TestSlot(t *testing.T) {
	if got := enforcer.Slot("123456789"); got != 0x31C3 {
		t.Errorf("Slot(\"123456789\") = %#x, want the CRC16 check value 0x31C3", got)
	}
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: redistest.ClusterAddrs(t)[0]})
	t.Cleanup(func() { c.Close() })
	keys := slotKeys(500)
	cmds := make([]*redis.IntCmd, len(keys))
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = p.ClusterKeySlot(ctx, k)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		if got, want := enforcer.Slot(k), cmds[i].Val(); int64(got) != want {
			t.Errorf("Slot(%.40q) = %d, CLUSTER KEYSLOT says %d", k, got, want)
		}
	}
}

func TestSlotAllocs(t *testing.T) {
	key := "sl:{0123456789abcdef0123456789abcdef}:r1"
	if n := testing.AllocsPerRun(100, func() { enforcer.Slot(key) }); n != 0 {
		t.Errorf("Slot allocates %v times, want 0", n)
	}
}

func BenchmarkSlot(b *testing.B) {
	for _, bc := range []struct{ name, key string }{
		{"tagged", "sl:{0123456789abcdef0123456789abcdef}:r1"},
		{"whole", "sl:0123456789abcdef0123456789abcdef:r1"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.key)))
			for b.Loop() {
				enforcer.Slot(bc.key)
			}
		})
	}
}
