package analytics

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"

	ddl "github.com/sluice-rl/sluice/deploy/clickhouse"
)

// Migration is one versioned DDL file of deploy/clickhouse: NNNN_name.sql.
type Migration struct {
	Version    int      // NNNN, > 0
	Name       string   // the file name
	Statements []string // in order, without comments
}

var migrationName = regexp.MustCompile(`^([0-9]{4})_[a-z0-9_]+\.sql$`)

// Migrations returns the schema's migrations in order of version, parsed
// from the files embedded from deploy/clickhouse. Statements end with a ';'
// at the end of a line; lines that start with "--" are comments.
func Migrations() ([]Migration, error) {
	return parseMigrations(ddl.Files)
}

func parseMigrations(fsys fs.FS) ([]Migration, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, err
	}
	var ms []Migration
	for _, name := range names {
		m := migrationName.FindStringSubmatch(name)
		if m == nil {
			return nil, fmt.Errorf("analytics: migration %s: want a name like 0001_decisions.sql", name)
		}
		v, _ := strconv.Atoi(m[1])
		if v == 0 {
			return nil, fmt.Errorf("analytics: migration %s: versions start at 0001", name)
		}
		if len(ms) > 0 && ms[len(ms)-1].Version == v {
			return nil, fmt.Errorf("analytics: migrations %s and %s share version %d", ms[len(ms)-1].Name, name, v)
		}
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		stmts, err := splitStatements(string(b))
		if err != nil {
			return nil, fmt.Errorf("analytics: migration %s: %w", name, err)
		}
		ms = append(ms, Migration{Version: v, Name: name, Statements: stmts})
	}
	// fs.Glob sorts by name, and names start with the zero-padded version.
	return ms, nil
}

// splitStatements splits SQL text into statements: each ends with ';' at
// the end of a line; lines starting with "--" are dropped.
func splitStatements(text string) ([]string, error) {
	var stmts []string
	var cur []string
	for line := range strings.SplitSeq(text, "\n") {
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "--") {
			continue
		}
		cur = append(cur, strings.TrimRight(line, " \t\r"))
		if strings.HasSuffix(t, ";") {
			s := strings.TrimSuffix(strings.TrimSpace(strings.Join(cur, "\n")), ";")
			stmts = append(stmts, s)
			cur = nil
		}
	}
	if len(cur) > 0 {
		return nil, errors.New("the last statement does not end with ';'")
	}
	if len(stmts) == 0 {
		return nil, errors.New("no statement")
	}
	return stmts, nil
}

const migrationsTable = `CREATE TABLE IF NOT EXISTS schema_migrations (
    version    UInt32,
    name       String,
    applied_at DateTime('UTC')
) ENGINE = MergeTree()
ORDER BY version`

// Migrate creates database o.Database when it is missing and applies the
// migrations its schema_migrations table does not list, in order of
// version, recording each once all its statements have run. It returns the
// names of those it applied (none when the schema is up to date).
//
// Every statement is idempotent (CREATE ... IF NOT EXISTS; an ALTER TABLE
// ... ADD COLUMN of a column that exists is taken as done, since 18.16 has
// no ADD COLUMN IF NOT EXISTS), so a migration cut short by a failure is
// applied again whole by the next run; two processes migrating at once both
// succeed. Migrate is what `sluice
// clickhouse migrate` runs, and the sink at its start.
func Migrate(ctx context.Context, o ConnOptions) ([]string, error) {
	ms, err := Migrations()
	if err != nil {
		return nil, err
	}
	if err := o.defaults(); err != nil {
		return nil, err
	}
	admin := o
	admin.Database = "default"
	ac, err := Open(admin)
	if err != nil {
		return nil, err
	}
	err = ac.Exec(ctx, "CREATE DATABASE IF NOT EXISTS "+quoteIdent(o.Database))
	ac.Close()
	if err != nil {
		return nil, fmt.Errorf("analytics: creating database %s: %w", o.Database, err)
	}
	conn, err := Open(o)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return migrate(ctx, conn, ms)
}

func migrate(ctx context.Context, conn driver.Conn, ms []Migration) ([]string, error) {
	if err := conn.Exec(ctx, migrationsTable); err != nil {
		return nil, fmt.Errorf("analytics: creating schema_migrations: %w", err)
	}
	done, err := appliedVersions(ctx, conn)
	if err != nil {
		return nil, err
	}
	var applied []string
	for _, m := range ms {
		if slices.Contains(done, m.Version) {
			continue
		}
		for i, s := range m.Statements {
			if err := conn.Exec(ctx, s); err != nil && !columnExists(s, err) {
				return applied, fmt.Errorf("analytics: migration %s, statement %d: %w", m.Name, i+1, err)
			}
		}
		err := insert(ctx, conn, "INSERT INTO schema_migrations (version, name, applied_at)",
			[][]any{{uint32(m.Version), m.Name, time.Now().UTC()}})
		if err != nil {
			return applied, fmt.Errorf("analytics: recording migration %s: %w", m.Name, err)
		}
		applied = append(applied, m.Name)
	}
	return applied, nil
}

// columnExists reports whether err is ClickHouse refusing an ALTER TABLE ...
// ADD COLUMN because the column exists: a migration cut short after it ran
// is applied again, and 18.16 has no ADD COLUMN IF NOT EXISTS.
func columnExists(stmt string, err error) bool {
	var ex *proto.Exception
	u := strings.ToUpper(stmt)
	return strings.HasPrefix(u, "ALTER TABLE ") && strings.Contains(u, " ADD COLUMN ") &&
		errors.As(err, &ex) && (ex.Code == 44 || ex.Code == 15) && strings.Contains(ex.Message, "already exists")
}

// appliedVersions returns the versions schema_migrations lists.
func appliedVersions(ctx context.Context, conn driver.Conn) ([]int, error) {
	rows, err := conn.Query(ctx, "SELECT DISTINCT version FROM schema_migrations ORDER BY version")
	if err != nil {
		return nil, fmt.Errorf("analytics: reading schema_migrations: %w", err)
	}
	defer rows.Close()
	var vs []int
	for rows.Next() {
		var v uint32
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		vs = append(vs, int(v))
	}
	return vs, rows.Err()
}

// SchemaVersion returns the newest migration version applied to the
// database conn uses, 0 when none.
func SchemaVersion(ctx context.Context, conn driver.Conn) (int, error) {
	vs, err := appliedVersions(ctx, conn)
	if err != nil || len(vs) == 0 {
		return 0, err
	}
	return vs[len(vs)-1], nil
}

// ConnOptions name a ClickHouse server and database.
type ConnOptions struct {
	// Addr is the server's native-protocol address, HOST:PORT; default
	// 127.0.0.1:9000.
	Addr string
	// Database holds sluice's tables; default "sluice". A name of
	// [A-Za-z0-9_].
	Database string
	// User and Password; default user "default", no password.
	User, Password string
	// DialTimeout bounds a connection attempt (default 5 s), ReadTimeout a
	// query's or insert's wait for the server (default 30 s): a server
	// that stopped answering fails the call rather than hanging it.
	DialTimeout, ReadTimeout time.Duration
}

var dbName = regexp.MustCompile(`^[A-Za-z0-9_]{1,64}$`)

func (o *ConnOptions) defaults() error {
	if o.Addr == "" {
		o.Addr = "127.0.0.1:9000"
	}
	if o.Database == "" {
		o.Database = "sluice"
	}
	if !dbName.MatchString(o.Database) {
		return fmt.Errorf("analytics: database %q: want 1-64 characters of A-Z a-z 0-9 _", o.Database)
	}
	if o.User == "" {
		o.User = "default"
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 5 * time.Second
	}
	if o.ReadTimeout <= 0 {
		o.ReadTimeout = 30 * time.Second
	}
	return nil
}

// Open returns a connection pool to o's server and database over
// ClickHouse's native protocol (clickhouse-go v2). It does not wait for the
// server: the first call does.
func Open(o ConnOptions) (driver.Conn, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr:        []string{o.Addr},
		Protocol:    clickhouse.Native,
		Auth:        clickhouse.Auth{Database: o.Database, Username: o.User, Password: o.Password},
		DialTimeout: o.DialTimeout,
		ReadTimeout: o.ReadTimeout,
	})
	if err != nil {
		return nil, fmt.Errorf("analytics: clickhouse %s: %w", o.Addr, err)
	}
	return conn, nil
}

// quoteIdent quotes a name checked by dbName.
func quoteIdent(s string) string { return "`" + s + "`" }

// queryFile returns the text of deploy/clickhouse/queries/NAME.sql.
func queryFile(name string) (string, error) {
	b, err := fs.ReadFile(ddl.Files, path.Join("queries", name+".sql"))
	return string(b), err
}
