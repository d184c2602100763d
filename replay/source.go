package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync/atomic"

	"github.com/sluice-rl/sluice/replay/accesslog"
)

// Request is one request of a replay: a log entry plus the descriptors that
// access logs lack (the generator fills them; log files leave them empty).
type Request struct {
	accesslog.Entry
	APIKey, User, Tenant string
	Route                string // route template; "" = the path without its query
	Cost                 uint32 // hits_addend; 0 = 1
	// JA4 is the client's TLS fingerprint when the source knows it (Inject
	// sets it, so that a botnet shares one fingerprint whatever user agents
	// it sends); "" lets the Enricher pick one from the user agent.
	JA4 string
	// Label says which injected scenario the request belongs to; the zero
	// Label marks background traffic (a log line, Generate's traffic).
	Label Label
}

// Label marks a request that Inject added, so that an evaluation can score
// the rules a detector emits against the truth.
//
// Scope holds the descriptors (by their rules.Key names: "client_ip",
// "asn", "ja4", "route", ...) and values that a correct dynamic rule
// against the scenario would match, e.g. {"ja4": "t13d..."} for a botnet
// sharing one fingerprint. For a benign scenario (Attack false) it names
// what a detector might wrongly flag, e.g. {"client_ip": ...} for the
// carrier-grade NAT address, and any rule on it is a false positive; it is
// nil when there is no single such scope (the flash crowd). Requests of one
// scenario share Scope maps: treat them as read-only.
type Label struct {
	Scenario string // the scenario's name; "" for background traffic
	Attack   bool   // abusive traffic a detector should act on
	Scope    map[string]string
}

// Injected reports whether l marks an injected request.
func (l Label) Injected() bool { return l.Scenario != "" }

// Source yields requests in roughly event-time order. Next returns io.EOF at
// the end and a *accesslog.ParseError for a malformed line, after which it
// can be called again.
type Source interface {
	Name() string
	Next() (Request, error)
	// Stats counts the lines read so far; generated sources count requests.
	Stats() accesslog.Stats
}

// File is a Source over an access log (Apache/nginx combined or common, or
// the NASA TSV, detected from the first line).
type File struct {
	name string
	f    *os.File
	size int64
	read *atomic.Int64
	r    *accesslog.Reader
}

// OpenFile opens an access log. Reading stops with ctx's error once ctx
// ends, even inside a line that never ends (/dev/zero). A directory is
// refused. Close it when done.
func OpenFile(ctx context.Context, path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	var size int64
	if st, err := f.Stat(); err == nil {
		if st.IsDir() {
			f.Close()
			return nil, fmt.Errorf("replay: %s is a directory, not a log", path)
		}
		size = st.Size()
	}
	cr := &ctxReader{ctx: ctx, r: f}
	return &File{name: path, f: f, size: size, read: &cr.n, r: accesslog.NewReader(cr, accesslog.FormatAuto)}, nil
}

// ctxReader fails its reads once ctx ends, and counts the bytes read.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
	n   atomic.Int64
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// Size returns the file's size in bytes when it was opened (0 if unknown).
func (s *File) Size() int64 { return s.size }

// BytesRead returns how many bytes of the file have been read so far; safe to
// call from any goroutine, for a progress bar.
func (s *File) BytesRead() int64 { return s.read.Load() }

func (s *File) Name() string           { return s.name }
func (s *File) Stats() accesslog.Stats { return s.r.Stats() }
func (s *File) Close() error           { return s.f.Close() }
func (s *File) Next() (Request, error) {
	e, err := s.r.Next()
	if err != nil {
		var pe *accesslog.ParseError
		if errors.Is(err, io.EOF) || errors.As(err, &pe) {
			return Request{}, err
		}
		return Request{}, fmt.Errorf("replay: reading %s: %w", s.name, err)
	}
	return Request{Entry: e}, nil
}

// id names a request in decision records: source:line for a log line,
// source:scenario:n for the nth request Inject added for a scenario.
func (r *Request) id(source string) string {
	if r.Label.Injected() {
		return source + ":" + r.Label.Scenario + ":" + strconv.Itoa(r.Line)
	}
	return source + ":" + strconv.Itoa(r.Line)
}
