//go:build sidecar

package main

import "github.com/spf13/cobra"

// fullCommands: none in the sidecar's build, which serves (sluice serve)
// and manages rules (sluice rules) only, without the replay's in-process
// Kafka and Redis or the ClickHouse client (make sidecar).
func fullCommands() []*cobra.Command { return nil }
