//go:build !sidecar

package main

import "github.com/alicebob/miniredis/v2"

// startInProcessRedis starts an in-process Redis (miniredis) on a loopback
// port, for sluice serve without --redis: trying sluice out.
func startInProcessRedis() (addr string, stop func(), err error) {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		return "", nil, err
	}
	return m.Addr(), m.Close, nil
}
