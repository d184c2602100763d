package rules

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// EntityTag identifies the entity a rule limits for one request: a 128-bit
// SHA-256 prefix, as 32 hex characters, of the rule's match keys and the
// request's values for them, each value length-prefixed. Client-supplied
// values therefore never reach a Redis key as they are: no value can move a
// key to another Cluster slot (no braces), collide with another entity
// (length prefixes, 128 bits), or make a key longer. Rules that match the same
// keys share a tag, so their buckets for one entity share a Redis hash tag.
//
// The same tag keys a global rule's per-entity share (see Share).
func EntityTag(r *Rule, d *Descriptors) string {
	h := sha256.New()
	var n [5]byte
	for _, m := range r.Match {
		v := d[m.Key]
		n[0] = byte(m.Key)
		binary.BigEndian.PutUint32(n[1:], uint32(len(v)))
		h.Write(n[:])
		h.Write([]byte(v))
	}
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:16])
}

// EntityValue is the human-readable form of the entity a rule limits for one
// request, e.g. "client_ip=198.51.100.7" — for reports and logs, never for keys.
func EntityValue(r *Rule, d *Descriptors) string {
	s := ""
	for i, m := range r.Match {
		if i > 0 {
			s += ","
		}
		s += m.Key.String() + "=" + d[m.Key]
	}
	return s
}
