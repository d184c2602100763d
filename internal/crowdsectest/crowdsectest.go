// Package crowdsectest gives tests a real CrowdSec Local API (Debian's
// crowdsec package, 1.4.6 on bookworm) on a free loopback port, with its
// configuration and SQLite database in a temporary directory: only the API
// server runs (crowdsec -no-cs: no agent, no acquisition), with no Central
// API, console, hub or Prometheus endpoint, so nothing leaves the machine.
// cscli runs against the same configuration (Cscli), to add bouncers,
// machines and decisions and to list alerts, as an operator would.
//
// When crowdsec or cscli is not installed, New fails, with the fix:
// nothing is skipped. `make test` installs them (deploy/ci/deps.sh).
package crowdsectest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// ErrNotInstalled is returned when crowdsec or cscli is not on PATH.
var ErrNotInstalled = errors.New("crowdsec or cscli not found on PATH: install Debian's crowdsec package (`make test` does, through deploy/ci/deps.sh)")

// LAPI is one Local API process owned by a test, and its files. Its methods
// are not safe for concurrent use, except URL and Cscli.
type LAPI struct {
	t       testing.TB
	dir     string
	addr    string
	crowd   string
	cscli   string
	cmd     *exec.Cmd
	exited  chan struct{}
	stopped bool
}

// config is the Local API's configuration: the API server only, on
// loopback, SQLite in the test's directory, no Central API (no
// online_client), no console, no Prometheus listener, logs to stdout.
const config = `common:
  daemonize: false
  log_media: stdout
  log_level: info
config_paths:
  config_dir: {dir}/
  data_dir: {dir}/data/
  simulation_path: {dir}/simulation.yaml
  hub_dir: {dir}/hub/
  index_path: {dir}/hub/.index.json
  notification_dir: {dir}/notifications/
  plugin_dir: {dir}/plugins/
db_config:
  type: sqlite
  db_path: {dir}/data/crowdsec.db
  use_wal: true
  log_level: warning
api:
  client:
    credentials_path: {dir}/local_api_credentials.yaml
  server:
    log_level: warning
    listen_uri: {addr}
    profiles_path: {dir}/profiles.yaml
    trusted_ips:
      - 127.0.0.1
      - ::1
prometheus:
  enabled: false
cscli:
  output: human
  color: "no"
`

// profiles is the upstream default: an alert with remediation on an Ip
// makes a 4 h ban.
const profiles = `name: default_ip_remediation
filters:
 - Alert.Remediation == true && Alert.GetScope() == "Ip"
decisions:
 - type: ban
   duration: 4h
on_success: break
`

// New starts a Local API for t, stopped and removed at its cleanup, with a
// machine registered for cscli (whose decisions add and delete go through
// the API). It fails t when it cannot start.
func New(t testing.TB) *LAPI {
	t.Helper()
	crowd, err1 := exec.LookPath("crowdsec")
	cscli, err2 := exec.LookPath("cscli")
	if err1 != nil || err2 != nil {
		t.Fatal(ErrNotInstalled)
	}
	l := &LAPI{t: t, dir: t.TempDir(), crowd: crowd, cscli: cscli}
	for _, d := range []string{"data", "hub", "notifications", "plugins"} {
		if err := os.MkdirAll(filepath.Join(l.dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(l.Stop)
	// The port may be taken between its choice and the bind: up to three
	// ports are tried.
	var err error
	for range 3 {
		if err = l.configure(); err != nil {
			t.Fatal(err)
		}
		if err = l.Start(); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// configure writes the configuration for a free port, and registers
// cscli's own machine: it writes the credentials file (with the URL) that
// cscli decisions add and delete log in with.
func (l *LAPI) configure() error {
	port, err := freePort()
	if err != nil {
		return err
	}
	l.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cfg := strings.NewReplacer("{dir}", l.dir, "{addr}", l.addr).Replace(config)
	for name, body := range map[string]string{
		"config.yaml":                cfg,
		"profiles.yaml":              profiles,
		"simulation.yaml":            "simulation: off\n",
		"local_api_credentials.yaml": "",
	} {
		if err := os.WriteFile(filepath.Join(l.dir, name), []byte(body), 0o600); err != nil {
			return err
		}
	}
	_, err = l.Cscli("machines", "add", "cscli-test", "--force", "--password", randomHex(16), "-f", filepath.Join(l.dir, "local_api_credentials.yaml"))
	return err
}

// URL is the Local API's base URL, http://127.0.0.1:PORT.
func (l *LAPI) URL() string { return "http://" + l.addr }

// Dir is the directory of its configuration and database.
func (l *LAPI) Dir() string { return l.dir }

// Cscli runs cscli with the Local API's configuration and returns its
// standard output; an error carries its standard error.
func (l *LAPI) Cscli(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// CrowdSec v1.4.6 opens its SQLite database without a busy timeout: a
	// cscli write that meets the Local API's own (a bouncer's pull
	// updates its last pull) fails at once with "database is locked",
	// which a loaded machine made happen. Such a run is tried again.
	return backoff.Retry(ctx, func() (string, error) {
		cmd := exec.CommandContext(ctx, l.cscli, append([]string{"-c", filepath.Join(l.dir, "config.yaml"), "--error"}, args...)...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			err = fmt.Errorf("cscli %s: %w: %s", strings.Join(args, " "), err, errb.String())
			if !strings.Contains(errb.String(), "database is locked") {
				err = backoff.Permanent(err)
			}
			return out.String(), err
		}
		return out.String(), nil
	}, backoff.WithBackOff(backoff.NewExponentialBackOff()), backoff.WithMaxTries(8))
}

// AddBouncer registers a bouncer named name and returns its API key.
func (l *LAPI) AddBouncer(name string) string {
	l.t.Helper()
	key := randomHex(16)
	if _, err := l.Cscli("bouncers", "add", name, "-k", key); err != nil {
		l.t.Fatal(err)
	}
	return key
}

// AddMachine registers a validated machine named name and returns its
// password.
func (l *LAPI) AddMachine(name string) string {
	l.t.Helper()
	pw := randomHex(16)
	if _, err := l.Cscli("machines", "add", name, "--password", pw, "-f", os.DevNull); err != nil {
		l.t.Fatal(err)
	}
	return pw
}

// Start runs the Local API (again, after Stop: same port, same database)
// and returns once it answers, within 30 s.
func (l *LAPI) Start() error {
	logf, err := os.OpenFile(filepath.Join(l.dir, "crowdsec.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(l.crowd, "-c", filepath.Join(l.dir, "config.yaml"), "-no-cs", "-no-capi")
	cmd.Dir = l.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive a killed test
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting %s: %w", l.crowd, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(exited) }()
	l.cmd, l.exited, l.stopped = cmd, exited, false
	deadline := time.Now().Add(30 * time.Second)
	hc := &http.Client{Timeout: time.Second}
	for {
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(l.dir, "crowdsec.log"))
			return fmt.Errorf("crowdsec exited before answering on %s; its log:\n%s", l.addr, log)
		default:
		}
		// Any answer (401 without a key) means a server listens there; that
		// it is this one shows by this one not exiting on a taken port.
		if resp, err := hc.Get(l.URL() + "/v1/decisions"); err == nil {
			resp.Body.Close()
			select {
			case <-exited:
				continue // reported above
			case <-time.After(200 * time.Millisecond):
				return nil
			}
		}
		if time.Now().After(deadline) {
			l.Stop()
			return fmt.Errorf("crowdsec did not answer on %s within 30 s", l.addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop stops the Local API (SIGTERM, then SIGKILL after 10 s) and waits
// for it to exit. Safe to call twice.
func (l *LAPI) Stop() {
	if l.cmd == nil || l.stopped {
		return
	}
	l.stopped = true
	_ = l.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-l.exited:
	case <-time.After(10 * time.Second):
		_ = l.cmd.Process.Kill()
		<-l.exited
	}
}

// Log returns what the Local API has logged.
func (l *LAPI) Log() string {
	b, _ := os.ReadFile(filepath.Join(l.dir, "crowdsec.log"))
	return string(b)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
