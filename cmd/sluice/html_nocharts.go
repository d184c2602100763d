//go:build nocharts && !sidecar

package main

import (
	"errors"
	"io"

	"github.com/sluice-rl/sluice/replay"
)

// errNoCharts is why replay --html fails in a build with -tags nocharts
// (make sidecar's), which leaves out replay/htmlreport and with it
// gonum/plot and its font, LaTeX and PDF dependencies. The flag stays, so
// that scripts still parse; using it fails before the replay starts.
var errNoCharts = errors.New("--html: this sluice was built with -tags nocharts, without the charting library; use a full build")

// writeHTML returns errNoCharts.
func writeHTML(io.Writer, *replay.Report) error { return errNoCharts }
