// Package clickhouse holds sluice's ClickHouse schema and report queries as
// files, embedded for the sluice binary (package analytics applies and runs
// them):
//
//	NNNN_name.sql       a migration: statements separated by ';' at the end of a line,
//	                    applied once each, in order of NNNN (sluice clickhouse migrate)
//	queries/NAME.sql    the query of report NAME (sluice report NAME)
//	server.xml          a loopback clickhouse-server's configuration (ServerConfig)
//
// Every statement runs on Debian's ClickHouse 18.16 and on current ClickHouse.
package clickhouse

import "embed"

// ServerConfig is server.xml: a clickhouse-server on 127.0.0.1:{port} with
// its files under {dir}, for tests and the local stack.
//
//go:embed server.xml
var ServerConfig string

// Files holds the migrations (*.sql) and the report queries (queries/*.sql).
//
//go:embed *.sql queries/*.sql
var Files embed.FS
