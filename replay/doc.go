// Package replay drives access logs (or a generated scenario) through one
// enforcer per region, Kafka, the detector and the aggregator, in event
// time, and reports what they did.
//
// # Usage
//
//	rep, err := replay.Run(ctx, replay.Options{}, replay.Generate(replay.Scenario{}))
//	if err != nil { ... }          // rep, when not nil, is partial
//	rep.Print(os.Stdout)           // the text report
//	err = htmlreport.Write(f, rep) // one self-contained page with SVG charts (gonum/plot; package replay/htmlreport)
//
// Report keeps totals per rule and, in Report.Timeline, the same counts per
// event-time bucket (at most MaxBuckets per rule), which the page of
// replay/htmlreport charts with the shares per region over time and a
// timeline of detections. Package replay itself does not import gonum/plot.
// docs/operations.md describes the page; README.md, "What a replay does",
// the run.
package replay
