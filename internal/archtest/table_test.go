package archtest

import (
	"slices"
	"strings"
)

// row is one row of the package table: the packages at root and below it,
// less those of a row with a longer root, and the rows they may import.
type row struct {
	root       string   // module-relative path, "enforcer/sidecar"
	allowed    []string // roots of the rows it may import besides its own; nil: none
	anything   bool     // may import any row (the never rules still hold)
	mayBeEmpty bool     // the row need not hold a package in this module
}

// table mirrors the "Packages" section of ARCHITECTURE.md (and
// docs/architecture.md). A package may import packages of its own row
// (detector → detector/enrich, decision → decision/decisionpb) and of the rows
// its row lists, by root: "enforcer" admits enforcer/backoff, not
// enforcer/sidecar, which has a row of its own. What a listed row may import
// is not implied. Test files obey their package's row too, and may also
// import internal/....
var table = []row{
	{root: "decision", allowed: []string{"rules"}},
	{root: "rules"},
	{root: "rules/store", allowed: []string{"rules"}},
	{root: "sketch"},
	{root: "enforcer", allowed: []string{"rules", "rules/store", "decision"}},
	{root: "enforcer/sidecar", allowed: []string{"enforcer", "decision", "rules"}},
	{root: "pipeline/stage", allowed: []string{"decision", "rules"}},
	{root: "pipeline", allowed: []string{"pipeline/stage", "decision", "rules", "rules/store"}},
	{root: "detector", allowed: []string{"pipeline/stage", "decision", "sketch", "rules"}},
	{root: "aggregator", allowed: []string{"pipeline/stage", "decision", "sketch", "rules"}},
	// analytics also reads pipeline/stage's punctuation header, and embeds
	// the ClickHouse DDL that deploy/clickhouse keeps (one copy for the
	// migrations and the local stack).
	{root: "analytics", allowed: []string{"pipeline", "pipeline/stage", "decision", "rules", "deploy"}},
	// crowdsec: the CrowdSec Local API both ways (a bouncer writing dynamic
	// rules to the regions' stores; the detector's rules, as the pipeline
	// writes them, pushed as alerts).
	{root: "crowdsec", allowed: []string{"pipeline/stage", "rules", "rules/store"}},
	{root: "replay", anything: true},
	{root: "cmd", anything: true},
	{root: "internal", anything: true},
	// deploy's Go tests live in a module of their own; a package of this
	// module under deploy/ imports nothing of sluice's.
	{root: "deploy", mayBeEmpty: true},
}

// ban is a set of import path prefixes that the non-test builds of some rows
// must not link, directly or not.
type ban struct {
	rows    []string // row roots
	clients []client
	rule    string // the rule, for messages
}

// client is an import path prefix and what it is.
type client struct{ prefix, what string }

var (
	franz    = client{"github.com/twmb/franz-go", "Kafka (franz-go)"}
	kafkaGo  = client{"github.com/segmentio/kafka-go", "Kafka (kafka-go)"}
	goRedis  = client{"github.com/redis/go-redis", "Redis (go-redis)"}
	miniRed  = client{"github.com/alicebob/miniredis", "Redis (miniredis)"}
	click    = client{"github.com/ClickHouse", "ClickHouse"}
	fsnotify = client{"github.com/fsnotify/fsnotify", "fsnotify"}
)

// bans: rules/store (the Redis control plane and its watcher) has a row of
// its own and is not banned.
var bans = []ban{
	{
		rows:    []string{"decision", "rules", "sketch", "detector", "aggregator"},
		clients: []client{franz, kafkaGo, goRedis, miniRed, click, fsnotify},
		rule:    "decision, rules, sketch, detector and aggregator link no Kafka, Redis, ClickHouse or fsnotify client",
	},
	{
		rows:    []string{"enforcer", "enforcer/sidecar"},
		clients: []client{franz},
		rule:    "enforcer/... links no franz-go",
	},
}

// under reports whether path is root or below it.
func under(path, root string) bool {
	return path == root || strings.HasPrefix(path, root+"/")
}

// rowOf returns the row of a module-relative package path: the row with the
// longest root at or above it, or nil.
func rowOf(rel string) *row {
	var best *row
	for i := range table {
		r := &table[i]
		if under(rel, r.root) && (best == nil || len(r.root) > len(best.root)) {
			best = r
		}
	}
	return best
}

// top returns the first element of a module-relative path: "enforcer" for
// "enforcer/sidecar".
func top(rel string) string {
	t, _, _ := strings.Cut(rel, "/")
	return t
}

// allows describes what r may import, for messages: "only enforcer,
// decision, rules" or "nothing of sluice's".
func (r *row) allows() string {
	if len(r.allowed) == 0 {
		return "nothing of sluice's"
	}
	return "only " + strings.Join(r.allowed, ", ")
}

// verdict returns why a file of package from (module-relative) may not
// import package to, or "" if it may. test says whether the file is a test
// file.
func verdict(from, to string, test bool) string {
	fr, tr := rowOf(from), rowOf(to)
	ft, tt := top(from), top(to)
	switch {
	case tt == "cmd" && ft != "cmd":
		return "nothing imports cmd/..."
	case tt == "replay" && ft != "replay" && ft != "cmd":
		return "nothing but cmd/... imports replay/..."
	case tt == "internal":
		if test || ft == "internal" {
			return ""
		}
		return "only test files import internal/..."
	case fr == nil:
		return from + " is in no row of the table"
	case tr == nil:
		return to + " is in no row of the table"
	case fr == tr, fr.anything, slices.Contains(fr.allowed, tr.root):
		return ""
	}
	return "row " + fr.root + " allows " + fr.allows()
}
