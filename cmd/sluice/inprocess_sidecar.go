//go:build sidecar

package main

import "errors"

// startInProcessRedis fails in the sidecar's build, which links no
// in-process Redis: a sidecar needs its region's Redis.
func startInProcessRedis() (addr string, stop func(), err error) {
	return "", nil, errors.New("this build (sluice-sidecar) has no in-process Redis: give --redis (or REDIS_ADDR); the full sluice binary has one, for trying sluice out")
}
