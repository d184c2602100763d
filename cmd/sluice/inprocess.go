//go:build !sidecar

package main

import "github.com/alicebob/miniredis/v2"

// startInProcessRedis starts an in-process Redis (miniredis) on a loopback
// port, for sluice serve without --redis: trying sluice out.
// What serve's help says of --redis left out, in this build (make sidecar's
// has no in-process Redis: see commands_sidecar.go).
const (
	noRedisHelp      = "With no --redis (or REDIS_ADDR) it runs an in-process Redis, for trying sluice out."
	redisDefaultHelp = "default: in-process"
)

func startInProcessRedis() (addr string, stop func(), err error) {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		return "", nil, err
	}
	return m.Addr(), m.Close, nil
}
