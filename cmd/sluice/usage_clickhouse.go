//go:build !sidecar

package main

import (
	"context"
	"os"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/sluice-rl/sluice/analytics"
	"github.com/sluice-rl/sluice/enforcer/sidecar"
)

// usageDenials returns the denial counts of GET /v1/usage from ClickHouse
// when --usage-clickhouse is given (nil otherwise), and what closes it.
func usageDenials(c *serveConfig) (sidecar.Denials, func(), error) {
	if c.UsageClickHouse.Addr == "" {
		return nil, func() {}, nil
	}
	o := analytics.ConnOptions{Addr: c.UsageClickHouse.Addr, Database: c.UsageClickHouse.Database, Password: c.UsageClickHouse.Password}
	if o.Password == "" {
		o.Password = os.Getenv("CLICKHOUSE_PASSWORD")
	}
	conn, err := analytics.Open(o)
	if err != nil {
		return nil, nil, err
	}
	return clickhouseDenials{conn}, func() { conn.Close() }, nil
}

// clickhouseDenials is sidecar.Denials over analytics.KeyDenials.
type clickhouseDenials struct{ conn driver.Conn }

func (d clickhouseDenials) KeyDenials(ctx context.Context, apiKey string, now time.Time) (map[string]sidecar.DenialCount, error) {
	m, err := analytics.KeyDenials(ctx, d.conn, apiKey, now)
	if err != nil {
		return nil, err
	}
	out := make(map[string]sidecar.DenialCount, len(m))
	for rule, n := range m {
		out[rule] = sidecar.DenialCount{LastHour: n.LastHour, LastDay: n.LastDay}
	}
	return out, nil
}
