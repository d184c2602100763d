// Package analytics is sluice's ClickHouse side: the sink that writes
// decision records, dynamic rules and shares to ClickHouse, the schema's
// versioned migrations (deploy/clickhouse/NNNN_*.sql, Migrate), and the
// reports (deploy/clickhouse/queries/NAME.sql, RunReport).
//
// The Sink is a stage of the pipeline in a consumer group of its own
// (DefaultGroup): it reads the decision topic and the output topic, inserts
// batches flushed on size or time over ClickHouse's native protocol
// (clickhouse-go v2), and commits offsets only after ClickHouse acknowledged
// a batch. A dead ClickHouse pauses the sink alone; it loses nothing. Rows
// delivered more than once collapse in ReplacingMergeTree tables, and the
// reports read them with FINAL (or, for per-minute aggregates, as sets of
// request ids), so a redelivery never counts twice. The schema runs on
// Debian's ClickHouse 18.16 and on current ClickHouse. docs/analytics.md
// has the schema, the choices and how to run it.
//
// # Usage
//
//	o := analytics.ConnOptions{Addr: "127.0.0.1:9000", Database: "sluice"}
//	if _, err := analytics.Migrate(ctx, o); err != nil { ... }
//	conn, err := analytics.Open(o)
//	s, err := analytics.NewSink(analytics.SinkOptions{Brokers: brokers, Conn: conn, Registerer: reg})
//	go s.Run(ctx)
//	defer s.Close()
//
//	t, err := analytics.RunReport(ctx, conn, "top_denied_keys",
//		analytics.ReportParams{From: time.Now().Add(-time.Hour), To: time.Now()})
//	t.WriteText(os.Stdout)
//
// Metrics of a Sink:
//
//	sluice_clickhouse_rows_written_total{table}      rows ClickHouse acknowledged: decisions, dynamic_rules, shares
//	sluice_clickhouse_batches_total                  batches acknowledged whole, then committed
//	sluice_clickhouse_insert_failures_total          failed insert attempts (retried)
//	sluice_clickhouse_abandoned_batches_total        batches given up for a rebalance or shutdown (read again)
//	sluice_clickhouse_skipped_records_total{reason}  bad_decision, bad_output, punctuation, out_of_range
//	sluice_clickhouse_commit_errors_total            failed offset commits
//	sluice_clickhouse_lag_records                    fetched records not yet written and committed
//	sluice_clickhouse_flush_duration_seconds         first attempt to acknowledgement (histogram)
//
// Tests start their own clickhouse-server: package clickhousetest.
package analytics
