package backoff

import "unicode/utf8"

// A parser for Structured Field Lists, RFC 9651 §4.2 (which obsoletes RFC
// 8941): the RateLimit fields are Lists of Items with Parameters. Every bare
// item type is checked (Integers, Decimals, Strings, Tokens, Byte Sequences,
// Booleans, Dates, Display Strings, and Inner Lists) so that a malformed
// field is rejected whole, as §4.2 requires; only Integer values are kept.

type sfKind uint8

const (
	sfInteger sfKind = iota + 1
	sfOther          // any other bare item; its value is not kept
	sfString
)

// sfParam is one parameter; n is its value when kind is sfInteger.
type sfParam struct {
	key  string
	kind sfKind
	n    int64
}

// maxSFParams bounds the parameters kept per item; more make the field
// malformed (a defence against a hostile header, not an RFC limit).
const maxSFParams = 32

type sfParser struct {
	s      string
	i      int
	params []sfParam
	buf    [8]sfParam
}

// parseList parses v as a List and calls each for every member, in order:
// name is the item's String (or Token) value, isString whether it was a
// String, params its parameters (valid only during the call). An Inner List
// member has an empty name and isString false. parseList returns false, and
// stops, when v is malformed or each returns false; members seen before that
// were already passed to each, so callers commit their results only on true.
// An empty v is an empty List.
func parseList(v string, each func(name string, isString bool, params []sfParam) bool) bool {
	p := sfParser{s: v}
	p.params = p.buf[:0]
	p.skipSP()
	for p.i < len(p.s) {
		name, kind, ok := p.member()
		if !ok || !each(name, kind == sfString, p.params) {
			return false
		}
		p.skipOWS()
		if p.i == len(p.s) {
			return true
		}
		if p.s[p.i] != ',' {
			return false
		}
		p.i++
		p.skipOWS()
		if p.i == len(p.s) {
			return false // a trailing comma
		}
	}
	return true
}

func (p *sfParser) skipSP() {
	for p.i < len(p.s) && p.s[p.i] == ' ' {
		p.i++
	}
}

func (p *sfParser) skipOWS() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

// member parses an Item or an Inner List and its parameters (§4.2.1.1).
func (p *sfParser) member() (name string, kind sfKind, ok bool) {
	if p.i < len(p.s) && p.s[p.i] == '(' {
		if !p.innerList() {
			return "", 0, false
		}
		return "", sfOther, p.parameters()
	}
	name, kind, _, ok = p.bareItem()
	if !ok {
		return "", 0, false
	}
	return name, kind, p.parameters()
}

// innerList parses an Inner List (§4.2.1.2), discarding it.
func (p *sfParser) innerList() bool {
	p.i++ // (
	for p.i < len(p.s) {
		p.skipSP()
		if p.i < len(p.s) && p.s[p.i] == ')' {
			p.i++
			return true
		}
		if _, _, _, ok := p.bareItem(); !ok {
			return false
		}
		saved := p.params
		p.params = nil // an inner item's parameters are not the member's
		ok := p.parameters()
		p.params = saved[:0]
		if !ok || p.i == len(p.s) || (p.s[p.i] != ' ' && p.s[p.i] != ')') {
			return false
		}
	}
	return false
}

// parameters parses Parameters (§4.2.3.2) into p.params (or discards them
// when p.params is nil). A repeated key keeps its last value.
func (p *sfParser) parameters() bool {
	if p.params != nil {
		p.params = p.params[:0]
	}
	for p.i < len(p.s) && p.s[p.i] == ';' {
		p.i++
		p.skipSP()
		key, ok := p.key()
		if !ok {
			return false
		}
		prm := sfParam{key: key, kind: sfOther} // a bare key is Boolean true
		if p.i < len(p.s) && p.s[p.i] == '=' {
			p.i++
			_, kind, n, ok := p.bareItem()
			if !ok {
				return false
			}
			prm.kind, prm.n = kind, n
		}
		if p.params == nil {
			continue
		}
		replaced := false
		for j := range p.params {
			if p.params[j].key == key {
				p.params[j], replaced = prm, true
			}
		}
		if !replaced {
			if len(p.params) == maxSFParams {
				return false
			}
			p.params = append(p.params, prm)
		}
	}
	return true
}

// key parses a Key (§4.2.3.3): lcalpha or "*", then lcalpha, DIGIT, "_",
// "-", "." or "*".
func (p *sfParser) key() (string, bool) {
	start := p.i
	if p.i == len(p.s) || !(isLower(p.s[p.i]) || p.s[p.i] == '*') {
		return "", false
	}
	for p.i++; p.i < len(p.s); p.i++ {
		c := p.s[p.i]
		if !(isLower(c) || isDigit(c) || c == '_' || c == '-' || c == '.' || c == '*') {
			break
		}
	}
	return p.s[start:p.i], true
}

// bareItem parses a Bare Item (§4.2.3.1). name is a String's or Token's
// value; n an Integer's.
func (p *sfParser) bareItem() (name string, kind sfKind, n int64, ok bool) {
	if p.i == len(p.s) {
		return "", 0, 0, false
	}
	switch c := p.s[p.i]; {
	case c == '-' || isDigit(c):
		n, isInt, ok := p.number()
		if isInt {
			return "", sfInteger, n, ok
		}
		return "", sfOther, 0, ok
	case c == '"':
		s, ok := p.str()
		return s, sfString, 0, ok
	case c == '*' || isAlpha(c):
		return p.token(), sfOther, 0, true
	case c == ':':
		return "", sfOther, 0, p.byteSeq()
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			p.i += 2
			return "", sfOther, 0, true
		}
		return "", 0, 0, false
	case c == '@': // a Date (§4.2.9): an Integer
		p.i++
		_, isInt, ok := p.number()
		return "", sfOther, 0, ok && isInt
	case c == '%':
		return "", sfOther, 0, p.displayString()
	}
	return "", 0, 0, false
}

// number parses an Integer or Decimal (§4.2.4): at most 15 integer digits,
// or 12 and 1 to 3 fractional digits.
func (p *sfParser) number() (n int64, isInt, ok bool) {
	neg := false
	if p.i < len(p.s) && p.s[p.i] == '-' {
		neg = true
		p.i++
	}
	if p.i == len(p.s) || !isDigit(p.s[p.i]) {
		return 0, false, false
	}
	intDigits, fracDigits, dot := 0, 0, false
	for ; p.i < len(p.s); p.i++ {
		c := p.s[p.i]
		switch {
		case isDigit(c) && !dot:
			if intDigits == 15 {
				return 0, false, false
			}
			n = n*10 + int64(c-'0')
			intDigits++
		case isDigit(c):
			if fracDigits == 3 {
				return 0, false, false
			}
			fracDigits++
		case c == '.' && !dot:
			if intDigits > 12 {
				return 0, false, false
			}
			dot = true
		default:
			goto done
		}
	}
done:
	if dot && fracDigits == 0 {
		return 0, false, false
	}
	if neg {
		n = -n
	}
	return n, !dot, true
}

// str parses a String (§4.2.5): printable ASCII, with \" and \\ escapes.
func (p *sfParser) str() (string, bool) {
	p.i++ // "
	start := p.i
	var b []byte // only when there is an escape
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '\\':
			if p.i == len(p.s) || (p.s[p.i] != '"' && p.s[p.i] != '\\') {
				return "", false
			}
			if b == nil {
				b = append([]byte(nil), p.s[start:p.i-1]...)
			}
			b = append(b, p.s[p.i])
			p.i++
		case c == '"':
			if b != nil {
				return string(b), true
			}
			return p.s[start : p.i-1], true
		case c < 0x20 || c > 0x7e:
			return "", false
		default:
			if b != nil {
				b = append(b, c)
			}
		}
	}
	return "", false // no closing quote
}

// token parses a Token (§4.2.6): ALPHA or "*", then tchar, ":" or "/".
func (p *sfParser) token() string {
	start := p.i
	for p.i++; p.i < len(p.s) && (isTchar(p.s[p.i]) || p.s[p.i] == ':' || p.s[p.i] == '/'); p.i++ {
	}
	return p.s[start:p.i]
}

// byteSeq parses a Byte Sequence (§4.2.7): base64 characters between
// colons. It is not decoded.
func (p *sfParser) byteSeq() bool {
	p.i++ // :
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		if c == ':' {
			return true
		}
		if !(isAlpha(c) || isDigit(c) || c == '+' || c == '/' || c == '=') {
			return false
		}
	}
	return false
}

// displayString parses a Display String (§4.2.10): %" then printable
// ASCII with %xx (lowercase hex) escapes, "-terminated, decoding to UTF-8.
func (p *sfParser) displayString() bool {
	p.i++ // %
	if p.i == len(p.s) || p.s[p.i] != '"' {
		return false
	}
	p.i++
	var b []byte
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '%':
			if p.i+2 > len(p.s) || !isLowerHex(p.s[p.i]) || !isLowerHex(p.s[p.i+1]) {
				return false
			}
			b = append(b, unhex(p.s[p.i])<<4|unhex(p.s[p.i+1]))
			p.i += 2
		case c == '"':
			return utf8.Valid(b)
		case c < 0x20 || c > 0x7e:
			return false
		default:
			b = append(b, c)
		}
	}
	return false
}

func isDigit(c byte) bool    { return '0' <= c && c <= '9' }
func isLower(c byte) bool    { return 'a' <= c && c <= 'z' }
func isAlpha(c byte) bool    { return isLower(c) || ('A' <= c && c <= 'Z') }
func isLowerHex(c byte) bool { return isDigit(c) || ('a' <= c && c <= 'f') }

func unhex(c byte) byte {
	if isDigit(c) {
		return c - '0'
	}
	return c - 'a' + 10
}

// isTchar: RFC 9110 §5.6.2.
func isTchar(c byte) bool {
	if isAlpha(c) || isDigit(c) {
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}
