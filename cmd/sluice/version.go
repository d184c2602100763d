package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is the release's version, set by `make release` and `make image`
// with -ldflags '-X main.version=v0.1.0'. Empty, the module's version from the
// build info is used: a tag or pseudo-version when built from a git checkout
// (`go build` stamps it since Go 1.24), "(devel)" for `go run`.
var version string

// commit is the commit the binary was built from, set with -X main.commit=
// where the build cannot read git (the image's build context has no .git).
// Empty, the build info's vcs.revision is used.
var commit string

// buildInfo is what `sluice version` prints: the version, the commit and its
// time, whether the tree had uncommitted changes, and the Go toolchain.
type buildInfo struct {
	Version, Commit, CommitTime, GoVersion, Platform string
	Modified                                         bool
}

// readBuildInfo reads the binary's own build info (runtime/debug), with the
// release's version over the module's when one was set at link time.
func readBuildInfo() buildInfo {
	b := buildInfo{Version: version, Commit: commit, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		if b.Version == "" {
			b.Version = "unknown"
		}
		return b
	}
	if b.Version == "" {
		b.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			if commit == "" {
				b.Commit = s.Value
			}
		case "vcs.time":
			b.CommitTime = s.Value
		case "vcs.modified":
			b.Modified = commit == "" && s.Value == "true"
		}
	}
	return b
}

// print writes the build info as `key: value` lines; a commit the build did
// not record (a build outside a git checkout, or -buildvcs=false) is "unknown".
func (b buildInfo) print(w io.Writer) {
	commit := b.Commit
	if commit == "" {
		commit = "unknown"
	} else if b.Modified {
		commit += " (modified)"
	}
	fmt.Fprintf(w, "sluice %s\ncommit: %s\n", b.Version, commit)
	if b.CommitTime != "" {
		fmt.Fprintf(w, "commit time: %s\n", b.CommitTime)
	}
	fmt.Fprintf(w, "go: %s %s\n", b.GoVersion, b.Platform)
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print sluice's version, the commit it was built from, and the Go toolchain",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			readBuildInfo().print(cmd.OutOrStdout())
			return nil
		},
	}
}
