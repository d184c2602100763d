package rules

import (
	"fmt"
	"net/netip"
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

// NormalizeIP returns the canonical text of an IP address for keying: an
// IPv4-mapped IPv6 address becomes IPv4, and an IPv6 address is cut to its
// /prefix6 network (64 is the usual choice; 128 keeps the whole address). A
// value that is not an IP (a hostname, as in the NASA log) is returned as it is.
func NormalizeIP(s string, prefix6 int) string {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return s
	}
	a = a.Unmap().WithZone("")
	if a.Is6() && prefix6 > 0 && prefix6 < 128 {
		p, err := a.Prefix(prefix6)
		if err == nil {
			return p.String()
		}
	}
	return a.String()
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
