package analytics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Report is one of sluice's reports: a query of
// deploy/clickhouse/queries/<Name>.sql, run by `sluice report NAME`.
type Report struct {
	Name  string
	Title string
}

var reports = []Report{
	{"top_denied_keys", "top denied keys: the keys with the most denied requests, by denying rule"},
	{"shadow_would_block", "what each shadow-mode rule would have blocked, by key"},
	{"detector_audit", "the detector audit: each dynamic rule, its evidence, its effect on traffic"},
	{"region_shares", "per-region usage of each global rule against the region's share"},
	{"degraded_over_time", "degraded decisions (storage failed) per minute and region"},
	{"key_usage", "one API key's requests by hour and rule: allowed, denied (needs --api-key)"},
}

// Reports lists the reports in the order `sluice report` shows them.
func Reports() []Report { return append([]Report(nil), reports...) }

// ErrUnknownReport is returned by RunReport for a name Reports does not
// list.
var ErrUnknownReport = errors.New("analytics: unknown report")

// ReportParams bound a report: decisions with event time in [From, To),
// and at most Limit rows (top_denied_keys) or keys per rule
// (shadow_would_block); key_usage reads APIKey's decisions only.
type ReportParams struct {
	From, To time.Time
	Limit    int // default 20
	// APIKey is key_usage's API key (required there, unused elsewhere).
	APIKey string
}

// ErrNoAPIKey is RunReport's error for key_usage without an API key.
var ErrNoAPIKey = errors.New("analytics: report key_usage needs an API key (--api-key)")

// Table is a report's result: column names and rows of formatted values
// (times in UTC as 2006-01-02 15:04:05).
type Table struct {
	Columns []string
	Rows    [][]string
}

// RunReport runs report name (dashes or underscores) over p's range. Every
// report reads the deduplicated data (FINAL, or the per-minute request-id
// sets), so a redelivered batch does not change it.
func RunReport(ctx context.Context, conn driver.Conn, name string, p ReportParams) (*Table, error) {
	name = strings.ReplaceAll(name, "-", "_")
	known := false
	for _, r := range reports {
		known = known || r.Name == name
	}
	if !known {
		return nil, fmt.Errorf("%w %q: want one of %s", ErrUnknownReport, name, strings.Join(ReportNames(), ", "))
	}
	if !p.From.Before(p.To) {
		return nil, fmt.Errorf("analytics: report range [%v, %v) is empty", p.From, p.To)
	}
	if p.Limit <= 0 {
		p.Limit = 20
	}
	if name == "key_usage" && p.APIKey == "" {
		return nil, ErrNoAPIKey
	}
	q, err := queryFile(name)
	if err != nil {
		return nil, fmt.Errorf("analytics: report %s: %w", name, err)
	}
	// Bound by the client (18.16 has no server-side parameters): integers,
	// and the API key as a quoted, escaped string literal.
	rows, err := conn.Query(ctx, q, clickhouse.Named("from", dateTime(p.From).Unix()),
		clickhouse.Named("to", dateTime(p.To).Unix()), clickhouse.Named("limit", p.Limit),
		clickhouse.Named("api_key", p.APIKey))
	if err != nil {
		return nil, fmt.Errorf("analytics: report %s: %w", name, err)
	}
	defer rows.Close()
	t := &Table{Columns: rows.Columns()}
	types := rows.ColumnTypes()
	for rows.Next() {
		vals := make([]any, len(types))
		for i, ct := range types {
			vals[i] = reflect.New(ct.ScanType()).Interface()
		}
		if err := rows.Scan(vals...); err != nil {
			return nil, fmt.Errorf("analytics: report %s: %w", name, err)
		}
		row := make([]string, len(vals))
		for i, v := range vals {
			row[i] = formatValue(reflect.ValueOf(v).Elem().Interface())
		}
		t.Rows = append(t.Rows, row)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("analytics: report %s: %w", name, err)
	}
	return t, nil
}

// ReportNames returns the reports' names.
func ReportNames() []string {
	ns := make([]string, len(reports))
	for i, r := range reports {
		ns[i] = r.Name
	}
	return ns
}

func formatValue(v any) string {
	switch x := v.(type) {
	case time.Time:
		return x.UTC().Format(time.DateTime)
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	case float32:
		return strconv.FormatFloat(float64(x), 'f', -1, 32)
	case string:
		return x
	}
	return fmt.Sprint(v)
}

// WriteText prints the table aligned in columns (text/tabwriter), a header
// line first; "(no rows)" when empty.
func (t *Table) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(t.Columns, "\t"))
	for _, r := range t.Rows {
		fmt.Fprintln(tw, strings.Join(clean(r), "\t"))
	}
	if len(t.Rows) == 0 {
		fmt.Fprintln(tw, "(no rows)")
	}
	return tw.Flush()
}

// clean replaces tabs and line breaks, which would break the columns.
func clean(r []string) []string {
	out := make([]string, len(r))
	for i, s := range r {
		out[i] = strings.Map(func(c rune) rune {
			if c == '\t' || c == '\n' || c == '\r' {
				return ' '
			}
			return c
		}, s)
	}
	return out
}
