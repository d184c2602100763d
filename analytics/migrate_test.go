package analytics

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"
)

// The embedded migrations parse, are numbered from 1 without a gap, and
// every statement can run twice: a CREATE ... IF NOT EXISTS, an ALTER
// TABLE adding one column, or an ALTER TABLE giving one column a type (the
// same type again is a no-op; a migration cut short is applied again whole).
func TestMigrations(t *testing.T) {
	ms, err := Migrations()
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) < 4 {
		t.Fatalf("%d migrations: want at least the four tables'", len(ms))
	}
	for i, m := range ms {
		if m.Version != i+1 {
			t.Errorf("migration %s has version %d: want %d", m.Name, m.Version, i+1)
		}
		for _, s := range m.Statements {
			create := strings.HasPrefix(s, "CREATE ") && strings.Contains(s, " IF NOT EXISTS ")
			addColumn := strings.HasPrefix(s, "ALTER TABLE ") && strings.Count(s, " ADD COLUMN ") == 1 && !strings.Contains(s, ",")
			modifyColumn := strings.HasPrefix(s, "ALTER TABLE ") && strings.Count(s, " MODIFY COLUMN ") == 1 &&
				!strings.Contains(s, " ADD ") && !strings.Contains(s, " DROP ") && !strings.Contains(s, ", MODIFY ")
			if !create && !addColumn && !modifyColumn || strings.Contains(s, ";") {
				t.Errorf("%s: a statement that is neither one CREATE ... IF NOT EXISTS, one ALTER TABLE ... ADD COLUMN nor one ALTER TABLE ... MODIFY COLUMN:\n%s", m.Name, s)
			}
		}
	}
}

func TestParseMigrationsRejects(t *testing.T) {
	for name, c := range map[string]struct {
		files map[string]string
		want  string
	}{
		"bad name":        {map[string]string{"1_x.sql": "CREATE TABLE a (x UInt8) ENGINE = Memory;"}, "want a name like"},
		"version 0":       {map[string]string{"0000_x.sql": "CREATE TABLE a (x UInt8) ENGINE = Memory;"}, "versions start at 0001"},
		"same version":    {map[string]string{"0001_a.sql": "SELECT 1;", "0001_b.sql": "SELECT 1;"}, "share version 1"},
		"no semicolon":    {map[string]string{"0001_a.sql": "SELECT 1;\nSELECT 2\n"}, "does not end with ';'"},
		"comments only":   {map[string]string{"0001_a.sql": "-- nothing\n\n"}, "no statement"},
		"upper-case name": {map[string]string{"0001_A.sql": "SELECT 1;"}, "want a name like"},
	} {
		fsys := fstest.MapFS{}
		for n, body := range c.files {
			fsys[n] = &fstest.MapFile{Data: []byte(body)}
		}
		_, err := parseMigrations(fsys)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, c.want)
		}
	}
	ms, err := parseMigrations(fstest.MapFS{
		"0002_b.sql": {Data: []byte("-- two statements\nCREATE TABLE b (x UInt8)\n  ENGINE = Memory;\n\nCREATE TABLE c (x UInt8) ENGINE = Memory;   \n")},
		"0001_a.sql": {Data: []byte("CREATE TABLE a (x UInt8) ENGINE = Memory;\r\n")},
	})
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(ms)
	want := "[{1 0001_a.sql [CREATE TABLE a (x UInt8) ENGINE = Memory]} {2 0002_b.sql [CREATE TABLE b (x UInt8)\n  ENGINE = Memory CREATE TABLE c (x UInt8) ENGINE = Memory]}]"
	if got != want {
		t.Errorf("parsed\n%s\nwant\n%s", got, want)
	}
}

// Migrate applies every migration once: the second run applies none, and
// running every statement again changes nothing.
func TestMigrateTwice(t *testing.T) {
	conn, o := migrated(t, shared(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ms, _ := Migrations()
	if v, err := SchemaVersion(ctx, conn); err != nil || v != ms[len(ms)-1].Version {
		t.Errorf("schema version %d, %v: want %d", v, err, ms[len(ms)-1].Version)
	}
	applied, err := Migrate(ctx, o)
	if err != nil || len(applied) != 0 {
		t.Errorf("second Migrate applied %v, %v: want none", applied, err)
	}
	for _, m := range ms {
		for _, s := range m.Statements {
			if err := conn.Exec(ctx, s); err != nil {
				t.Errorf("%s again: %v", m.Name, err)
			}
		}
	}
	tables := strs(t, conn, "SELECT name FROM system.tables WHERE database = currentDatabase() ORDER BY name")
	want := []string{"decisions", "decisions_per_minute", "decisions_per_minute_mv", "dynamic_rules", "schema_migrations", "shares"}
	if !slices.Equal(tables, want) {
		t.Errorf("tables %v: want %v", tables, want)
	}
	if n := count(t, conn, "SELECT count() FROM schema_migrations"); n != uint64(len(ms)) {
		t.Errorf("%d rows in schema_migrations: want %d", n, len(ms))
	}
}

// A migration that adds a column, cut short after its ALTER (so not
// recorded), is applied again without an error; a statement that fails
// otherwise stops the migration unrecorded.
func TestMigrateAddColumnAgain(t *testing.T) {
	conn, _ := migrated(t, shared(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	add := Migration{Version: 100, Name: "0100_add.sql", Statements: []string{"ALTER TABLE shares ADD COLUMN note String DEFAULT ''"}}
	if err := conn.Exec(ctx, add.Statements[0]); err != nil {
		t.Fatal(err)
	}
	applied, err := migrate(ctx, conn, []Migration{add})
	if err != nil || !slices.Equal(applied, []string{"0100_add.sql"}) {
		t.Errorf("applying an ALTER already run: %v, %v", applied, err)
	}
	bad := Migration{Version: 101, Name: "0101_bad.sql", Statements: []string{"ALTER TABLE shares ADD COLUMN other NoSuchType"}}
	if applied, err := migrate(ctx, conn, []Migration{add, bad}); err == nil || len(applied) != 0 {
		t.Errorf("a failing migration: applied %v, %v", applied, err)
	}
	if v, err := SchemaVersion(ctx, conn); err != nil || v != 100 {
		t.Errorf("schema version %d, %v: want 100", v, err)
	}
}

func TestMigrateErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := Migrate(ctx, ConnOptions{Addr: shared(t).Addr(), Database: "a;b"}); err == nil || !strings.Contains(err.Error(), "want 1-64 characters") {
		t.Errorf("bad database name: %v", err)
	}
	// Nothing listens on a port just closed.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	if _, err := Migrate(ctx, ConnOptions{Addr: addr, DialTimeout: time.Second}); err == nil {
		t.Error("no server: no error")
	}
}
