package main

import (
	"time"

	"github.com/spf13/pflag"
)

// usageFlags adds the flags of GET /v1/usage (sidecar.UsageOptions) to
// sluice serve's flags.
func usageFlags(f *pflag.FlagSet, c *serveConfig) {
	f.BoolVar(&c.Server.Usage.Off, "no-usage", false, "do not serve GET /v1/usage (customers' own API key usage)")
	f.StringVar(&c.Server.Usage.KeyHeader, "usage-key-header", "x-api-key", "header that carries the caller's API key on GET /v1/usage")
	f.Int64Var(&c.Server.Usage.Limit, "usage-limit", 30, "GET /v1/usage requests allowed per --usage-period per client address (a fixed window in Redis): the endpoint's own rule")
	f.DurationVar(&c.Server.Usage.Period, "usage-period", time.Minute, "the window of --usage-limit, at least 1s (0: the default)")
	f.StringVar(&c.Server.Usage.ClientIPHeader, "usage-client-ip-header", "", "header a trusted proxy sets to the client's address (e.g. x-envoy-external-address), which keys --usage-limit, read only from --trusted-proxies; default: the connection's address")
	f.StringVar(&c.UsageClickHouse.Addr, "usage-clickhouse", "", "ClickHouse native address HOST:PORT for GET /v1/usage's denial counts (password from $CLICKHOUSE_PASSWORD); default: none, the counts are null")
	f.StringVar(&c.UsageClickHouse.Database, "usage-clickhouse-database", "sluice", "ClickHouse database of sluice's tables, with --usage-clickhouse")
}

// usageClickHouse is where GET /v1/usage reads its denial counts (the
// fields of analytics.ConnOptions that sluice serve sets).
type usageClickHouse struct {
	Addr, Database, Password string
}
