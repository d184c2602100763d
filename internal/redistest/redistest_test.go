package redistest_test

import (
	"bufio"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/redistest"
)

// TestServerDiesWithTheTestBinary: a test binary killed outright (go
// test's timeout, SIGKILL) runs no cleanup; its redis-servers must not
// outlive it. The test runs itself as a child that starts a server, prints
// its pid and waits; it kills the child and waits for the server to go.
func TestServerDiesWithTheTestBinary(t *testing.T) {
	if os.Getenv("REDISTEST_CHILD") == "1" {
		redistest.Addr(t)
		pid, err := serverPid()
		if err != nil {
			t.Fatal(err)
		}
		os.Stdout.WriteString("pid " + strconv.Itoa(pid) + "\n")
		time.Sleep(time.Minute)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestServerDiesWithTheTestBinary$")
	cmd.Env = append(os.Environ(), "REDISTEST_CHILD=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	var pid int
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "pid "); ok {
			pid, _ = strconv.Atoi(p)
			break
		}
	}
	if pid <= 0 {
		t.Fatal("the child printed no redis-server pid")
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for start := time.Now(); time.Since(start) < 5*time.Second; time.Sleep(20 * time.Millisecond) {
		if !alive(pid) {
			return
		}
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	t.Fatalf("redis-server %d still ran 5 s after its test binary was killed", pid)
}

// serverPid is the pid of this process's child redis-server.
func serverPid() (int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(stat)
		i := strings.LastIndexByte(s, ')')
		if i < 0 || !strings.Contains(s[:i], "(redis-server") {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(os.Getpid()) {
			return strconv.Atoi(e.Name())
		}
	}
	return 0, os.ErrNotExist
}

// alive reports whether pid runs (and is not a zombie).
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && !strings.HasPrefix(strings.TrimSpace(s[i+1:]), "Z")
}
