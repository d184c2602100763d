package rules

import (
	"fmt"
	"net/netip"
	"strings"
)

// Key names one descriptor of a request. The set is fixed so that matching
// indexes an array instead of hashing strings; custom keys arrive with the
// rules issue.
type Key uint8

// The descriptor keys a rule can match on. Their YAML names are the strings in
// keyNames (api_key, user, tenant, client_ip, asn, ja4, method, route, path).
const (
	KeyAPIKey Key = iota
	KeyUser
	KeyTenant
	KeyClientIP
	KeyASN
	KeyJA4
	KeyMethod
	KeyRoute
	KeyPath
	NumKeys
)

var keyNames = [NumKeys]string{"api_key", "user", "tenant", "client_ip", "asn", "ja4", "method", "route", "path"}

// String returns the key's YAML name.
func (k Key) String() string {
	if k < NumKeys {
		return keyNames[k]
	}
	return fmt.Sprintf("Key(%d)", uint8(k))
}

// ParseKey maps a YAML name such as "client_ip" to its Key.
func ParseKey(s string) (Key, error) {
	for i, n := range keyNames {
		if n == s {
			return Key(i), nil
		}
	}
	return 0, fmt.Errorf("unknown descriptor key %q (want one of %v)", s, keyNames)
}

// Descriptors are a request's descriptor values, indexed by Key. An empty
// string means the request does not carry that descriptor. The zero value is a
// request with no descriptors. ASN is its decimal text ("0" or "" = unknown).
type Descriptors [NumKeys]string

// NormalizeIP returns the canonical text of an IP address for keying:
// surrounding spaces, a port ("192.0.2.7:5555", "[2001:db8::1]:443", as in
// http.Request.RemoteAddr) and a zone are dropped, an IPv4-mapped IPv6
// address becomes IPv4, and an IPv6 address is cut to its /prefix6 network
// (64 is the usual choice; 128 keeps the whole address). A value that is not
// an IP (a hostname, as in the NASA log) is returned as it is.
func NormalizeIP(s string, prefix6 int) string {
	var buf [64]byte
	b, ok := AppendNormalIP(buf[:0], s, prefix6)
	if !ok || string(b) == s {
		return s
	}
	return string(b)
}

// AppendNormalIP appends NormalizeIP's form of s to dst; ok is false, and dst
// unchanged, when s is not an IP address. It allocates nothing when dst has
// room.
func AppendNormalIP(dst []byte, s string, prefix6 int) (_ []byte, ok bool) {
	a, ok := parseIP(s)
	if !ok {
		return dst, false
	}
	a = a.Unmap().WithZone("")
	if a.Is6() && prefix6 > 0 && prefix6 < 128 {
		if p, err := a.Prefix(prefix6); err == nil {
			return p.AppendTo(dst), true
		}
	}
	return a.AppendTo(dst), true
}

// parseIP parses an address, with or without a port, a zone or spaces.
func parseIP(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	if a, err := netip.ParseAddr(s); err == nil {
		return a, true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr(), true
	}
	if i := strings.IndexByte(s, '%'); i > 0 && strings.IndexByte(s, ':') < 0 { // an IPv4 address with a zone
		if a, err := netip.ParseAddr(s[:i]); err == nil {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// MarshalText writes the key's YAML name, so JSON shows "client_ip", not 3.
func (k Key) MarshalText() ([]byte, error) {
	if k >= NumKeys {
		return nil, fmt.Errorf("unknown descriptor key %d", uint8(k))
	}
	return []byte(keyNames[k]), nil
}

// UnmarshalText parses a key's YAML name.
func (k *Key) UnmarshalText(b []byte) error {
	v, err := ParseKey(string(b))
	if err != nil {
		return err
	}
	*k = v
	return nil
}
