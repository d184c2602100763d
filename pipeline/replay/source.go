package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/sluice-rl/sluice/pipeline/accesslog"
)

// Request is one request of a replay: a log entry plus the descriptors that
// access logs lack (the generator fills them; log files leave them empty).
type Request struct {
	accesslog.Entry
	APIKey, User, Tenant string
	Route                string // route template; "" = the path without its query
	Cost                 uint32 // hits_addend; 0 = 1
}

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
	r    *accesslog.Reader
}

// OpenFile opens an access log. Reading stops with ctx's error once ctx
// ends, even inside a line that never ends (/dev/zero). Close it when done.
func OpenFile(ctx context.Context, path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	return &File{name: path, f: f, r: accesslog.NewReader(ctxReader{ctx, f}, accesslog.FormatAuto)}, nil
}

// ctxReader fails its reads once ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

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
