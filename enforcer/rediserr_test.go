package enforcer_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// reply is an error reply as go-redis gives it (a redis.Error).
type reply string

func (r reply) Error() string { return string(r) }
func (reply) RedisError()     {}

func TestClassifyRedisError(t *testing.T) {
	refused := func() error {
		_, err := net.Dial("tcp", "127.0.0.1:1")
		return err
	}()
	// A TLS client on a plain-text server (a reply that is no TLS
	// record), and one that trusts another CA than the server's.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("-ERR unknown command\r\n"))
			c.Close()
		}
	}()
	plain := ln.Addr().String()
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 2 * time.Second}, Config: &tls.Config{InsecureSkipVerify: true}}
	hctx, hcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer hcancel()
	_, recordErr := d.DialContext(hctx, "tcp", plain)
	s := redistest.StartTLS(t, redistest.TLSOptions{})
	_, caErr := tls.Dial("tcp", s.Addr, &tls.Config{MinVersion: tls.VersionTLS12})
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	for _, c := range []struct {
		err  error
		want enforcer.RedisCause
	}{
		{nil, enforcer.CauseNone},
		{reply("NOAUTH Authentication required."), enforcer.CauseNoAuth},
		{reply("ERR Protocol error: unauthenticated multibulk length"), enforcer.CauseNoAuth},
		{reply("WRONGPASS invalid username-password pair or user is disabled."), enforcer.CauseWrongPass},
		{reply("NOPERM User sluice has no permissions to run the 'evalsha' command"), enforcer.CauseNoPerm},
		{reply("NOPERM this user has no permissions to access one of the keys used as arguments"), enforcer.CauseNoPerm},
		// Redis 7.0's wording of a refusal inside the script (found by a fresh user: serve started degraded).
		{reply("ERR The user executing the script can't run this command or subcommand script: 2c1e0b5f, on @user_script:140."), enforcer.CauseNoPerm},
		{reply("ERR The user executing the script can't access at least one of the keys mentioned in the command script: 2c1e0b5f, on @user_script:140."), enforcer.CauseNoPerm},
		{reply("OOM command not allowed when used memory > 'maxmemory'. script: 5f1e..., on @user_script:42."), enforcer.CauseOOM},
		{reply("ERR Error running script (call to f_5f1e): @user_script:42: OOM command not allowed when used memory > 'maxmemory'."), enforcer.CauseOOM},
		{reply("READONLY You can't write against a read only replica."), enforcer.CauseReadOnly},
		{reply("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk."), enforcer.CauseMisconf},
		{reply("LOADING Redis is loading the dataset in memory"), enforcer.CauseLoading},
		{reply("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), enforcer.CauseMasterDown},
		{reply("CLUSTERDOWN The cluster is down"), enforcer.CauseClusterDown},
		{reply("MOVED 3999 127.0.0.1:6381"), enforcer.CauseMoved},
		{reply("NOSCRIPT No matching script. Please use EVAL."), enforcer.CauseReply},
		{fmt.Errorf("failed to authenticate: %w", reply("WRONGPASS invalid username-password pair")), enforcer.CauseWrongPass},
		{enforcer.ErrBreakerOpen, enforcer.CauseBreakerOpen},
		{enforcer.ErrBreakerRamp, enforcer.CauseBreakerOpen},
		{enforcer.ErrLate, enforcer.CauseLate},
		{ctx.Err(), enforcer.CauseTimeout},
		{refused, enforcer.CauseUnreachable},
		{recordErr, enforcer.CauseTLS},
		{caErr, enforcer.CauseTLS},
		{errors.New("something else"), enforcer.CauseOther},
	} {
		if got := enforcer.ClassifyRedisError(c.err); got != c.want {
			t.Errorf("%v: %s, want %s", c.err, got, c.want)
		}
	}
	if recordErr == nil || caErr == nil {
		t.Fatalf("the TLS handshakes succeeded: %v, %v", recordErr, caErr)
	}
	if got := enforcer.NoPermCommand(reply("NOPERM User sluice has no permissions to run the 'evalsha' command")); got != "evalsha" {
		t.Errorf("NoPermCommand: %q", got)
	}
	if got := enforcer.NoPermCommand(reply("NOPERM this user has no permissions to access one of the keys")); got != "" {
		t.Errorf("NoPermCommand of a key refusal: %q", got)
	}
}

// TestRefusalsOpenTheBreaker (issue 32): error replies that refuse every
// decision however fast they come (NOPERM, NOAUTH, WRONGPASS, OOM, MISCONF)
// are failures to the circuit breaker, which opens; each is counted under
// its cause and logged with it. Before, an ACL user that could PING but not
// EVALSHA kept the breaker closed and every decision degraded unseen.
func TestRefusalsOpenTheBreaker(t *testing.T) {
	pw := redistest.Password(t)
	acl := redistest.WithACL(t, []string{"noeval on >" + pw + " ~* +@all -evalsha"})
	needsPass := redistest.RequirePass(t, pw)
	full := redistest.Addr(t)
	fullAdmin := redis.NewClient(&redis.Options{Addr: full})
	t.Cleanup(func() { fullAdmin.Close() })
	if err := fullAdmin.ConfigSet(context.Background(), "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		opts  *redis.Options
		cause string
	}{
		{"NOPERM", &redis.Options{Addr: acl.Addr, Username: "noeval", Password: pw}, "noperm"},
		{"NOAUTH", &redis.Options{Addr: needsPass}, "noauth"},
		{"WRONGPASS", &redis.Options{Addr: needsPass, Password: pw + "x"}, "wrongpass"},
		{"OOM", &redis.Options{Addr: full}, "oom"},
		{"MISCONF", &redis.Options{Addr: replyingRedis(t, "-MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.")}, "misconf"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.opts.MaxRetries, c.opts.ContextTimeoutEnabled, c.opts.DialerRetries = -1, true, 1
			rdb := redis.NewClient(c.opts)
			t.Cleanup(func() { rdb.Close() })
			reg := prometheus.NewRegistry()
			var log bytes.Buffer
			l, err := enforcer.New(rdb, mustSet(t, `
domain: f
rules:
  - {id: login, failure_mode: closed, match: [{key: route, value: /login}, {key: user}], limit: 5, period: 15m}
  - {id: user, match: [{key: user}], limit: 100, period: 1s}`),
				enforcer.Options{Budget: time.Second, Breaker: enforcer.BreakerOptions{Failures: 3, Cooldown: time.Hour}, Registerer: reg,
					Logger: slog.New(slog.NewTextHandler(&log, nil))})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				d := decideAny(t, l, req(0, 1, rules.KeyUser, "u"))
				if d.Outcome != decision.DegradedOpen || enforcer.ClassifyRedisError(d.Err).String() != c.cause {
					t.Fatalf("fail-open rule, call %d: %v (err %v), want degraded_open with %s", i, d.Outcome, d.Err, c.cause)
				}
			}
			d := decideAny(t, l, req(0, 1, rules.KeyUser, "u", rules.KeyRoute, "/login"))
			if !errors.Is(d.Err, enforcer.ErrBreakerOpen) || d.Outcome != decision.DegradedClosed {
				t.Errorf("after 3 %s replies: %v (err %v), want degraded_closed with the breaker open", c.name, d.Outcome, d.Err)
			}
			if !l.BreakerOpen() {
				t.Error("BreakerOpen: false")
			}
			if n := testutil.ToFloat64(counterOf(t, reg, "sluice_enforcer_redis_errors_total", "cause", c.cause)); n != 3 {
				t.Errorf("sluice_enforcer_redis_errors_total{cause=%q} %v, want 3", c.cause, n)
			}
			if n := testutil.ToFloat64(counterOf(t, reg, "sluice_enforcer_redis_errors_total", "cause", "breaker_open")); n != 1 {
				t.Errorf("sluice_enforcer_redis_errors_total{cause=breaker_open} %v, want 1", n)
			}
			// One line per cause within 10 s, with the cause: the refusal
			// and the open breaker each once.
			if got := strings.Count(log.String(), "rate limit script failed"); got != 2 || !strings.Contains(log.String(), "cause="+c.cause) {
				t.Errorf("%d log lines, want one for %s and one for the open breaker:\n%s", got, c.cause, log.String())
			}
			if c.cause == "noperm" && !strings.Contains(log.String(), "command=evalsha") {
				t.Errorf("the NOPERM line does not name the command:\n%s", log.String())
			}
		})
	}
}

// counterOf returns the series of a vector metric in reg with label=value.
func counterOf(t *testing.T, reg *prometheus.Registry, name, label, value string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					v := m.GetCounter().GetValue()
					if m.GetGauge() != nil {
						v = m.GetGauge().GetValue()
					}
					g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
					g.Set(v)
					return g
				}
			}
		}
	}
	t.Fatalf("no %s{%s=%q} in the registry", name, label, value)
	return nil
}
