package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/pipeline"
)

// pythonProducer returns a producer that writes decision records with
// testdata/xlang/produce.py: Debian's python3 with python3-confluent-kafka
// (librdkafka) and python3-protobuf, and Python code that protoc generates
// from decision.proto into a temporary folder. It skips the test, saying
// which, only where those are not installed (deploy/ci/deps.sh installs
// them); any other failure fails it.
func pythonProducer(t *testing.T) func(t *testing.T, brokers []string, events []xlangEvent) {
	t.Helper()
	protoc, err := exec.LookPath("protoc")
	if err != nil {
		t.Skip("no protoc (Debian: protobuf-compiler): the cross-language producer test needs it")
	}
	// Debian's python3 first: a python3 earlier in PATH (pyenv, a venv)
	// does not see Debian's packages.
	var python string
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if path, err := exec.LookPath(p); err == nil && exec.Command(path, "-c", "import confluent_kafka, google.protobuf").Run() == nil {
			python = path
			break
		}
	}
	if python == "" {
		t.Skip("no python3 that imports confluent_kafka and google.protobuf (Debian: python3-confluent-kafka, python3-protobuf)")
	}
	pb2 := t.TempDir()
	if out, err := exec.Command(protoc, "--python_out="+pb2, "-I", "../../decision/decisionpb", "decision.proto").CombinedOutput(); err != nil {
		t.Fatalf("protoc --python_out: %v\n%s", err, out)
	}
	return func(t *testing.T, brokers []string, events []xlangEvent) {
		t.Helper()
		b, err := json.Marshal(events)
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(t.TempDir(), "events.json")
		if err := os.WriteFile(file, b, 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(python, "../../testdata/xlang/produce.py", strings.Join(brokers, ","), pipeline.DefaultTopic, pb2, file).CombinedOutput()
		if err != nil {
			t.Fatalf("produce.py: %v\n%s", err, out)
		}
		if got := strings.TrimSpace(string(out)); got != strconv.Itoa(len(events)) {
			t.Fatalf("produce.py acknowledged %s records, want %d", got, len(events))
		}
	}
}
