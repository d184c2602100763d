package rules

import (
	"fmt"
	"strings"
)

// NormalizePath returns the canonical form of a request path, the one that
// rules match and that keys are made of, so that every spelling of a path
// that an origin server routes to one handler matches the same rules and
// counts in the same bucket. It follows RFC 3986 section 6.2.2 (syntax-based
// normalization) and goes as far as nginx goes before it picks a location,
// since a gateway or origin that normalizes further than the limiter would
// let a respelled path past path rules:
//
//  1. An absolute-form target ("https://host/p", as a forward proxy
//     receives it) loses its scheme and authority. A value that then does
//     not begin with '/' (a route name, "*") is returned as it is.
//  2. The query (from the first '?') and a fragment ('#') are dropped:
//     neither is part of a path. Rules that limit by a query parameter name
//     it as a custom key query:NAME (see QueryParam).
//  3. Every percent-encoding is decoded (section 6.2.2.2 decodes those of
//     unreserved characters; nginx decodes all of them, %2F included,
//     before it merges slashes and resolves dot segments, and Go's
//     net/http cleans the decoded path the same way). A '%' not followed by
//     two hex digits stays a literal '%'.
//  4. Dot segments are removed (section 5.2.4), runs of slashes become one
//     (nginx's merge_slashes, Go's ServeMux redirect), and a trailing
//     slash is dropped, except from "/": most frameworks serve /a/ as /a,
//     and for a limiter counting both together is the safe side.
//  5. The result is written back with '%', '?', '#', spaces, control bytes
//     and the bytes of UTF-8 sequences percent-encoded in upper-case hex
//     (section 6.2.2.1: "/caf%C3%A9", "/a%3Fb"), every other byte as itself
//     ("/v1/users/{id}").
//
// Case is kept: paths are case-sensitive for nginx on Linux and for Go's
// ServeMux; a match asks for case folding with IgnoreCase. A path that is
// already canonical, or differs only by its query, is returned without
// allocating.
func NormalizePath(s string) string {
	p, ok := pathPart(s)
	if !ok {
		return s
	}
	if canonicalPath(p) {
		return p
	}
	var stack [256]byte
	return string(appendNormalPath(stack[:0], p))
}

// pathPart returns the path of a request target: past an absolute form's
// scheme and authority, before the query and fragment. ok is false for a
// value that is no path (it does not begin with '/').
func pathPart(s string) (p string, ok bool) {
	if !strings.HasPrefix(s, "/") {
		rest, found := cutScheme(s)
		if !found {
			return s, false
		}
		s = rest
		if i := strings.IndexAny(s, "/?#"); i >= 0 {
			s = s[i:]
		} else {
			s = ""
		}
		if !strings.HasPrefix(s, "/") {
			s = "/" // "http://host" and "http://host?q" are the root
		}
	}
	if i := strings.IndexAny(s, "?#"); i >= 0 {
		s = s[:i]
	}
	return s, true
}

// cutScheme returns what follows "scheme://" in s, if s begins so (RFC 3986
// section 3.1: a letter, then letters, digits, '+', '-', '.').
func cutScheme(s string) (rest string, ok bool) {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case i > 0 && (c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.'):
		case i > 0 && c == ':':
			return strings.CutPrefix(s[i+1:], "//")
		default:
			return "", false
		}
	}
	return "", false
}

// QueryOf returns the query of a request target: what follows the first
// '?', up to a fragment; "" when there is none.
func QueryOf(s string) string {
	i := strings.IndexByte(s, '?')
	if i < 0 {
		return ""
	}
	q := s[i+1:]
	if j := strings.IndexByte(q, '#'); j >= 0 {
		q = q[:j]
	}
	return q
}

// QueryKeyPrefix begins the name of a custom key that a rule fills from a
// query parameter of the request's path: query:page is the value of ?page=.
// Such a key is the only way the query reaches a match or a key (see
// NormalizePath).
const QueryKeyPrefix = "query:"

// QueryParam returns the value of the query parameter name in query (the
// part after '?'), decoded as Go's net/url decodes a query (percent-encodings,
// and '+' as a space), and found reports whether the parameter is present.
// twice is true when it is given more than once with different values:
// origin frameworks disagree on which they read (Go and Rails the first, PHP
// the last), so a limiter must not pick one. Pairs are separated by '&'
// and by ';', as Rack 2, Python's parse_qs before 3.9.2 and Perl's CGI
// split them (HTML 4's recommendation): reading "page=1;x=2" as page "1"
// counts it with every other page=1, where reading it as page "1;x=2" gave
// each x a bucket of its own (found by a fresh user); Go's net/url drops
// such a pair, so its origins see no page, which no limit can bypass. It
// allocates only when the value has to be decoded.
func QueryParam(query, name string) (value string, found, twice bool) {
	for query != "" {
		var pair string
		if i := strings.IndexAny(query, "&;"); i >= 0 {
			pair, query = query[:i], query[i+1:]
		} else {
			pair, query = query, ""
		}
		k, v, _ := strings.Cut(pair, "=")
		if !queryEqual(k, name) {
			continue
		}
		v = queryUnescape(v)
		switch {
		case !found:
			value, found = v, true
		case v != value:
			return value, true, true
		}
	}
	return value, found, false
}

// queryEqual reports whether the query component k decodes to name.
func queryEqual(k, name string) bool {
	if k == name {
		return true
	}
	if strings.IndexByte(k, '%') < 0 && strings.IndexByte(k, '+') < 0 {
		return false
	}
	return queryUnescape(k) == name
}

// queryUnescape decodes a query component: %XX and '+' (a space). An
// invalid escape stays as it is.
func queryUnescape(s string) string {
	if strings.IndexByte(s, '%') < 0 && strings.IndexByte(s, '+') < 0 {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '+':
			b = append(b, ' ')
		case c == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]):
			b = append(b, unhex(s[i+1])<<4|unhex(s[i+2]))
			i += 2
		default:
			b = append(b, c)
		}
	}
	return string(b)
}

// canonicalPath reports whether p (a path without query) is already in
// NormalizePath's form.
func canonicalPath(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	if len(p) > 1 && p[len(p)-1] == '/' {
		return false
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '%':
			// Only an escape that has to stay one: upper-case hex of a byte
			// that is not a path character.
			if i+2 >= len(p) || !upperHex(p[i+1]) || !upperHex(p[i+2]) || pathChar(unhex(p[i+1])<<4|unhex(p[i+2])) {
				return false
			}
			i += 2
		case !pathChar(c):
			return false
		case c == '/':
			// An empty segment ("//") or a dot segment ("/." or "/..").
			rest := p[i+1:]
			if rest == "" && i > 0 {
				return false
			}
			if strings.HasPrefix(rest, "/") || rest == "." || rest == ".." || strings.HasPrefix(rest, "./") || strings.HasPrefix(rest, "../") {
				return false
			}
		}
	}
	return true
}

func upperHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'A' && c <= 'F' }

// pathChar reports whether c stands for itself in a canonical path:
// printable ASCII other than '%', '?' and '#', which would read as an escape,
// a query and a fragment. (RFC 3986's pchar is narrower; every other byte is
// decoded alike by nginx and Go's ServeMux, so writing it as itself keeps
// rule values readable, {id} included, and the form unique.)
func pathChar(c byte) bool {
	return c > ' ' && c < 0x7f && c != '%' && c != '?' && c != '#'
}

// appendNormalPath appends the canonical form of the path p (which begins
// with '/', and has no query) to dst.
func appendNormalPath(dst []byte, p string) []byte {
	// Decode every escape first: a decoded '/' or '.' counts as one.
	var decStack [256]byte
	dec := decStack[:0]
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c == '%' && i+2 < len(p) && isHex(p[i+1]) && isHex(p[i+2]) {
			c = unhex(p[i+1])<<4 | unhex(p[i+2])
			i += 2
		}
		dec = append(dec, c)
	}
	// Walk the segments, remembering where each kept one begins in dst to
	// resolve "..".
	start := len(dst)
	var segStack [32]int
	segs := segStack[:0]
	for i := 0; i < len(dec); {
		if dec[i] == '/' {
			i++
			continue
		}
		j := i
		for j < len(dec) && dec[j] != '/' {
			j++
		}
		seg := dec[i:j]
		i = j
		switch {
		case len(seg) == 1 && seg[0] == '.':
		case len(seg) == 2 && seg[0] == '.' && seg[1] == '.':
			if n := len(segs); n > 0 {
				dst = dst[:segs[n-1]]
				segs = segs[:n-1]
			}
		default:
			segs = append(segs, len(dst))
			dst = append(dst, '/')
			for _, c := range seg {
				dst = appendPathByte(dst, c)
			}
		}
	}
	if len(dst) == start {
		dst = append(dst, '/')
	}
	return dst
}

// appendPathByte appends c to a canonical path: itself, or percent-encoded.
func appendPathByte(dst []byte, c byte) []byte {
	if pathChar(c) && c != '/' {
		return append(dst, c)
	}
	const hex = "0123456789ABCDEF"
	return append(dst, '%', hex[c>>4], hex[c&15])
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

// normalPathValue is NormalizePath for a value written in a rule: the same
// form, so that the rule's value equals the requests' it is meant for. A
// prefix keeps its trailing slash (prefix /admin/ is not prefix /admin,
// which /administrator passes).
func normalPathValue(v string, prefix bool) string {
	if v == "" {
		return v
	}
	n := NormalizePath(v)
	if prefix && strings.HasSuffix(v, "/") && n != "/" {
		n += "/"
	}
	return n
}

// NormalizeRequest puts a request's path and route descriptors in the form
// set's rules match (NormalizePath; a route that is a name stays as it is),
// after filling from the path's query each query:NAME custom key that set's
// rules match and d does not carry (QueryParam). The enforcer calls it for
// every way in, before any rule is matched; sluice rules explain too. It
// allocates only when a value changes other than by losing its query, or a
// parameter has to be decoded.
//
// It returns an error for a query parameter a rule names that the path
// gives twice with different values: origins differ on which they read.
func NormalizeRequest(d *Descriptors, set *Set) error {
	if p := d[KeyPath]; p != "" {
		if err := fillQueryKeys(d, set, p); err != nil {
			return err
		}
		d[KeyPath] = NormalizePath(p)
	}
	if r := d[KeyRoute]; r != "" {
		d[KeyRoute] = NormalizePath(r)
	}
	return nil
}

// fillQueryKeys sets each query:NAME custom key that set's rules match, and
// that d does not carry already, from the query of path.
func fillQueryKeys(d *Descriptors, set *Set, path string) error {
	keys := set.QueryKeys()
	if len(keys) == 0 {
		return nil
	}
	q := QueryOf(path)
	if q == "" {
		return nil
	}
	for _, k := range keys {
		if d.Custom(k) != "" {
			continue // given by the gateway as a descriptor of its own
		}
		name := k[len(QueryKeyPrefix):]
		v, found, twice := QueryParam(q, name)
		if twice {
			return fmt.Errorf("the path's query gives parameter %q twice, with different values, and a rule limits by it (%s): origins differ on which one they read", name, k)
		}
		if found && v != "" {
			d.SetCustom(k, v) // no free slot: the key is missing, as for a request with too many custom keys
		}
	}
	return nil
}
