//go:build !sidecar

package main

import (
	"bytes"
	"debug/buildinfo"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// sidecarLeftOut are the modules the sidecar's binary must not link: the
// replay's in-process Redis and Kafka and the ClickHouse client.
var sidecarLeftOut = []string{"github.com/alicebob/miniredis/v2", "github.com/twmb/franz-go/pkg/kfake", "github.com/ClickHouse/clickhouse-go/v2"}

// maxSidecarBytes bounds make sidecar's binary: 35 MiB.
// maxSidecarBytes is issue 33's bound: 35 MB.
const maxSidecarBytes = 35_000_000

// TestSidecarBuild: make sidecar's binary (-tags nocharts,sidecar,grpcnotrace,
// stripped) links no miniredis, kfake, ClickHouse client or charting module,
// is at most 35 MB, serves (sluice serve) and manages rules, knows no replay, and
// refuses to run without a Redis, naming the flag.
func TestSidecarBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds sluice-sidecar (about 30 s uncached)")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "sluice-sidecar")
	if out, err := exec.Command(gobin, "build", "-buildvcs=false", "-tags", "nocharts,sidecar,grpcnotrace", "-trimpath", "-ldflags", "-s -w", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build -tags nocharts,sidecar,grpcnotrace: %v\n%s", err, out)
	}
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range info.Deps {
		for _, m := range sidecarLeftOut {
			if d.Path == m || strings.HasPrefix(d.Path, m+"/") {
				t.Errorf("the sidecar's binary links %s %s", d.Path, d.Version)
			}
		}
		if charting(d.Path) {
			t.Errorf("the sidecar's binary links %s %s", d.Path, d.Version)
		}
	}
	if st, err := os.Stat(bin); err != nil {
		t.Fatal(err)
	} else if st.Size() > maxSidecarBytes {
		t.Errorf("the sidecar's binary is %d bytes, more than 35 MB", st.Size())
	}
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = &out, &out
		cmd.Env = environWithout("REDIS_ADDR")
		err := cmd.Run()
		return out.String(), err
	}
	if out, err := run("rules", "validate", "../../testdata/rules/adaptive.good.yaml"); err != nil {
		t.Errorf("sluice-sidecar rules validate: %v\n%s", err, out)
	}
	if out, err := run("replay"); err == nil || !strings.Contains(out, "unknown command") {
		t.Errorf("sluice-sidecar replay: %v\n%s\nwant an unknown command", err, out)
	}
	if out, err := run("serve", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"); err == nil || !strings.Contains(out, "give --redis") {
		t.Errorf("sluice-sidecar serve without --redis: %v\n%s\nwant a refusal naming --redis", err, out)
	}
}
