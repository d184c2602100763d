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
	err    error // sticky: io.EOF or the first read error
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
	for r.err == nil {
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
		line := bytes.TrimSuffix(bytes.TrimSuffix(raw, []byte{'\n'}), []byte{'\r'})
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
