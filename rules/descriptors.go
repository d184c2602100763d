package rules

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// Key names one well-known descriptor of a request. The well-known keys are
// fixed so that matching indexes an array instead of hashing strings; any
// other name is a custom key (KeyCustom), carried by name (see
// Descriptors.SetCustom).
type Key uint8

// The well-known descriptor keys. Their YAML names are the strings in keyNames
// (api_key, user, tenant, client_ip, asn, ja4, method, route, path, account,
// org, tier).
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
	// KeyAccount, KeyOrg and KeyTier are filled from the key store
	// (see KeyStore) when a request carries an API key and not these, so
	// that limits per key, account and organisation are checked together.
	KeyAccount
	KeyOrg
	KeyTier
	NumKeys
	// KeyCustom marks a Match on a custom key, named by Match.Name. It is
	// not an index into Descriptors.
	KeyCustom = NumKeys
)

var keyNames = [NumKeys]string{"api_key", "user", "tenant", "client_ip", "asn", "ja4", "method", "route", "path", "account", "org", "tier"}

// String returns the key's YAML name.
func (k Key) String() string {
	switch {
	case k < NumKeys:
		return keyNames[k]
	case k == KeyCustom:
		return "custom"
	}
	return fmt.Sprintf("Key(%d)", uint8(k))
}

// ParseKey maps a YAML name such as "client_ip" to its well-known Key.
func ParseKey(s string) (Key, error) {
	for i, n := range keyNames {
		if n == s {
			return Key(i), nil
		}
	}
	return 0, fmt.Errorf("unknown descriptor key %q (want one of %v)", s, keyNames)
}

// KeyFor maps a descriptor key name to a Key: a well-known key's own name, or
// one of the aliases that Envoy's rate limit filter and envoyproxy/ratelimit
// configs use for them (remote_address and masked_remote_address for
// client_ip, user_id, tenant_id, x-api-key and api-key, :method, :path). Any
// other valid name is a custom key: KeyCustom, with the name kept as it is.
// ok is false for a name that is not a valid custom key (see ValidKeyName).
func KeyFor(name string) (k Key, ok bool) {
	if k, ok := keyAliases[name]; ok {
		return k, true
	}
	return KeyCustom, ValidKeyName(name)
}

// keyAliases are KeyFor's names: every well-known key's own, and the aliases.
var keyAliases = func() map[string]Key {
	m := map[string]Key{
		"x-api-key": KeyAPIKey, "api-key": KeyAPIKey,
		"user_id":        KeyUser,
		"tenant_id":      KeyTenant,
		"remote_address": KeyClientIP, "masked_remote_address": KeyClientIP,
		":method": KeyMethod,
		":path":   KeyPath,
	}
	for k := range NumKeys {
		m[keyNames[k]] = k
	}
	return m
}()

// ValidKeyName reports whether name can be a custom descriptor key: 1 to 64
// characters of printable ASCII other than space, as Envoy's descriptor entry keys
// are in practice (generic_key, header_match, destination_cluster, x-tenant).
func ValidKeyName(name string) bool {
	if name == "" || len(name) > maxIDLen {
		return false
	}
	for i := 0; i < len(name); i++ {
		if name[i] <= ' ' || name[i] > '~' {
			return false
		}
	}
	return true
}

// MaxCustom is how many custom keys one request's Descriptors can carry.
const MaxCustom = 8

// Descriptors are a request's descriptor values: the well-known ones indexed
// by Key, then up to MaxCustom custom keys as name and value pairs (set with
// SetCustom, read with Custom). An empty string means the request does not
// carry that descriptor. The zero value is a request with no descriptors. ASN
// is its decimal text ("0" or "" = unknown).
type Descriptors [NumKeys + 2*MaxCustom]string

// Custom returns the value of the custom key name, or "".
func (d *Descriptors) Custom(name string) string {
	for i := int(NumKeys); i < len(d); i += 2 {
		if d[i] == name && name != "" {
			return d[i+1]
		}
	}
	return ""
}

// SetCustom sets the custom key name to value (replacing a value it had). It
// returns false, changing nothing, when name is empty or all MaxCustom slots
// hold other keys. An empty value removes the key.
func (d *Descriptors) SetCustom(name, value string) bool {
	if name == "" {
		return false
	}
	free := -1
	for i := int(NumKeys); i < len(d); i += 2 {
		switch {
		case d[i] == name:
			if value == "" {
				d[i] = ""
			}
			d[i+1] = value
			return true
		case d[i] == "" && free < 0:
			free = i
		}
	}
	if value == "" {
		return true
	}
	if free < 0 {
		return false
	}
	d[free], d[free+1] = name, value
	return true
}

// CustomAt returns the i-th custom slot (0 <= i < MaxCustom): its name and
// value, "" when the slot is free.
func (d *Descriptors) CustomAt(i int) (name, value string) {
	j := int(NumKeys) + 2*i
	return d[j], d[j+1]
}

// Get returns the value of a match's key: d[k] for a well-known key, the
// custom key name's for KeyCustom.
func (d *Descriptors) Get(k Key, name string) string {
	if k < NumKeys {
		return d[k]
	}
	return d.Custom(name)
}

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

// ErrNotAnAddress is returned by CheckClientIP for a client_ip value that
// looks like an IP address but is none (999.1.1.1, 01.2.3.4, 1.2.3).
var ErrNotAnAddress = errors.New("not an IP address")

// CheckClientIP classifies a client_ip value. It returns nil for an address
// (in any form NormalizeIP reads: spaces, a port, a zone), a network (as
// Envoy's masked_remote_address sends it, "2001:db8::/64") or a name (a
// hostname in a replayed log, with a letter outside a–f or another byte no
// address has), and ErrNotAnAddress, wrapped with the value, for a text made
// only of the bytes of addresses (digits, a–f, '.', ':', '[', ']', '/', spaces)
// that is neither: 999.1.1.1, " 999.1.1.1", 01.2.3.4 (leading zeros are
// octal to inet_aton, so no reading of them is safe), 2001:db8::1::2. Such a
// text must not get a bucket of its own, or 01.2.3.4 would dodge 1.2.3.4's.
// isName is true for a name. It allocates only for the error.
func CheckClientIP(s string) (isName bool, err error) {
	if _, ok := parseIP(s); ok {
		return false, nil
	}
	t := strings.TrimSpace(s)
	if _, err := netip.ParsePrefix(t); err == nil {
		return false, nil
	}
	digit := false
	for i := 0; i < len(t); i++ {
		c := t[i]
		switch {
		case c >= '0' && c <= '9':
			digit = true
		case c >= 'a' && c <= 'f', c >= 'A' && c <= 'F', c == '.', c == ':', c == '[', c == ']', c == '/', c == ' ', c == '\t':
		default:
			return true, nil
		}
	}
	if !digit {
		return true, nil // "cafe.be", "dead.beef": names of hex letters
	}
	return false, fmt.Errorf("%q: %w (write it as Go's net/netip reads it: 1.2.3.4, 2001:db8::7, [2001:db8::7]:443)", s, ErrNotAnAddress)
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
	if k > KeyCustom {
		return nil, fmt.Errorf("unknown descriptor key %d", uint8(k))
	}
	return []byte(k.String()), nil
}

// UnmarshalText parses a key's YAML name, or "custom".
func (k *Key) UnmarshalText(b []byte) error {
	if string(b) == "custom" {
		*k = KeyCustom
		return nil
	}
	v, err := ParseKey(string(b))
	if err != nil {
		return err
	}
	*k = v
	return nil
}
