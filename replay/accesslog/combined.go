package accesslog

import (
	"net/netip"
	"strings"
	"time"
)

// ParseCombined parses one line of the Apache/nginx combined log format,
//
//	203.0.113.9 - frank [17/May/2015:10:05:03 +0000] "GET /a HTTP/1.1" 200 2326 "http://r/" "Mozilla/5.0"
//
// or of the common log format (the same without referer and user agent),
// and returns it with Line 0. The line may carry its line ending and
// surrounding blanks. On failure it returns a *ParseError with Line 0
// wrapping one of ErrBadClient, ErrBadTime, ErrTruncated, ErrBadRequest,
// ErrBadStatus, ErrBadBytes or ErrTrailing. It does not use regular
// expressions, and the Entry's strings share the line's memory unless a
// field had to be unescaped.
//
// It is strict up to the status and lenient after it:
//   - the client must be an IP address or a host name, and the timestamp
//     must be [dd/Mon/yyyy:hh:mm:ss ±hhmm] (English month abbreviation);
//   - the ident and user fields between them are skipped, whatever they hold;
//   - a leading "host:port" field (Apache's vhost_combined) is skipped when
//     the client follows it;
//   - the request must be quoted and closed; see Entry for request fields
//     that are not METHOD PATH PROTO;
//   - the status must be three digits; a line that ends before it (or
//     inside the request) is ErrTruncated;
//   - a line that ends after the status or the bytes is an entry with the
//     missing fields zero (common format ends after the bytes);
//   - a quoted referer or user agent with no closing quote runs to the end of
//     the line: a log cut inside the user agent still yields the entry, with
//     what is left of the user agent;
//   - anything after the user agent (nginx's extra fields) is ignored;
//     unquoted text after the bytes is ErrTrailing.
//
// A closing quote is a " not escaped by a backslash and followed by a blank
// or the end of the line, so an unescaped " inside a field does not end it.
func ParseCombined(line string) (Entry, error) {
	e, err := parseCombined(line)
	if err != nil {
		return Entry{}, newParseError(0, trimLineEnd(line), err)
	}
	return e, nil
}

func parseCombined(s string) (Entry, error) {
	var e Entry
	s = trimBlanks(s)

	// Client, up to the first space.
	sp := strings.IndexByte(s, ' ')
	client := s
	if sp >= 0 {
		client = s[:sp]
	}
	if sp >= 0 && !isIP(client) {
		// A prefix before "client ident user [time]": a syslog header
		// ("Mar  5 10:00:00 web1 nginx: 203.0.113.9 - - [...") or a virtual
		// host without a port. The client is then the third field before
		// the timestamp, when that is an IP address.
		if at := prefixedClient(s); at > 0 {
			s = s[at:]
			sp = strings.IndexByte(s, ' ')
			client = s[:sp]
		}
	}
	if !validClient(client) && sp >= 0 && isVhost(client) {
		// vhost_combined: "www.example.com:443 203.0.113.9 - - [...".
		s = trimLeftBlanks(s[sp:])
		sp = strings.IndexByte(s, ' ')
		client = s
		if sp >= 0 {
			client = s[:sp]
		}
	}
	if !validClient(client) {
		return e, ErrBadClient
	}
	if sp < 0 {
		return e, ErrTruncated
	}
	e.Client = client
	rest := s[sp:]

	// Skip ident and user: the timestamp is the first " [".
	i := strings.Index(rest, " [")
	if i < 0 {
		return e, ErrBadTime
	}
	rest = rest[i+2:]
	const tsLen = len("02/Jan/2006:15:04:05 -0700")
	if len(rest) < tsLen+1 || rest[tsLen] != ']' {
		return e, ErrBadTime
	}
	t, ok := parseCLFTime(rest[:tsLen])
	if !ok {
		return e, ErrBadTime
	}
	e.Time = t
	rest = trimLeftBlanks(rest[tsLen+1:])

	// Request.
	if rest == "" {
		return e, ErrTruncated
	}
	if rest[0] != '"' {
		return e, ErrBadRequest
	}
	req, rest, closed := quoted(rest[1:])
	if !closed {
		return e, ErrTruncated
	}
	e.Method, e.Path, e.Proto = splitRequest(req)

	// Status.
	rest = trimLeftBlanks(rest)
	if rest == "" {
		return e, ErrTruncated
	}
	tok, rest := token(rest)
	st, ok := parseStatus(tok)
	if !ok {
		return e, ErrBadStatus
	}
	e.Status = st

	// Bytes: from here on the line may end.
	rest = trimLeftBlanks(rest)
	if rest == "" {
		return e, nil
	}
	tok, rest = token(rest)
	if e.Bytes, ok = parseBytes(tok); !ok {
		return e, ErrBadBytes
	}

	// Referer and user agent.
	rest = trimLeftBlanks(rest)
	if rest == "" {
		return e, nil
	}
	if rest[0] != '"' {
		return e, ErrTrailing
	}
	ref, rest, closed := quoted(rest[1:])
	e.Referer = dash(ref)
	if !closed {
		return e, nil
	}
	rest = trimLeftBlanks(rest)
	if rest == "" {
		return e, nil
	}
	if rest[0] != '"' {
		return e, ErrTrailing
	}
	ua, _, _ := quoted(rest[1:])
	e.UserAgent = dash(ua)
	return e, nil
}

// quoted scans s, which follows an opening quote, for the closing quote: a
// '"' not escaped by a backslash and followed by a blank or the end of s. It
// returns the unescaped field, the text after the closing quote, and whether
// the quote was closed; an unclosed field is all of s.
func quoted(s string) (field, rest string, closed bool) {
	escaped := false
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			escaped = true
			i++
		case '"':
			if i+1 == len(s) || s[i+1] == ' ' || s[i+1] == '\t' {
				field = s[:i]
				if escaped {
					field = unescape(field)
				}
				return field, s[i+1:], true
			}
		}
	}
	if escaped {
		return unescape(s), "", false
	}
	return s, "", false
}

// unescape turns \" into " and \\ into \ and keeps every other byte,
// including other backslash escapes such as \x16, as it is.
func unescape(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\\' && i+1 < len(s) && (s[i+1] == '"' || s[i+1] == '\\') {
			i++
			c = s[i]
		}
		b.WriteByte(c)
	}
	return b.String()
}

// splitRequest splits "METHOD PATH PROTO" (or "METHOD PATH", HTTP/0.9). A
// field of another shape gives ("", field, ""), and "-" gives ("", "", "").
func splitRequest(r string) (method, path, proto string) {
	if r == "-" || r == "" {
		return "", "", ""
	}
	sp := strings.IndexByte(r, ' ')
	if sp <= 0 || !isMethod(r[:sp]) {
		return "", r, ""
	}
	method, rest := r[:sp], r[sp+1:]
	if last := strings.LastIndexByte(rest, ' '); last >= 0 {
		path, proto = rest[:last], rest[last+1:]
		if !strings.HasPrefix(proto, "HTTP/") {
			return "", r, ""
		}
	} else {
		path = rest
	}
	if path == "" {
		return "", r, ""
	}
	return method, path, proto
}

// isMethod reports whether s is an HTTP method token as servers log it: an
// upper-case letter, then up to 23 upper-case letters, digits, '-' or '_'
// (GET, PROPFIND, VERSION-CONTROL).
func isMethod(s string) bool {
	if len(s) == 0 || len(s) > 24 || s[0] < 'A' || s[0] > 'Z' {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// parseCLFTime parses "02/Jan/2006:15:04:05 -0700" and returns the instant in
// UTC. It rejects dates that do not exist (31/Apr), offsets beyond ±23:59,
// and instants before 1970 or from the year 9000 on.
func parseCLFTime(s string) (time.Time, bool) {
	if len(s) != 26 || s[2] != '/' || s[6] != '/' || s[11] != ':' || s[14] != ':' || s[17] != ':' || s[20] != ' ' {
		return time.Time{}, false
	}
	day, ok1 := digits(s[0:2])
	mon := month(s[3:6])
	year, ok2 := digits(s[7:11])
	hh, ok3 := digits(s[12:14])
	mm, ok4 := digits(s[15:17])
	ss, ok5 := digits(s[18:20])
	ohh, ok6 := digits(s[22:24])
	omm, ok7 := digits(s[24:26])
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6 && ok7) || mon == 0 ||
		day < 1 || day > daysIn(mon, year) || hh > 23 || mm > 59 || ss > 59 || omm > 59 {
		return time.Time{}, false
	}
	off := time.Duration(ohh)*time.Hour + time.Duration(omm)*time.Minute
	switch s[21] {
	case '+':
	case '-':
		off = -off
	default:
		return time.Time{}, false
	}
	t := time.Date(year, mon, day, hh, mm, ss, 0, time.UTC).Add(-off)
	if t.Unix() < 0 || t.Unix() >= maxUnixSeconds {
		return time.Time{}, false
	}
	return t, true
}

func month(s string) time.Month {
	switch s {
	case "Jan":
		return time.January
	case "Feb":
		return time.February
	case "Mar":
		return time.March
	case "Apr":
		return time.April
	case "May":
		return time.May
	case "Jun":
		return time.June
	case "Jul":
		return time.July
	case "Aug":
		return time.August
	case "Sep":
		return time.September
	case "Oct":
		return time.October
	case "Nov":
		return time.November
	case "Dec":
		return time.December
	}
	return 0
}

func daysIn(m time.Month, year int) int {
	switch m {
	case time.February:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case time.April, time.June, time.September, time.November:
		return 30
	}
	return 31
}

// digits parses a string of ASCII digits (at most 4, so no overflow).
func digits(s string) (int, bool) {
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, len(s) > 0
}

func parseStatus(s string) (int, bool) {
	if len(s) != 3 {
		return 0, false
	}
	return digits(s)
}

// parseBytes parses a response size: "-" or "" is 0, otherwise a
// non-negative decimal that fits an int64.
func parseBytes(s string) (int64, bool) {
	if s == "-" || s == "" {
		return 0, true
	}
	return parseUint63(s)
}

// parseUint63 parses a non-empty string of ASCII digits into a non-negative
// int64, failing on overflow.
func parseUint63(s string) (int64, bool) {
	if s == "" {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		d := int64(c - '0')
		if n > (1<<63-1-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}

// validClient reports whether s is an IP address, or a host name: 1-253 bytes
// of dot-separated non-empty labels of letters, digits, '-' and '_' (NASA's
// hosts include "gw_inet.pepboys.com"), with an optional final dot and at
// least one letter (all digits and dots is a malformed IPv4 address).
func validClient(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	letter, label := false, 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '.':
			if label == 0 {
				return false
			}
			label = 0
			continue
		case c >= '0' && c <= '9':
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
			letter = true
		case c == '-', c == '_':
		case c == ':':
			// Only an IPv6 address has a colon.
			_, err := netip.ParseAddr(s)
			return err == nil
		default:
			return false
		}
		label++
		if label > 63 {
			return false
		}
	}
	if !letter {
		_, err := netip.ParseAddr(s)
		return err == nil
	}
	return true
}

// isIP reports whether s is an IP address.
func isIP(s string) bool {
	_, err := netip.ParseAddr(s)
	return err == nil
}

// prefixedClient returns the offset in s of the third blank-separated field
// before the first " [" (the client of "client ident user [time]") when that
// field is an IP address and is not s's first field; else 0.
func prefixedClient(s string) int {
	end := strings.Index(s, " [")
	if end < 0 {
		return 0
	}
	start := end
	for range 3 { // user, ident, client: each preceded by blanks
		for end > 0 && isBlank(s[end-1]) {
			end--
		}
		start = end
		for start > 0 && !isBlank(s[start-1]) {
			start--
		}
		if start == end || start == 0 {
			return 0 // fewer than 3 fields, or no prefix before the client
		}
		end = start
	}
	if tok, _ := token(s[start:]); !isIP(tok) {
		return 0
	}
	return start
}

// isVhost reports whether s is "host:port", the virtual host field that
// Apache's vhost_combined format puts before the client.
func isVhost(s string) bool {
	i := strings.LastIndexByte(s, ':')
	if i <= 0 || i == len(s)-1 || len(s)-i-1 > 5 {
		return false
	}
	if _, ok := digits(s[i+1:]); !ok {
		return false
	}
	return validClient(s[:i]) && strings.IndexByte(s[:i], ':') < 0
}

// token splits s at its first blank.
func token(s string) (tok, rest string) {
	for i := 0; i < len(s); i++ {
		if s[i] == ' ' || s[i] == '\t' {
			return s[:i], s[i:]
		}
	}
	return s, ""
}

func dash(s string) string {
	if s == "-" {
		return ""
	}
	return s
}

func isBlank(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

func trimBlanks(s string) string {
	for len(s) > 0 && isBlank(s[len(s)-1]) {
		s = s[:len(s)-1]
	}
	return trimLeftBlanks(s)
}

func trimLeftBlanks(s string) string {
	for len(s) > 0 && isBlank(s[0]) {
		s = s[1:]
	}
	return s
}

// trimLineEnd drops a trailing "\n" or "\r\n".
func trimLineEnd(s string) string {
	s = strings.TrimSuffix(s, "\n")
	return strings.TrimSuffix(s, "\r")
}
