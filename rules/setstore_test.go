package rules

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/enforcer/redistest"
)

// ruleFile returns a valid rule file whose one rule allows limit per minute
// per user.
func ruleFile(limit int) []byte {
	return fmt.Appendf(nil, "domain: d\nrules:\n  - id: per-user\n    match: [{key: user}]\n    limit: %d\n    period: 1m\n", limit)
}

func TestSetStorePushVersions(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := NewSetStore(rdb, Pusher("alice@host"), KeepHistory(3))
	if _, err := st.Current(ctx); !errors.Is(err, ErrNoRuleSet) {
		t.Fatalf("Current of an empty store: %v, want ErrNoRuleSet", err)
	}

	ps := rdb.Subscribe(ctx, RuleSetChannel)
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}

	e, err := st.Push(ctx, "a.yaml", ruleFile(1), 0)
	if err != nil || e.Version != 1 || e.Pusher != "alice@host" || e.SHA != SHA(ruleFile(1)) {
		t.Fatalf("first push: %+v %v; want version 1", e, err)
	}
	if time.Since(e.PushedAt) > time.Minute || e.PushedAt.After(time.Now().Add(time.Minute)) {
		t.Errorf("pushed at %v: want Redis's clock, about now", e.PushedAt)
	}
	msg, err := ps.ReceiveMessage(ctx)
	if err != nil || msg.Payload != "1" {
		t.Fatalf("notification: %v %v; want payload 1", msg, err)
	}
	if e, err = st.Push(ctx, "a.yaml", ruleFile(2), 5); err != nil || e.Version != 5 {
		t.Fatalf("push as 5: %+v %v", e, err)
	}
	for _, v := range []int64{5, 3} {
		if _, err := st.Push(ctx, "a.yaml", ruleFile(3), v); !errors.Is(err, ErrStaleVersion) {
			t.Errorf("push as %d with 5 in force: %v, want ErrStaleVersion", v, err)
		}
	}
	_, err = st.Push(ctx, "bad.yaml", []byte("domain: d\nrules:\n  - id: x\n    match: [{key: nope}]\n    limit: 1\n    period: 1s\n"), 0)
	if err == nil || !strings.Contains(err.Error(), "bad.yaml:3:5") {
		t.Errorf("invalid push: %v; want the parse error with file:line:col", err)
	}
	cur, err := st.Current(ctx)
	if err != nil || cur.Version != 5 || string(cur.YAML) != string(ruleFile(2)) {
		t.Fatalf("after refused pushes: %+v %v; want version 5 unchanged", cur, err)
	}
	for i := range 3 {
		if _, err := st.Push(ctx, "a.yaml", ruleFile(10+i), 0); err != nil {
			t.Fatal(err)
		}
	}
	hist, err := st.History(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var vs []int64
	for _, h := range hist {
		vs = append(vs, h.Version)
	}
	if fmt.Sprint(vs) != "[8 7 6]" {
		t.Errorf("history %v, want the last 3 newest first: [8 7 6]", vs)
	}
	if n, _ := rdb.HLen(ctx, RuleSetHistoryKey).Result(); n != 3*5 {
		t.Errorf("history hash has %d fields, want 15: trimmed versions leave nothing behind", n)
	}
	s, err := hist[0].Set()
	if err != nil || s.Version != 8 || s.Rules[0].Limit != 12 {
		t.Errorf("history entry's set: %+v %v", s, err)
	}
}

func TestSetStoreRollback(t *testing.T) {
	ctx := context.Background()
	st := NewSetStore(redistest.Server(t))
	if _, err := st.Rollback(ctx); !errors.Is(err, ErrNoRuleSet) {
		t.Fatalf("rollback of nothing: %v", err)
	}
	for i := 1; i <= 3; i++ { // v1..v3, limits 1..3
		if _, err := st.Push(ctx, "f.yaml", ruleFile(i), 0); err != nil {
			t.Fatal(err)
		}
	}
	limitOf := func(e Entry) int64 {
		t.Helper()
		s, err := e.Set()
		if err != nil {
			t.Fatal(err)
		}
		return s.Rules[0].Limit
	}
	for _, want := range []struct{ version, from, limit int64 }{
		{4, 2, 2}, // back to v2's content, as a new version
		{5, 1, 1}, // rolling back the rollback goes one further back
	} {
		e, err := st.Rollback(ctx)
		if err != nil || e.Version != want.version || e.From != want.from || limitOf(e) != want.limit {
			t.Fatalf("rollback: %+v %v; want version %d from %d (limit %d)", e, err, want.version, want.from, want.limit)
		}
	}
	if _, err := st.Rollback(ctx); !errors.Is(err, ErrNoPrevious) {
		t.Errorf("rollback before v1: %v, want ErrNoPrevious", err)
	}
	if _, err := st.Push(ctx, "f.yaml", ruleFile(9), 0); err != nil { // v6
		t.Fatal(err)
	}
	if e, err := st.Rollback(ctx); err != nil || e.Version != 7 || e.From != 1 || limitOf(e) != 1 {
		t.Errorf("rollback after a new push: %+v %v; want v5's content (v1's), as version 7", e, err)
	}
	if e, err := st.RollbackTo(ctx, 3); err != nil || e.Version != 8 || e.From != 3 || limitOf(e) != 3 {
		t.Errorf("rollback to 3: %+v %v", e, err)
	}
	if _, err := st.RollbackTo(ctx, 99); !errors.Is(err, ErrNoPrevious) {
		t.Errorf("rollback to a version never pushed: %v", err)
	}
}

// TestSetStoreConflict: a rollback prepared against one version does not
// overwrite a push that came in between.
func TestSetStoreConflict(t *testing.T) {
	ctx := context.Background()
	st := NewSetStore(redistest.Server(t))
	for i := 1; i <= 2; i++ {
		if _, err := st.Push(ctx, "f.yaml", ruleFile(i), 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.write(ctx, ruleFile(1), 3, 1, 1); !errors.Is(err, ErrConflict) {
		t.Errorf("write expecting version 1 with 2 in force: %v, want ErrConflict", err)
	}
}

func TestDeclaredVersion(t *testing.T) {
	for _, c := range []struct {
		yaml string
		want int64
		err  string
	}{
		{"domain: d\n", 0, ""},
		{"version: 7\ndomain: d\n", 7, ""},
		{"domain: d\nversion: \"7\"\n", 0, "line 2 column 10"},
		{"version: 0\n", 0, "want a whole number from 1"},
		{"version: -3\n", 0, "want a whole number from 1"},
		{"[1, 2]\n", 0, ""},
		{":::\n", 0, ""},
	} {
		v, err := DeclaredVersion([]byte(c.yaml))
		if v != c.want || (c.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%q: %d %v; want %d %q", c.yaml, v, err, c.want, c.err)
		}
	}
	// A stored entry whose YAML declares another version is invalid.
	e := Entry{Version: 4, YAML: append([]byte("version: 3\n"), ruleFile(1)...)}
	if _, err := e.Set(); err == nil {
		// The parser of this tree may not know version: yet; then Parse refuses it.
		t.Errorf("version 4 declaring 3: no error")
	} else if !errors.Is(err, ErrVersionMismatch) && !strings.Contains(err.Error(), "version") {
		t.Errorf("version 4 declaring 3: %v", err)
	}
}

// TestSetStoreCluster: the store's keys share one slot, so its script runs
// on a Cluster.
func TestSetStoreCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	ctx := context.Background()
	c := redistest.Cluster(t)
	st := NewSetStore(c)
	for i := 1; i <= 2; i++ {
		if _, err := st.Push(ctx, "f.yaml", ruleFile(i), 0); err != nil {
			t.Fatal(err)
		}
	}
	if e, err := st.Rollback(ctx); err != nil || e.Version != 3 {
		t.Fatalf("rollback on a cluster: %+v %v", e, err)
	}
}
