//go:build sidecar

package main

import "github.com/spf13/cobra"

// fullCommands: none in the sidecar's build, which serves (sluice serve)
// and manages rules (sluice rules) only, without the replay's in-process
// Kafka and Redis or the ClickHouse client (make sidecar).
func fullCommands() []*cobra.Command { return nil }

// What serve's help says of --redis left out: this build has no in-process
// Redis, and refuses to start without one (a fresh user found the help
// promising one).
const (
	noRedisHelp      = "--redis (or REDIS_ADDR) is required: this build (make sidecar) has no in-process Redis."
	redisDefaultHelp = "required in this build"
)
