package main

import (
	"io"

	"github.com/sluice-rl/sluice/replay"
	"github.com/sluice-rl/sluice/replay/htmlreport"
)

// writeHTML writes replay --html's page, charts drawn with gonum/plot.
func writeHTML(w io.Writer, rep *replay.Report) error { return htmlreport.Write(w, rep) }
