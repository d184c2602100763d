package main

import (
	"bytes"
	"os"
	"os/exec"
	"testing"
)

// TestThirdPartyNoticesCurrent: THIRD_PARTY_NOTICES, which the release
// artifacts and the image carry, holds the licence and notice files of
// exactly the modules linked into sluice today (deploy/release/notices.sh).
// A dependency added or moved without `make notices` fails it.
func TestThirdPartyNoticesCurrent(t *testing.T) {
	want, err := exec.Command("../../deploy/release/notices.sh").Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("deploy/release/notices.sh: %v\n%s", err, stderr)
	}
	got, err := os.ReadFile("../../THIRD_PARTY_NOTICES")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("THIRD_PARTY_NOTICES is not what deploy/release/notices.sh writes for today's modules (%d bytes, want %d): run make notices", len(got), len(want))
	}
	if !bytes.Contains(got, []byte("==== github.com/prometheus/client_golang ")) || !bytes.Contains(got, []byte(": NOTICE ====")) {
		t.Errorf("THIRD_PARTY_NOTICES lacks client_golang's notice")
	}
}
