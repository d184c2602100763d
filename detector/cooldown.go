package detector

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/sluice-rl/sluice/pipeline/stage"
)

// coolDown remembers, per scope, when its last rule expires: a scope is not
// emitted again while its rule has more than half its TTL left. The zero
// value is empty and ready to use.
type coolDown map[string]time.Time

// fresh reports whether key's rule still has more than ttl/2 left at end.
func (c coolDown) fresh(key string, end time.Time, ttl time.Duration) bool {
	exp, ok := c[key]
	return ok && exp.Sub(end) > ttl/2
}

// expire forgets the rules expired at end.
func (c coolDown) expire(end time.Time) {
	for k, exp := range c {
		if !exp.After(end) {
			delete(c, k)
		}
	}
}

// merge keeps, per key, the later expiry of c and o, in c: signals whose
// time scales share one cool-down restore each scale's copy into it.
func (c coolDown) merge(o coolDown) {
	for k, exp := range o {
		if exp.After(c[k]) {
			c[k] = exp
		}
	}
}

// appendTo encodes c, sorted by key.
func (c coolDown) appendTo(b []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(c)))
	for _, k := range slices.Sorted(maps.Keys(c)) {
		b = stage.AppendString(b, k)
		b = binary.AppendVarint(b, c[k].UnixMilli())
	}
	return b
}

// readCoolDown decodes what appendTo wrote from r.
func readCoolDown(r *stage.StateReader) coolDown {
	c := coolDown{}
	for range r.Count(2) {
		k := r.String()
		c[k] = time.UnixMilli(r.Varint())
	}
	return c
}

// decodeCoolDown decodes a state that is only a coolDown.
func decodeCoolDown(b []byte, what string) (coolDown, error) {
	r := stage.NewStateReader(b)
	c := readCoolDown(r)
	if err := r.Done(); err != nil {
		return nil, fmt.Errorf("detector: %s state: %w", what, err)
	}
	return c, nil
}
