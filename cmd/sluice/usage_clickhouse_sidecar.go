//go:build sidecar

package main

import (
	"errors"

	"github.com/sluice-rl/sluice/enforcer/sidecar"
)

// usageDenials: the sidecar's build links no ClickHouse client, so
// --usage-clickhouse is refused (GET /v1/usage answers null counts without it).
func usageDenials(c *serveConfig) (sidecar.Denials, func(), error) {
	if c.UsageClickHouse.Addr == "" {
		return nil, func() {}, nil
	}
	return nil, nil, errors.New("--usage-clickhouse: this build (sluice-sidecar) has no ClickHouse client; use the full sluice binary for GET /v1/usage's denial counts")
}
