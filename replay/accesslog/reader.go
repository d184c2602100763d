package accesslog

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
)

// Stats counts the lines a Reader has read. Lines == Entries + Malformed +
// Header + Blank at every point.
type Stats struct {
	Lines     int // lines read, of every kind
	Entries   int // lines returned as an Entry
	Malformed int // lines returned as a *ParseError (including over-long ones)
	Header    int // NASA TSV header lines, skipped
	Blank     int // empty or blank-only lines, skipped
}

// Reader reads Entries from an access log, one line at a time, numbering
// lines as in the file. Blank lines and NASA TSV header lines are skipped
// (and counted in Stats); a malformed line is returned as a *ParseError and
// does not stop the reader. Lines are read with a bufio.Reader of
// MaxLineBytes, so a line of any length is safe: past MaxLineBytes it is
// discarded and reported as ErrLineTooLong.
//
// A Reader is not safe for concurrent use. Create it with NewReader; most
// callers loop on Next until io.EOF.
type Reader struct {
	br     *bufio.Reader
	format Format
	line   int
	stats  Stats
	err    error  // sticky: io.EOF or the first read error
	rest   []byte // what follows a lone CR on the line last read: more lines
}

// NewReader returns a Reader of r in format f. FormatAuto decides from the
// first non-blank line (see FormatAuto).
func NewReader(r io.Reader, f Format) *Reader {
	rd := &Reader{br: bufio.NewReaderSize(r, MaxLineBytes+2), format: f}
	if f < FormatAuto || f > FormatNASATSV {
		rd.err = fmt.Errorf("accesslog: unknown Format %d", int(f))
	}
	return rd
}

// Format returns the reader's format; for FormatAuto, the detected format
// once Next has read a non-blank line, and FormatAuto before.
func (r *Reader) Format() Format { return r.format }

// Stats returns the line counts so far.
func (r *Reader) Stats() Stats { return r.stats }

// Next returns the next entry, with Line set to its 1-based line number. It
// returns a *ParseError for a malformed line, after which the next call goes
// on with the following line; io.EOF after the last line (a last line
// without a newline is read); and the underlying reader's error, or an
// unknown-Format error, which is then returned by every later call.
func (r *Reader) Next() (Entry, error) {
	for r.err == nil || r.rest != nil {
		var line []byte
		if r.rest != nil {
			// Old Mac line endings: a lone CR ends a line too.
			line, r.rest = cutCR(r.rest)
			r.line++
			r.stats.Lines++
		} else {
			raw, err := r.br.ReadSlice('\n')
			if len(raw) == 0 && err != nil {
				r.err = err
				break
			}
			r.line++
			r.stats.Lines++
			if err == bufio.ErrBufferFull {
				pe := newParseError(r.line, string(raw[:maxErrorText]), ErrLineTooLong)
				for err == bufio.ErrBufferFull {
					_, err = r.br.ReadSlice('\n')
				}
				r.err = err
				r.stats.Malformed++
				return Entry{}, pe
			}
			r.err = err // nil, io.EOF after a last line without '\n', or a read error
			line = bytes.TrimSuffix(bytes.TrimSuffix(raw, []byte{'\n'}), []byte{'\r'})
			if r.line == 1 {
				line = bytes.TrimPrefix(line, []byte("\xef\xbb\xbf")) // a UTF-8 byte-order mark
			}
			if i := bytes.IndexByte(line, '\r'); i >= 0 {
				r.rest = append([]byte(nil), line[i+1:]...) // ReadSlice's buffer is reused
				line = line[:i]
			}
		}
		if len(line) > MaxLineBytes {
			r.stats.Malformed++
			return Entry{}, newParseError(r.line, string(line[:maxErrorText]), ErrLineTooLong)
		}
		if blank(line) {
			r.stats.Blank++
			continue
		}
		if string(line) == nasaHeader && r.format != FormatCombined {
			r.format = FormatNASATSV
			r.stats.Header++
			continue
		}
		if r.format == FormatAuto {
			r.format = detect(line)
		}
		s := string(line)
		var e Entry
		var err error
		if r.format == FormatNASATSV {
			e, err = parseNASATSV(s)
		} else {
			e, err = parseCombined(s)
		}
		if err != nil {
			r.stats.Malformed++
			return Entry{}, newParseError(r.line, s, err)
		}
		r.stats.Entries++
		e.Line = r.line
		return e, nil
	}
	return Entry{}, r.err
}

// cutCR splits b at its first CR; rest is nil when nothing follows.
func cutCR(b []byte) (line, rest []byte) {
	i := bytes.IndexByte(b, '\r')
	if i < 0 {
		return b, nil
	}
	if i+1 == len(b) {
		return b[:i], nil
	}
	return b[:i], b[i+1:]
}

// detect picks the format of a non-blank first line: NASA TSV when it has
// exactly nine tab-separated fields, combined otherwise.
func detect(line []byte) Format {
	if bytes.Count(line, []byte{'\t'}) == nasaFields-1 {
		return FormatNASATSV
	}
	return FormatCombined
}

func blank(b []byte) bool {
	for _, c := range b {
		if !isBlank(c) {
			return false
		}
	}
	return true
}
