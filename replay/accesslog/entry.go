package accesslog

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Entry is one request read from an access log.
//
// String fields hold the bytes of the log as they are (they need not be valid
// UTF-8), except that quoted fields of the combined format are unescaped (\"
// becomes " and \\ becomes \; other escapes such as \x16 are kept as written)
// and a "-" referer or user agent becomes "".
type Entry struct {
	Line int // 1-based line number in its file; 0 from ParseCombined

	// Time is the request time as an instant in UTC, to the second: the
	// zone offset of the combined format is applied and then dropped.
	Time time.Time

	// Client is the client address as in the log: an IP address, or a host
	// name (the NASA log, or Apache with HostnameLookups on).
	Client string

	// Method, Path and Proto come from the request line "GET /a HTTP/1.1".
	// A request line that is not METHOD SP PATH [SP HTTP/x] (a TLS probe
	// "\x16\x03\x01...", a bare "quit") gives Method "" and Proto "" with the
	// whole field in Path; the field "-" or "" gives all three empty. Path may
	// contain spaces when the client sent them. The NASA log has no protocol,
	// so Proto is "" there.
	Method, Path, Proto string

	Status int   // HTTP status code, 0-999 (three digits in the log)
	Bytes  int64 // response body size in bytes; 0 when "-", empty or missing

	Referer, UserAgent string // "" when "-", empty or absent (common format)
}

// Format names the layout of an access log.
type Format int

const (
	// FormatAuto picks FormatNASATSV when the first non-blank line is the
	// NASA TSV header or has exactly nine tab-separated fields, and
	// FormatCombined otherwise.
	FormatAuto Format = iota
	// FormatCombined is the Apache/nginx combined log format, or the common
	// log format (combined without referer and user agent).
	FormatCombined
	// FormatNASATSV is the tab-separated NASA-HTTP conversion with the header
	// "host logname time method url response bytes referer useragent" and
	// the time in Unix seconds.
	FormatNASATSV
)

// String returns "auto", "combined" or "nasa-tsv".
func (f Format) String() string {
	switch f {
	case FormatAuto:
		return "auto"
	case FormatCombined:
		return "combined"
	case FormatNASATSV:
		return "nasa-tsv"
	}
	return fmt.Sprintf("Format(%d)", int(f))
}

// MaxLineBytes is the longest line, without its line ending, that Reader
// parses. A longer line is skipped and reported as a *ParseError wrapping
// ErrLineTooLong.
const MaxLineBytes = 64 << 10

// The causes a *ParseError wraps; test them with errors.Is.
var (
	ErrLineTooLong = fmt.Errorf("line longer than %d bytes", MaxLineBytes)
	ErrBadClient   = errors.New("client is not an IP address or host name")
	ErrBadTime     = errors.New("no valid timestamp (want [02/Jan/2006:15:04:05 -0700], or Unix seconds in the NASA TSV, from 1970 to before 9000)")
	ErrTruncated   = errors.New("line ends before the status code")
	ErrBadRequest  = errors.New(`request field is not quoted (want "METHOD PATH PROTO" after the timestamp)`)
	ErrBadStatus   = errors.New("status is not a three-digit code")
	ErrBadBytes    = errors.New(`bytes is not a non-negative 64-bit integer or "-"`)
	ErrTrailing    = errors.New("unquoted text after the bytes field (not combined or common format)")
	ErrFieldCount  = errors.New("NASA TSV line does not have 9 tab-separated fields")
)

// maxErrorText is the cap on ParseError.Text, in bytes.
const maxErrorText = 200

// ParseError says which line failed and why. Reader.Next returns it for a
// malformed line and reads on from the next line at the next call;
// ParseCombined returns it with Line 0.
type ParseError struct {
	Line int    // 1-based line number; 0 from ParseCombined
	Text string // the line without its line ending, cut to at most 200 bytes
	Err  error  // one of the Err* causes of this package
}

func (e *ParseError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("accesslog: line %d: %v: %q", e.Line, e.Err, e.Text)
	}
	return fmt.Sprintf("accesslog: %v: %q", e.Err, e.Text)
}

// Unwrap returns e.Err.
func (e *ParseError) Unwrap() error { return e.Err }

func newParseError(line int, text string, err error) *ParseError {
	if len(text) > maxErrorText {
		n := maxErrorText
		// Do not cut a UTF-8 sequence in two when the text is UTF-8.
		for i := n; i > n-utf8.UTFMax && i > 0; i-- {
			if utf8.RuneStart(text[i]) {
				n = i
				break
			}
		}
		text = text[:n]
	}
	return &ParseError{Line: line, Text: strings.Clone(text), Err: err}
}
