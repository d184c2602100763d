// Package archtest holds tests, and only tests, that hold sluice's packages
// to ARCHITECTURE.md's package table, mirrored in docs/architecture.md. The
// table itself is the slice table in table_test.go; change it, the
// architecture document and docs/architecture.md together.
//
// The tests load the module once with go list (from the root that go env
// GOMOD names) and read each package's import blocks with go/parser, so that
// every failure names the importing package, the imported one and the file
// and line of the import:
//
//   - TestTable: the table is consistent, every top-level directory that
//     holds a Go package has a row, and every row holds a package.
//   - TestImports: every in-module import, by non-test and test files
//     alike (build-tagged files included), is one the importer's row allows.
//     Test files may also import internal/... harnesses; non-test files
//     outside internal/ may not. Nothing imports cmd/..., and nothing but
//     cmd/... imports replay/..., whatever its row.
//   - TestClients: decision, rules, sketch, detector and aggregator (not
//     rules/store) link no Kafka, Redis, ClickHouse
//     or fsnotify client, and enforcer/... links no franz-go, over the
//     transitive non-test build; a failure gives the import chain.
//   - TestNoCycles: the top-level directories (internal/ left out) import
//     one another without a cycle, test imports included; a failure gives
//     the cycle and the file of each of its imports.
//
// # Usage
//
//	go test ./internal/archtest/
package archtest
