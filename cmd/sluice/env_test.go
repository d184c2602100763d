package main

import (
	"os"
	"strings"
	"testing"
)

// unsetenv unsets name for the test and restores it after (t.Setenv's
// restore): an empty REDIS_ADDR is an error, not "no Redis".
func unsetenv(t *testing.T, name string) {
	t.Helper()
	t.Setenv(name, "")
	os.Unsetenv(name)
}

// environWithout is os.Environ() without the variables named, for a child
// process that must not see them.
func environWithout(names ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		keep := true
		for _, n := range names {
			if name == n {
				keep = false
			}
		}
		if keep {
			out = append(out, kv)
		}
	}
	return out
}
