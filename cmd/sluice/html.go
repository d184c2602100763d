//go:build !nocharts && !sidecar

package main

import (
	"io"

	"github.com/sluice-rl/sluice/replay"
	"github.com/sluice-rl/sluice/replay/htmlreport"
)

// errNoCharts is nil: this build has the charting library (see
// html_nocharts.go for the build without it).
var errNoCharts error

// writeHTML writes replay --html's page, charts drawn with gonum/plot.
func writeHTML(w io.Writer, rep *replay.Report) error { return htmlreport.Write(w, rep) }
