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
	var b [EntityTagLen]byte
	return string(AppendEntityTag(b[:0], r, d))
}

// EntityTagLen is the length of an entity tag in bytes.
const EntityTagLen = 32

// AppendEntityTag appends the EntityTag of r for d to dst. It allocates
// nothing unless the matched values together exceed 1 KiB or dst is full.
func AppendEntityTag(dst []byte, r *Rule, d *Descriptors) []byte {
	var stack [1024]byte
	in := stack[:0]
	for _, m := range r.Match {
		v := d[m.Key]
		in = append(in, byte(m.Key))
		in = binary.BigEndian.AppendUint32(in, uint32(len(v)))
		in = append(in, v...)
	}
	sum := sha256.Sum256(in)
	return hex.AppendEncode(dst, sum[:16])
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
