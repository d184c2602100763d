//go:build !sidecar

package main

import (
	"io"

	"github.com/schollz/progressbar/v3"

	"github.com/sluice-rl/sluice/replay"
)

// progress is sluice replay's progress bar on a terminal: bytes of the log
// files read, or requests of a generated scenario decided.
type progress struct {
	bar   *progressbar.ProgressBar
	files []*replay.File
}

func newProgress(w io.Writer, files []*replay.File, srcs []replay.Source) *progress {
	opts := []progressbar.Option{
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription("replay"),
		progressbar.OptionShowCount(),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100_000_000), // 100 ms
		progressbar.OptionClearOnFinish(),
	}
	if len(files) > 0 {
		var total int64
		for _, f := range files {
			total += f.Size()
		}
		opts = append(opts, progressbar.OptionShowBytes(true))
		p := &progress{bar: progressbar.NewOptions64(total, opts...), files: files}
		_ = p.bar.RenderBlank() // starts its clock: rates count from here
		return p
	}
	total := 0
	for _, s := range srcs {
		if l, ok := s.(interface{ Len() int }); ok {
			total += l.Len()
		}
	}
	opts = append(opts, progressbar.OptionSetItsString("requests"), progressbar.OptionShowIts())
	p := &progress{bar: progressbar.NewOptions(total, opts...)}
	_ = p.bar.RenderBlank()
	return p
}

// update is replay.Options.Progress.
func (p *progress) update(requests int) {
	if len(p.files) == 0 {
		_ = p.bar.Set(requests)
		return
	}
	var n int64
	for _, f := range p.files {
		n += f.BytesRead()
	}
	_ = p.bar.Set64(n)
}

func (p *progress) finish() { _ = p.bar.Finish() }
