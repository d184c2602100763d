package enforcer

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"sync"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/rules"
)

// normalize puts a request's descriptors in the form rules match and keys
// are made of, the one step every way in shares (Envoy's gRPC, /v1/check,
// forward-auth, the middleware, replays): the query parameters that set's
// rules name (query:NAME custom keys) are read from the path's query, the
// path and a route that is a path are normalized (rules.NormalizePath: the
// query dropped, escapes decoded, dot segments and duplicate slashes
// removed), and the client address keyed (normalizeIP). It allocates only
// when a value changes other than by losing its query, or a query parameter
// has to be decoded.
//
// It returns an error, which callers wrap in ErrBadRequest, for a client_ip
// that looks like an address but is none (rules.ErrNotAnAddress), and for a
// query parameter a rule names that the path gives twice with different
// values.
func (l *Limiter) normalize(d *rules.Descriptors, set *rules.Set) error {
	if err := rules.NormalizeRequest(d, set); err != nil {
		return err
	}
	if err := l.normalizeIP(d); err != nil {
		return fmt.Errorf("client_ip %w", err)
	}
	return nil
}

// MaxValue is the longest descriptor value (bytes) that a decision record or
// a log line carries as it is. A longer one (a long path, a token) is still
// matched and counted whole: its bucket's Redis key is a hash of fixed length
// whatever the value's (rules.EntityTag), and the request as a whole is
// bounded by the way in (64 KiB at the sidecar). In records it is replaced
// by HashValue's text, so that a record stays small and a long secret never
// leaves the enforcer.
const MaxValue = 4096

// hashedPrefix begins the text HashValue makes of a long value.
const hashedPrefix = "hmac-sha256:"

// HashedValueLen is the length of HashValue's text.
const HashedValueLen = len(hashedPrefix) + 32

// DefaultValueHashKey is the key HashValue uses without Options.ValueHashKey.
// It is public, so records made with it show the same hash for the same
// long value (the detector can still count it) but do not hide it from a
// reader who can guess it; give every enforcer of a deployment one secret
// key (sluice serve --value-hash-key-file) to make them do so.
var DefaultValueHashKey = []byte("sluice descriptor values v1")

// valueHasher is a keyed hash (HMAC-SHA-256, RFC 2104) of long descriptor
// values, safe for concurrent use.
type valueHasher struct {
	pool sync.Pool // of hash.Hash
}

func newValueHasher(key []byte) *valueHasher {
	if len(key) == 0 {
		key = DefaultValueHashKey
	}
	k := append([]byte(nil), key...)
	h := &valueHasher{}
	h.pool.New = func() any { return hmac.New(sha256.New, k) }
	return h
}

// hash returns "hmac-sha256:" and the first 128 bits of v's HMAC-SHA-256 in
// hex.
func (h *valueHasher) hash(v string) string {
	m := h.pool.Get().(hash.Hash)
	m.Reset()
	_, _ = m.Write([]byte(v))
	var sum [sha256.Size]byte
	out := make([]byte, 0, HashedValueLen)
	out = append(out, hashedPrefix...)
	out = hex.AppendEncode(out, m.Sum(sum[:0])[:16])
	h.pool.Put(m)
	return string(out)
}

// HashValue returns the text that stands for a descriptor value longer than
// MaxValue in decision records: "hmac-sha256:" and the first 128 bits, in
// hex, of the value's HMAC-SHA-256 under Options.ValueHashKey. Shorter values
// are returned as they are.
func (l *Limiter) HashValue(v string) string {
	if len(v) <= MaxValue {
		return v
	}
	return l.hasher.hash(v)
}

// hashLongValues replaces every value of rec longer than MaxValue (its
// descriptors and user agent) with HashValue's text.
func (l *Limiter) hashLongValues(rec *decision.Record) {
	for i := range rec.Descriptors {
		if len(rec.Descriptors[i]) > MaxValue {
			rec.Descriptors[i] = l.hasher.hash(rec.Descriptors[i])
		}
	}
	if len(rec.UserAgent) > MaxValue {
		rec.UserAgent = l.hasher.hash(rec.UserAgent)
	}
}
