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
// nothing unless the matched values together exceed 128 bytes or dst is
// full; hot paths keep a buffer with AppendEntityTagScratch instead.
func AppendEntityTag(dst []byte, r *Rule, d *Descriptors) []byte {
	var stack [128]byte
	dst, _ = AppendEntityTagScratch(dst, stack[:0], r, d)
	return dst
}

// AppendEntityTagScratch is AppendEntityTag with the text to hash built in
// scratch, which it returns (grown if it had to be): a caller that keeps
// the buffer allocates nothing, and its goroutine's stack stays small (a
// large buffer on the stack made every request's goroutine grow its stack,
// a tenth of the sidecar's CPU).
func AppendEntityTagScratch(dst, scratch []byte, r *Rule, d *Descriptors) (tag, buf []byte) {
	in := scratch[:0]
	for i := range r.Match {
		m := &r.Match[i]
		in = append(in, byte(m.Key))
		if m.Key == KeyCustom {
			in = binary.BigEndian.AppendUint32(in, uint32(len(m.Name)))
			in = append(in, m.Name...)
		}
		if m.Shared {
			// One bucket for every value that passes: the condition keys it.
			in = m.appendCondition(append(in, 0xff))
			continue
		}
		v := d.Get(m.Key, m.Name)
		in = binary.BigEndian.AppendUint32(in, uint32(len(v)))
		if m.IgnoreCase {
			// One bucket for every case of the value: the case the match folds.
			for i := 0; i < len(v); i++ {
				in = append(in, lowerASCII(v[i]))
			}
			continue
		}
		in = append(in, v...)
	}
	sum := sha256.Sum256(in)
	return hex.AppendEncode(dst, sum[:16]), in
}

// EntityValue is the human-readable form of the entity a rule limits for one
// request, e.g. "client_ip=198.51.100.7" — for reports and logs, never for keys.
func EntityValue(r *Rule, d *Descriptors) string {
	s := ""
	for i := range r.Match {
		m := &r.Match[i]
		if i > 0 {
			s += ","
		}
		if m.Shared {
			s += m.KeyName() + " " + m.Condition()
			continue
		}
		s += m.KeyName() + "=" + d.Get(m.Key, m.Name)
	}
	return s
}

// appendCondition appends an unambiguous encoding of m's value condition
// (every string length-prefixed, every part tagged), without allocating.
func (m *Match) appendCondition(in []byte) []byte {
	str := func(in []byte, tag byte, v string) []byte {
		in = append(in, tag)
		in = binary.BigEndian.AppendUint32(in, uint32(len(v)))
		return append(in, v...)
	}
	in = str(in, 'v', m.Value)
	for _, v := range m.Values {
		in = str(in, 'l', v)
	}
	in = str(in, 'p', m.Prefix)
	in = str(in, 'w', m.Wildcard)
	for _, p := range m.CIDR {
		in = p.AppendTo(append(in, 'c'))
		in = append(in, 0)
	}
	in = str(in, 't', m.Template)
	for _, v := range m.Not {
		in = str(in, 'n', v)
	}
	for _, v := range m.NotPrefix {
		in = str(in, 'N', v)
	}
	if m.IgnoreCase {
		in = append(in, 'i')
	}
	return in
}
