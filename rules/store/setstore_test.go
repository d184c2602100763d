package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
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
	if err == nil || !strings.Contains(err.Error(), "bad.yaml:4:12") {
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
	if hist[0].YAML != nil || hist[0].SHA != SHA(ruleFile(12)) || hist[0].Replaced != 0 {
		t.Errorf("history entry %+v: want its SHA and no YAML (Get reads it)", hist[0])
	}
	h, err := st.Get(ctx, 8)
	if err != nil {
		t.Fatal(err)
	}
	s, err := h.Set()
	if err != nil || s.Version != 8 || s.Rules[0].Limit != 12 {
		t.Errorf("history entry's set: %+v %v", s, err)
	}
	if _, err := st.Get(ctx, 5); !errors.Is(err, ErrNotInHistory) {
		t.Errorf("Get of a trimmed version: %v, want ErrNotInHistory", err)
	}
}

// TestSetStorePushReplaced: Push says which version it replaced, as the
// script saw it, and returns the set it parsed.
func TestSetStorePushReplaced(t *testing.T) {
	ctx := context.Background()
	st := NewSetStore(redistest.Server(t))
	e, err := st.Push(ctx, "a.yaml", ruleFile(1), 0)
	if err != nil || e.Replaced != 0 {
		t.Fatalf("first push: %+v %v; want Replaced 0", e, err)
	}
	e, err = st.Push(ctx, "a.yaml", ruleFile(2), 7)
	if err != nil || e.Version != 7 || e.Replaced != 1 {
		t.Fatalf("second push: %+v %v; want version 7, Replaced 1", e, err)
	}
	if s, err := e.Set(); err != nil || s.Version != 7 || s.Rules[0].Limit != 2 {
		t.Errorf("the pushed entry's set: %+v %v", s, err)
	}
	e, err = st.Rollback(ctx)
	if err != nil || e.Version != 8 || e.Replaced != 7 || e.From != 1 {
		t.Errorf("rollback: %+v %v; want version 8 from 1, Replaced 7", e, err)
	}
}

// TestSetStoreUnchanged: content identical to the set in force makes no new
// version, by push without a version or by rollback; a push with an explicit
// version writes it (to go above enforcers after Redis lost its data).
func TestSetStoreUnchanged(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := NewSetStore(rdb)
	for i := 1; i <= 2; i++ {
		if _, err := st.Push(ctx, "f.yaml", ruleFile(i), 0); err != nil {
			t.Fatal(err)
		}
	}
	if e, err := st.Push(ctx, "f.yaml", ruleFile(2), 0); !errors.Is(err, ErrUnchanged) || e.Version != 2 {
		t.Errorf("push of the content in force: %+v %v; want ErrUnchanged and version 2", e, err)
	}
	if e, err := st.RollbackTo(ctx, 2); !errors.Is(err, ErrUnchanged) || e.Version != 2 {
		t.Errorf("rollback to the version in force: %+v %v; want ErrUnchanged", e, err)
	}
	if cur, _ := st.Current(ctx); cur.Version != 2 {
		t.Errorf("version %d in force, want 2: nothing written", cur.Version)
	}
	if n, _ := rdb.HLen(ctx, RuleSetHistoryKey).Result(); n != 2*5 {
		t.Errorf("history has %d fields, want 2 versions' worth", n)
	}
	if e, err := st.Push(ctx, "f.yaml", ruleFile(2), 9); err != nil || e.Version != 9 {
		t.Errorf("push of the content in force as version 9: %+v %v; want it written", e, err)
	}
}

// TestSetStoreEnforcersAhead: after Redis lost its data, the enforcers
// report what they hold again at their next poll; a push without a version
// then goes above it, and one with a version at or below it is refused.
// Reports not renewed for EnforcerForget are ignored and deleted.
func TestSetStoreEnforcersAhead(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := NewSetStore(rdb)
	for i := 1; i <= 3; i++ {
		if _, err := st.Push(ctx, "f.yaml", ruleFile(i), 0); err != nil {
			t.Fatal(err)
		}
	}
	w, err := NewWatcher(WatchOptions{Redis: rdb, Instance: "pod-a", Apply: func(*rules.Set) {}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if r := w.Load(ctx); r.Result != Applied || r.Version != 3 {
		t.Fatalf("load: %+v", r)
	}
	es, err := st.Enforcers(ctx)
	if err != nil || len(es) != 1 || es[0].Instance != "pod-a" || es[0].Version != 3 || es[0].SHA != SHA(ruleFile(3)) || es[0].Stale() || es[0].Age > time.Second {
		t.Fatalf("enforcers after the load: %+v %v", es, err)
	}

	if err := rdb.FlushAll(ctx).Err(); err != nil { // Redis lost its data
		t.Fatal(err)
	}
	w.check(ctx, false) // the next poll
	if es, err := st.Enforcers(ctx); err != nil || len(es) != 1 || es[0].Version != 3 {
		t.Fatalf("enforcers after a poll: %+v %v; want pod-a's report back", es, err)
	}
	for _, v := range []int64{2, 3} {
		_, err := st.Push(ctx, "f.yaml", ruleFile(9), v)
		if !errors.Is(err, ErrEnforcerAhead) || !strings.Contains(err.Error(), `enforcer "pod-a" reported holding version 3`) {
			t.Errorf("push as %d while pod-a holds 3: %v, want ErrEnforcerAhead naming pod-a", v, err)
		}
	}
	// The content pod-a holds, under its version: restores the store.
	if e, err := st.Push(ctx, "f.yaml", ruleFile(3), 3); err != nil || e.Version != 3 {
		t.Errorf("push of pod-a's own set as 3: %+v %v", e, err)
	}
	rdb.FlushAll(ctx)
	w.check(ctx, false)
	if e, err := st.Push(ctx, "f.yaml", ruleFile(9), 0); err != nil || e.Version != 4 {
		t.Fatalf("push without a version into an empty store, pod-a holding 3: %+v %v; want version 4", e, err)
	}
	if r := w.check(ctx, false); r.Result != Applied || r.Version != 4 {
		t.Errorf("pod-a after the push: %+v", r)
	}

	// Old reports: one 2 minutes old is stale but counts; one older than
	// EnforcerForget neither counts nor stays.
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	report := func(name string, version int64, age time.Duration) {
		rdb.HSet(ctx, RuleSetEnforcersKey, name, fmt.Sprintf("%d %s %d", version, SHA(ruleFile(1)), now.Add(-age).UnixMilli()))
	}
	report("pod-old", 50, 2*time.Minute)
	report("pod-gone", 100, EnforcerForget+time.Minute)
	es, err = st.Enforcers(ctx)
	if err != nil || len(es) != 2 || es[1].Instance != "pod-old" || !es[1].Stale() || es[0].Stale() {
		t.Fatalf("enforcers: %+v %v; want pod-a, and pod-old stale (pod-gone forgotten)", es, err)
	}
	if e, err := st.Push(ctx, "f.yaml", ruleFile(10), 0); err != nil || e.Version != 51 {
		t.Errorf("push without a version: %+v %v; want 51 (above pod-old's 50, ignoring pod-gone's 100)", e, err)
	}
	if ok, _ := rdb.HExists(ctx, RuleSetEnforcersKey, "pod-gone").Result(); ok {
		t.Error("the push left pod-gone's report")
	}
	// Without pushes, the enforcers' polls forget old reports too.
	report("pod-gone", 100, EnforcerForget+time.Minute)
	for range 40 {
		w.check(ctx, false)
	}
	if ok, _ := rdb.HExists(ctx, RuleSetEnforcersKey, "pod-gone").Result(); ok {
		t.Error("40 polls left pod-gone's report")
	}
}

// TestSetStoreOutcomeUnknown: a write that Redis does not answer in time
// may have happened: the error says so (ErrOutcomeUnknown); one that never
// reached Redis does not.
func TestSetStoreOutcomeUnknown(t *testing.T) {
	ctx := context.Background()
	p := redistest.NewProxy(t, redistest.Addr(t))
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, ReadTimeout: 200 * time.Millisecond, DialTimeout: time.Second})
	defer rdb.Close()
	st := NewSetStore(rdb)
	if _, err := st.Push(ctx, "f.yaml", ruleFile(1), 0); err != nil {
		t.Fatal(err)
	}
	p.Inject(redistest.Delay, time.Second)
	if _, err := st.Push(ctx, "f.yaml", ruleFile(2), 0); !errors.Is(err, ErrOutcomeUnknown) {
		t.Errorf("push without an answer: %v, want ErrOutcomeUnknown", err)
	}
	p.Inject(redistest.Refuse, 0)
	if _, err := st.Push(ctx, "f.yaml", ruleFile(3), 0); err == nil || errors.Is(err, ErrOutcomeUnknown) {
		t.Errorf("push to a Redis that refuses connections: %v, want a plain error", err)
	}
	p.Inject(redistest.Pass, 0)
	// The proxy delayed only the reply: the push reached Redis.
	if cur, err := st.Current(ctx); err != nil || cur.Version != 2 {
		t.Errorf("in force after the unanswered push: %+v %v; want version 2: it happened", cur.Version, err)
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
		{"\"vers\\x69on\": 7\ndomain: d\n", 7, ""}, // an escaped key is still the key
		{"domain: d\nrules: []\n", 0, ""},
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

// TestSetStorePushWithoutPublishWritesNothing: a user that may not PUBLISH
// (found by a fresh user: the documented sluice user, which has no
// +publish, running rules push) gets the push refused, and the refusal is
// true: no rule set was written (Redis does not undo a script's earlier
// writes when a later command fails).
func TestSetStorePushWithoutPublishWritesNothing(t *testing.T) {
	pw := redistest.Password(t)
	s := redistest.WithACL(t, []string{"pusher on >" + pw + " ~sluice:* &* -@all +evalsha +eval +hmget +hgetall +hset +hdel +hkeys +time +script"})
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, Username: "pusher", Password: pw, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	_, err := NewSetStore(rdb).Push(ctx, "a.yaml", ruleFile(1), 0)
	if err == nil || !strings.Contains(err.Error(), "publish") && !strings.Contains(err.Error(), "can't run this command") {
		t.Fatalf("push without +publish: %v, want it refused", err)
	}
	if e, err := NewSetStore(s.Admin(t)).Current(ctx); !errors.Is(err, ErrNoRuleSet) {
		t.Fatalf("after the refused push the store holds %+v (%v): want nothing written", e, err)
	}
}
