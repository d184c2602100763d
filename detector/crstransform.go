package detector

// The CRS's transformations (t:...), as the Coraza engine
// (github.com/corazawaf/coraza/v3, internal/transformations, Apache-2.0)
// implements them, which follows ModSecurity's: the native evaluator
// (crs.go) must transform a value exactly as Coraza does for its verdicts
// to agree with Coraza's (TestCRSNativeAgreesWithCoraza). Each function
// returns the transformed value and whether it changed (multiMatch rules
// test every changed step). Ported from Coraza v3.8.1.

import (
	"path/filepath"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/net/html"
)

// crsTransform is one transformation: value in, value out and whether it
// changed.
type crsTransform func(string) (string, bool)

// crsTransforms are the transformations the native evaluator knows, by
// their SecLang names. A rule naming another does not load
// (errCRSUnsupported).
var crsTransforms = map[string]crsTransform{
	"base64Decode":       tBase64Decode,
	"cmdLine":            tCmdLine,
	"compressWhitespace": tCompressWhitespace,
	"cssDecode":          tCSSDecode,
	"htmlEntityDecode":   tHTMLEntityDecode,
	"jsDecode":           tJSDecode,
	"lowercase":          tLowercase,
	"normalisePath":      tNormalizePath,
	"normalizePath":      tNormalizePath,
	"normalisePathWin":   tNormalizePathWin,
	"normalizePathWin":   tNormalizePathWin,
	"removeCommentsChar": tRemoveCommentsChar,
	"removeNulls":        tRemoveNulls,
	"removeWhitespace":   tRemoveWhitespace,
	"replaceComments":    tReplaceComments,
	"urlDecodeUni":       tURLDecodeUni,
	"utf8toUnicode":      tUTF8ToUnicode,
}

func tLowercase(s string) (string, bool) {
	t := strings.ToLower(s)
	return t, t != s
}

func tRemoveNulls(s string) (string, bool) {
	t := strings.ReplaceAll(s, "\x00", "")
	return t, len(t) != len(s)
}

func tHTMLEntityDecode(s string) (string, bool) {
	t := html.UnescapeString(s)
	return t, len(t) != len(s)
}

func tRemoveWhitespace(s string) (string, bool) {
	changed := false
	t := strings.Map(func(r rune) rune {
		if unicode.IsSpace(r) {
			changed = true
			return -1
		}
		return r
	}, s)
	return t, changed
}

func tNormalizePath(s string) (string, bool) {
	if s == "" {
		return s, false
	}
	clean := filepath.Clean(s)
	if clean == "." {
		return "", true
	}
	if s[len(s)-1] == '/' {
		clean += "/"
	}
	return clean, clean != s
}

func tNormalizePathWin(s string) (string, bool) {
	if s == "" {
		return s, false
	}
	clean, _ := tNormalizePath(strings.ReplaceAll(s, `\`, "/"))
	t := winTrimDotsAndSpaces(winStripADS(clean))
	return t, t != s
}

// winStripADS drops an NTFS alternate data stream (file.php::$DATA) from
// the last path segment, keeping a drive letter's colon.
func winStripADS(s string) string {
	prefix := ""
	if len(s) >= 2 && s[1] == ':' && ('a' <= s[0]|0x20 && s[0]|0x20 <= 'z') {
		prefix, s = s[:2], s[2:]
	}
	slash := ""
	if len(s) > 0 && s[len(s)-1] == '/' {
		slash, s = "/", s[:len(s)-1]
	}
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		if c := strings.IndexByte(s[i+1:], ':'); c >= 0 {
			s = s[:i+1+c]
		}
	} else if c := strings.IndexByte(s, ':'); c >= 0 {
		s = s[:c]
	}
	return prefix + s + slash
}

func allDots(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] != '.' {
			return false
		}
	}
	return true
}

// winTrimDotsAndSpaces trims the dots and spaces Windows ignores at the end
// of each path segment (file.php. is file.php), dropping segments left
// empty.
func winTrimDotsAndSpaces(s string) string {
	trim := false
	start := 0
	for i := 0; i <= len(s); i++ {
		if i != len(s) && s[i] != '/' {
			continue
		}
		if seg := s[start:i]; !allDots(seg) {
			if last := seg[len(seg)-1]; last == '.' || last == ' ' {
				trim = true
				break
			}
		}
		start = i + 1
	}
	if !trim {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	start = 0
	wrote := false
	for i := 0; i <= len(s); i++ {
		if i != len(s) && s[i] != '/' {
			continue
		}
		seg := s[start:i]
		start = i + 1
		if !allDots(seg) {
			if seg = strings.TrimRight(seg, ". "); seg == "" {
				continue
			}
		}
		if wrote {
			b.WriteByte('/')
		}
		b.WriteString(seg)
		wrote = true
	}
	return b.String()
}

func tUTF8ToUnicode(s string) (string, bool) {
	pos := -1
	for i, c := range s {
		if c >= utf8.RuneSelf {
			pos = i
			break
		}
	}
	if pos < 0 {
		return s, false
	}
	b := make([]byte, pos, len(s)+8)
	copy(b, s[:pos])
	for _, c := range s[pos:] {
		if c < utf8.RuneSelf {
			b = append(b, byte(c))
			continue
		}
		b = append(b, '%', 'u')
		h := strconv.FormatUint(uint64(c), 16)
		for range 4 - len(h) {
			b = append(b, '0')
		}
		b = append(b, h...)
	}
	return string(b), true
}

var hexNibble = func() (t [256]int8) {
	for i := range t {
		t[i] = -1
	}
	for c := byte('0'); c <= '9'; c++ {
		t[c] = int8(c - '0')
	}
	for c := byte('a'); c <= 'f'; c++ {
		t[c] = int8(c-'a') + 10
		t[c-'a'+'A'] = int8(c-'a') + 10
	}
	return t
}()

func validHex(c byte) bool { return hexNibble[c] >= 0 }

// x2c is the byte two hex digits write.
func x2c(s string) byte { return byte(hexNibble[s[0]])<<4 | byte(hexNibble[s[1]]) }

// tURLDecodeUni decodes %XX, IIS's %uXXXX (to its best-fit ASCII byte, or
// its low byte) and '+'; invalid escapes stay as they are.
func tURLDecodeUni(s string) (string, bool) {
	i := strings.IndexAny(s, "%+")
	if i < 0 {
		return s, false
	}
	d := make([]byte, i, len(s))
	copy(d, s[:i])
	changed := false
	for i < len(s) {
		c := s[i]
		switch {
		case c == '+':
			d = append(d, ' ')
			i++
			changed = true
		case c != '%':
			d = append(d, c)
			i++
		case i+1 < len(s) && (s[i+1] == 'u' || s[i+1] == 'U'):
			if i+5 < len(s) && validHex(s[i+2]) && validHex(s[i+3]) && validHex(s[i+4]) && validHex(s[i+5]) {
				code := rune(hexNibble[s[i+2]])<<12 | rune(hexNibble[s[i+3]])<<8 | rune(hexNibble[s[i+4]])<<4 | rune(hexNibble[s[i+5]])
				b, ok := unicodeBestFitASCII[code]
				if !ok {
					b = x2c(s[i+4:])
					if b > 0 && b < 0x5f && hexNibble[s[i+2]] == 15 && hexNibble[s[i+3]] == 15 {
						b += 0x20 // full-width ASCII
					}
				}
				d = append(d, b)
				i += 6
				changed = true
				continue
			}
			d = append(d, s[i], s[i+1])
			i += 2
		case i+2 < len(s) && validHex(s[i+1]) && validHex(s[i+2]):
			d = append(d, x2c(s[i+1:]))
			i += 3
			changed = true
		default:
			d = append(d, c)
			i++
		}
	}
	return string(d), changed
}

// tCmdLine is ModSecurity's cmdLine: drops \ " ' ^, turns , ; and
// whitespace into one space, drops a space before / and (, lowercases.
func tCmdLine(s string) (string, bool) {
	pos := -1
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'A' <= c && c <= 'Z', strings.IndexByte("\"'\\^ ,;\t\r\n/(", c) >= 0:
			pos = i
		}
		if pos >= 0 {
			break
		}
	}
	if pos < 0 {
		return s, false
	}
	b := make([]byte, pos, len(s))
	copy(b, s[:pos])
	changed, space := false, false
	for i := pos; i < len(s); i++ {
		switch a := s[i]; a {
		case '"', '\'', '\\', '^':
			changed = true
		case ' ', ',', ';', '\t', '\r', '\n':
			if space {
				changed = true
				continue
			}
			if a != ' ' {
				changed = true
			}
			b = append(b, ' ')
			space = true
		case '/', '(':
			if space {
				b = b[:len(b)-1]
				changed = true
			}
			space = false
			b = append(b, a)
		default:
			if 'A' <= a && a <= 'Z' {
				a += 'a' - 'A'
				changed = true
			}
			b = append(b, a)
			space = false
		}
	}
	return string(b), changed
}

func latinSpace(r rune) bool {
	switch r {
	case '\t', '\n', '\v', '\f', '\r', ' ', 0x85, 0xA0:
		return true
	}
	return false
}

func tCompressWhitespace(s string) (string, bool) {
	pos := -1
	for i, r := range s {
		if latinSpace(r) || s[i] == 0xA0 {
			pos = i
			break
		}
	}
	if pos < 0 {
		return s, false
	}
	b := []byte(s[:pos])
	changed, in := false, false
	for i := pos; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if latinSpace(r) || s[i] == 0xA0 {
			if in {
				changed = true
			} else {
				in = true
				if r != ' ' {
					changed = true
				}
				b = append(b, ' ')
			}
		} else {
			in = false
			b = append(b, s[i:i+n]...)
		}
		i += n
	}
	return string(b), changed
}

// tReplaceComments turns each C comment /* ... */ (an unterminated one
// too) into one space.
func tReplaceComments(s string) (string, bool) {
	b := []byte(s)
	i, j, in, changed := 0, 0, false, false
	for i < len(b) {
		switch {
		case !in && b[i] == '/' && i+1 < len(b) && b[i+1] == '*':
			in, changed = true, true
			i += 2
		case !in:
			b[j] = b[i]
			i++
			j++
		case b[i] == '*' && i+1 < len(b) && b[i+1] == '/':
			in = false
			i += 2
			b[j] = ' '
			j++
		default:
			i++
		}
	}
	if in {
		b[j] = ' '
		j++
	}
	return string(b[:j]), changed
}

// tRemoveCommentsChar drops the comment markers /* */ <!-- --> -- and #.
func tRemoveCommentsChar(s string) (string, bool) {
	b := make([]byte, 0, len(s))
	changed := false
	for i := 0; i < len(s); {
		rest := s[i:]
		switch {
		case strings.HasPrefix(rest, "/*"), strings.HasPrefix(rest, "*/"):
			i += 2
		case strings.HasPrefix(rest, "<!--"):
			i += 4
		case strings.HasPrefix(rest, "-->"):
			i += 3
		case strings.HasPrefix(rest, "--"):
			i += 2
		case s[i] == '#':
			i++
		default:
			b = append(b, s[i])
			i++
			continue
		}
		changed = true
	}
	return string(b), changed
}

// tJSDecode decodes JavaScript escapes: \u{H..H}, \uHHHH and \xHH (the low
// byte, full-width ASCII folded), \OOO, and \C.
func tJSDecode(s string) (string, bool) {
	i := strings.IndexByte(s, '\\')
	if i < 0 {
		return s, false
	}
	d := []byte(s)
	c, n, changed := i, len(s), false
	for i < n {
		if s[i] != '\\' {
			d[c] = s[i]
			c++
			i++
			continue
		}
		ext := 0
		if i+2 < n && s[i+1] == 'u' && s[i+2] == '{' {
			for ext < 6 && i+3+ext < n && validHex(s[i+3+ext]) {
				ext++
			}
			if ext == 0 || i+3+ext >= n || s[i+3+ext] != '}' {
				ext = 0
			}
		}
		switch {
		case ext > 0:
			var code rune
			for k := range ext {
				code = code<<4 | rune(hexNibble[s[i+3+k]])
			}
			d[c] = byte(code)
			if code >= 0xff01 && code <= 0xff5e {
				d[c] += 0x20
			}
			changed = true
			c++
			i += ext + 4
		case i+5 < n && s[i+1] == 'u' && validHex(s[i+2]) && validHex(s[i+3]) && validHex(s[i+4]) && validHex(s[i+5]):
			d[c] = x2c(s[i+4:])
			if d[c] > 0 && d[c] < 0x5f && s[i+2]|0x20 == 'f' && s[i+3]|0x20 == 'f' {
				d[c] += 0x20
			}
			changed = true
			c++
			i += 6
		case i+3 < n && s[i+1] == 'x' && validHex(s[i+2]) && validHex(s[i+3]):
			d[c] = x2c(s[i+2:])
			changed = true
			c++
			i += 4
		case i+1 < n && '0' <= s[i+1] && s[i+1] <= '7':
			j := 0
			for i+1+j < n && j < 3 {
				j++
				if i+1+j >= n || s[i+1+j] < '0' || s[i+1+j] > '7' {
					break
				}
			}
			if j == 3 && s[i+1] > '3' {
				j = 2
			}
			v, _ := strconv.ParseUint(s[i+1:i+1+j], 8, 8)
			d[c] = byte(v)
			changed = true
			c++
			i += 1 + j
		case i+1 < n:
			cc := s[i+1]
			switch cc {
			case 'a':
				cc = '\a'
			case 'b':
				cc = '\b'
			case 'f':
				cc = '\f'
			case 'n':
				cc = '\n'
			case 'r':
				cc = '\r'
			case 't':
				cc = '\t'
			case 'v':
				cc = '\v'
			}
			d[c] = cc
			changed = true
			c++
			i += 2
		default:
			for ; i < n; i++ {
				d[c] = s[i]
				c++
			}
		}
	}
	return string(d[:c]), changed
}

// tCSSDecode decodes CSS escapes: \ and 1-6 hex digits (a code point, in
// UTF-8; one following space dropped), \ and a newline (dropped), \ and
// any other byte (kept).
func tCSSDecode(s string) (string, bool) {
	i := strings.IndexByte(s, '\\')
	if i < 0 {
		return s, false
	}
	d := make([]byte, i, len(s))
	copy(d, s[:i])
	n := len(s)
	for i < n {
		if s[i] != '\\' {
			d = append(d, s[i])
			i++
			continue
		}
		if i+1 >= n {
			i++
			continue
		}
		i++
		j := 0
		for j < 6 && i+j < n && validHex(s[i+j]) {
			j++
		}
		switch {
		case j > 0:
			var code rune
			for k := range j {
				code = code<<4 | rune(hexNibble[s[i+k]])
			}
			if code == 0 {
				code = utf8.RuneError
			}
			if code >= 0xff01 && code <= 0xff5e {
				code -= 0xfee0
			}
			d = utf8.AppendRune(d, code)
			if i+j < n && strings.IndexByte(" \f\n\t\r\v", s[i+j]) >= 0 {
				j++
			}
			i += j
		case s[i] == '\n':
			i++
		default:
			d = append(d, s[i])
			i++
		}
	}
	return string(d), true
}

var base64Dec = func() (t [256]byte) {
	for i := range t {
		t[i] = 127
	}
	for i, c := range "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/" {
		t[c] = byte(i)
	}
	t['='] = 64
	return t
}()

// tBase64Decode decodes base64 up to the first byte that is not of its
// alphabet (CR and LF skipped; '=' and ' ' end it). It always reports a
// change, as Coraza's does.
func tBase64Decode(s string) (string, bool) {
	if s == "" {
		return s, true
	}
	var b strings.Builder
	b.Grow(len(s))
	n, x := 0, 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\r' || c == '\n' {
			continue
		}
		if c == '=' || c == ' ' {
			break
		}
		v := base64Dec[c]
		if v == 127 {
			break
		}
		x = x<<6 | int(v&0x3f)
		if n++; n == 4 {
			b.WriteByte(byte(x >> 16))
			b.WriteByte(byte(x >> 8))
			b.WriteByte(byte(x))
			n, x = 0, 0
		}
	}
	switch n {
	case 2:
		x <<= 12
		b.WriteByte(byte(x >> 16))
	case 3:
		x <<= 6
		b.WriteByte(byte(x >> 16))
		b.WriteByte(byte(x >> 8))
	}
	return b.String(), true
}

// unicodeBestFitASCII is the best-fit mapping of code points to ASCII
// that urlDecodeUni applies to %uXXXX escapes: ModSecurity's
// unicode.mapping, code page 20127, as Coraza carries it.
var unicodeBestFitASCII = map[rune]byte{
	0x00a0: 0x20, 0x00a1: 0x21, 0x00a2: 0x63, 0x00a4: 0x24, 0x00a5: 0x59, 0x00a6: 0x7c, 0x00a9: 0x43, 0x00aa: 0x61,
	0x00ab: 0x3c, 0x00ad: 0x2d, 0x00ae: 0x52, 0x00b2: 0x32, 0x00b3: 0x33, 0x00b7: 0x2e, 0x00b8: 0x2c, 0x00b9: 0x31,
	0x00ba: 0x6f, 0x00bb: 0x3e, 0x00c0: 0x41, 0x00c1: 0x41, 0x00c2: 0x41, 0x00c3: 0x41, 0x00c4: 0x41, 0x00c5: 0x41,
	0x00c6: 0x41, 0x00c7: 0x43, 0x00c8: 0x45, 0x00c9: 0x45, 0x00ca: 0x45, 0x00cb: 0x45, 0x00cc: 0x49, 0x00cd: 0x49,
	0x00ce: 0x49, 0x00cf: 0x49, 0x00d0: 0x44, 0x00d1: 0x4e, 0x00d2: 0x4f, 0x00d3: 0x4f, 0x00d4: 0x4f, 0x00d5: 0x4f,
	0x00d6: 0x4f, 0x00d8: 0x4f, 0x00d9: 0x55, 0x00da: 0x55, 0x00db: 0x55, 0x00dc: 0x55, 0x00dd: 0x59, 0x00e0: 0x61,
	0x00e1: 0x61, 0x00e2: 0x61, 0x00e3: 0x61, 0x00e4: 0x61, 0x00e5: 0x61, 0x00e6: 0x61, 0x00e7: 0x63, 0x00e8: 0x65,
	0x00e9: 0x65, 0x00ea: 0x65, 0x00eb: 0x65, 0x00ec: 0x69, 0x00ed: 0x69, 0x00ee: 0x69, 0x00ef: 0x69, 0x00f1: 0x6e,
	0x00f2: 0x6f, 0x00f3: 0x6f, 0x00f4: 0x6f, 0x00f5: 0x6f, 0x00f6: 0x6f, 0x00f8: 0x6f, 0x00f9: 0x75, 0x00fa: 0x75,
	0x00fb: 0x75, 0x00fc: 0x75, 0x00fd: 0x79, 0x00ff: 0x79, 0x0100: 0x41, 0x0101: 0x61, 0x0102: 0x41, 0x0103: 0x61,
	0x0104: 0x41, 0x0105: 0x61, 0x0106: 0x43, 0x0107: 0x63, 0x0108: 0x43, 0x0109: 0x63, 0x010a: 0x43, 0x010b: 0x63,
	0x010c: 0x43, 0x010d: 0x63, 0x010e: 0x44, 0x010f: 0x64, 0x0110: 0x44, 0x0111: 0x64, 0x0112: 0x45, 0x0113: 0x65,
	0x0114: 0x45, 0x0115: 0x65, 0x0116: 0x45, 0x0117: 0x65, 0x0118: 0x45, 0x0119: 0x65, 0x011a: 0x45, 0x011b: 0x65,
	0x011c: 0x47, 0x011d: 0x67, 0x011e: 0x47, 0x011f: 0x67, 0x0120: 0x47, 0x0121: 0x67, 0x0122: 0x47, 0x0123: 0x67,
	0x0124: 0x48, 0x0125: 0x68, 0x0126: 0x48, 0x0127: 0x68, 0x0128: 0x49, 0x0129: 0x69, 0x012a: 0x49, 0x012b: 0x69,
	0x012c: 0x49, 0x012d: 0x69, 0x012e: 0x49, 0x012f: 0x69, 0x0130: 0x49, 0x0131: 0x69, 0x0134: 0x4a, 0x0135: 0x6a,
	0x0136: 0x4b, 0x0137: 0x6b, 0x0139: 0x4c, 0x013a: 0x6c, 0x013b: 0x4c, 0x013c: 0x6c, 0x013d: 0x4c, 0x013e: 0x6c,
	0x0141: 0x4c, 0x0142: 0x6c, 0x0143: 0x4e, 0x0144: 0x6e, 0x0145: 0x4e, 0x0146: 0x6e, 0x0147: 0x4e, 0x0148: 0x6e,
	0x014c: 0x4f, 0x014d: 0x6f, 0x014e: 0x4f, 0x014f: 0x6f, 0x0150: 0x4f, 0x0151: 0x6f, 0x0152: 0x4f, 0x0153: 0x6f,
	0x0154: 0x52, 0x0155: 0x72, 0x0156: 0x52, 0x0157: 0x72, 0x0158: 0x52, 0x0159: 0x72, 0x015a: 0x53, 0x015b: 0x73,
	0x015c: 0x53, 0x015d: 0x73, 0x015e: 0x53, 0x015f: 0x73, 0x0160: 0x53, 0x0161: 0x73, 0x0162: 0x54, 0x0163: 0x74,
	0x0164: 0x54, 0x0165: 0x74, 0x0166: 0x54, 0x0167: 0x74, 0x0168: 0x55, 0x0169: 0x75, 0x016a: 0x55, 0x016b: 0x75,
	0x016c: 0x55, 0x016d: 0x75, 0x016e: 0x55, 0x016f: 0x75, 0x0170: 0x55, 0x0171: 0x75, 0x0172: 0x55, 0x0173: 0x75,
	0x0174: 0x57, 0x0175: 0x77, 0x0176: 0x59, 0x0177: 0x79, 0x0178: 0x59, 0x0179: 0x5a, 0x017b: 0x5a, 0x017c: 0x7a,
	0x017d: 0x5a, 0x017e: 0x7a, 0x0180: 0x62, 0x0189: 0x44, 0x0191: 0x46, 0x0192: 0x66, 0x0197: 0x49, 0x019a: 0x6c,
	0x019f: 0x4f, 0x01a0: 0x4f, 0x01a1: 0x6f, 0x01ab: 0x74, 0x01ae: 0x54, 0x01af: 0x55, 0x01b0: 0x75, 0x01b6: 0x7a,
	0x01cd: 0x41, 0x01ce: 0x61, 0x01cf: 0x49, 0x01d0: 0x69, 0x01d1: 0x4f, 0x01d2: 0x6f, 0x01d3: 0x55, 0x01d4: 0x75,
	0x01d5: 0x55, 0x01d6: 0x75, 0x01d7: 0x55, 0x01d8: 0x75, 0x01d9: 0x55, 0x01da: 0x75, 0x01db: 0x55, 0x01dc: 0x75,
	0x01de: 0x41, 0x01df: 0x61, 0x01e4: 0x47, 0x01e5: 0x67, 0x01e6: 0x47, 0x01e7: 0x67, 0x01e8: 0x4b, 0x01e9: 0x6b,
	0x01ea: 0x4f, 0x01eb: 0x6f, 0x01ec: 0x4f, 0x01ed: 0x6f, 0x01f0: 0x6a, 0x0261: 0x67, 0x02b9: 0x27, 0x02ba: 0x22,
	0x02bc: 0x27, 0x02c4: 0x5e, 0x02c6: 0x5e, 0x02c8: 0x27, 0x02cb: 0x60, 0x02cd: 0x5f, 0x02dc: 0x7e, 0x0300: 0x60,
	0x0302: 0x5e, 0x0303: 0x7e, 0x030e: 0x22, 0x0331: 0x5f, 0x0332: 0x5f, 0x2000: 0x20, 0x2001: 0x20, 0x2002: 0x20,
	0x2003: 0x20, 0x2004: 0x20, 0x2005: 0x20, 0x2006: 0x20, 0x2010: 0x2d, 0x2011: 0x2d, 0x2013: 0x2d, 0x2014: 0x2d,
	0x2018: 0x27, 0x2019: 0x27, 0x201a: 0x2c, 0x201c: 0x22, 0x201d: 0x22, 0x201e: 0x22, 0x2022: 0x2e, 0x2026: 0x2e,
	0x2032: 0x27, 0x2035: 0x60, 0x2039: 0x3c, 0x203a: 0x3e, 0x2122: 0x54, 0xff01: 0x21, 0xff02: 0x22, 0xff03: 0x23,
	0xff04: 0x24, 0xff05: 0x25, 0xff06: 0x26, 0xff07: 0x27, 0xff08: 0x28, 0xff09: 0x29, 0xff0a: 0x2a, 0xff0b: 0x2b,
	0xff0c: 0x2c, 0xff0d: 0x2d, 0xff0e: 0x2e, 0xff0f: 0x2f, 0xff10: 0x30, 0xff11: 0x31, 0xff12: 0x32, 0xff13: 0x33,
	0xff14: 0x34, 0xff15: 0x35, 0xff16: 0x36, 0xff17: 0x37, 0xff18: 0x38, 0xff19: 0x39, 0xff1a: 0x3a, 0xff1b: 0x3b,
	0xff1c: 0x3c, 0xff1d: 0x3d, 0xff1e: 0x3e, 0xff20: 0x40, 0xff21: 0x41, 0xff22: 0x42, 0xff23: 0x43, 0xff24: 0x44,
	0xff25: 0x45, 0xff26: 0x46, 0xff27: 0x47, 0xff28: 0x48, 0xff29: 0x49, 0xff2a: 0x4a, 0xff2b: 0x4b, 0xff2c: 0x4c,
	0xff2d: 0x4d, 0xff2e: 0x4e, 0xff2f: 0x4f, 0xff30: 0x50, 0xff31: 0x51, 0xff32: 0x52, 0xff33: 0x53, 0xff34: 0x54,
	0xff35: 0x55, 0xff36: 0x56, 0xff37: 0x57, 0xff38: 0x58, 0xff39: 0x59, 0xff3a: 0x5a, 0xff3b: 0x5b, 0xff3c: 0x5c,
	0xff3d: 0x5d, 0xff3e: 0x5e, 0xff3f: 0x5f, 0xff40: 0x60, 0xff41: 0x61, 0xff42: 0x62, 0xff43: 0x63, 0xff44: 0x64,
	0xff45: 0x65, 0xff46: 0x66, 0xff47: 0x67, 0xff48: 0x68, 0xff49: 0x69, 0xff4a: 0x6a, 0xff4b: 0x6b, 0xff4c: 0x6c,
	0xff4d: 0x6d, 0xff4e: 0x6e, 0xff4f: 0x6f, 0xff50: 0x70, 0xff51: 0x71, 0xff52: 0x72, 0xff53: 0x73, 0xff54: 0x74,
	0xff55: 0x75, 0xff56: 0x76, 0xff57: 0x77, 0xff58: 0x78, 0xff59: 0x79, 0xff5a: 0x7a, 0xff5b: 0x7b, 0xff5c: 0x7c,
	0xff5d: 0x7d, 0xff5e: 0x7e,
}
