package analytics

import (
	"context"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// KeyDenial is one rule's denials of one API key.
type KeyDenial struct {
	LastHour, LastDay int64
}

// KeyDenials returns, by denying rule id, apiKey's denied requests (outcome
// denied) with an event time in [now-1h, now) and [now-24h, now): the query
// of deploy/clickhouse/queries/key_denials.sql, read with FINAL so that a
// redelivered record counts once. Rules without denials are not in the map.
// It is the denial count of the sidecar's GET /v1/usage (sluice serve
// --clickhouse). The key is bound as an escaped string literal.
func KeyDenials(ctx context.Context, conn driver.Conn, apiKey string, now time.Time) (map[string]KeyDenial, error) {
	q, err := queryFile("key_denials")
	if err != nil {
		return nil, fmt.Errorf("analytics: key denials: %w", err)
	}
	rows, err := conn.Query(ctx, q, clickhouse.Named("api_key", apiKey), clickhouse.Named("now", dateTime(now).Unix()))
	if err != nil {
		return nil, fmt.Errorf("analytics: key denials: %w", err)
	}
	defer rows.Close()
	out := map[string]KeyDenial{}
	for rows.Next() {
		var rule string
		var hour, day uint64
		if err := rows.Scan(&rule, &hour, &day); err != nil {
			return nil, fmt.Errorf("analytics: key denials: %w", err)
		}
		out[rule] = KeyDenial{LastHour: int64(hour), LastDay: int64(day)}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("analytics: key denials: %w", err)
	}
	return out, nil
}
