package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/rules/store"
)

// setRedis sets c's Redis from the resolved flags.
func (c *serveConfig) setRedis(t *redisTarget) {
	c.Redis, c.RedisCluster, c.RedisSentinel, c.RedisDB, c.RedisAuth = t.Addrs, t.Cluster, t.Master, t.DB, t.Auth
}

// target is c's Redis as a redisTarget.
func (c *serveConfig) target() *redisTarget {
	return &redisTarget{Addrs: c.Redis, DB: c.RedisDB, Cluster: c.RedisCluster || len(c.Redis) > 1 && c.RedisSentinel == "",
		Master: c.RedisSentinel, Auth: c.RedisAuth, From: "--redis"}
}

// checkRedisStart runs the readiness probe once, within ctx, before the
// sidecar serves, and then looks at Redis's maxmemory-policy (mem: nil for
// the in-process Redis):
//
//   - Redis refuses sluice's credentials, ACL permissions or TLS (NOAUTH,
//     WRONGPASS, NOPERM, a failed handshake): an error naming the flag to
//     fix, unless --redis-start-degraded, when the sidecar starts and every
//     decision follows its rule's failure mode until the probe succeeds.
//   - Redis does not answer, or refuses writes (OOM, READONLY, LOADING, ...):
//     the sidecar starts (Redis may come up, or recover, after it), as the
//     probe logged.
//   - an evicting maxmemory-policy (allkeys-*, volatile-*): an error naming
//     --redis-allow-eviction, unless given, when the policy was logged as a
//     warning and /readyz shows it.
func checkRedisStart(ctx context.Context, c *serveConfig, probe *enforcer.Probe, mem *enforcer.MemoryPolicy) error {
	err := probe.Check(ctx)
	cause := enforcer.ClassifyRedisError(err)
	switch {
	case err == nil:
	case strings.Contains(err.Error(), "DB index is out of range") && !c.RedisStartDegraded:
		return fmt.Errorf("sidecar: redis has no database %d (%v): give one it has (its databases setting, 16 by default) in the --redis URL's /DB (redis://HOST:PORT/DB); or pass --redis-start-degraded to start anyway, with every decision following its rule's failure mode", c.RedisDB, err)
	case cause.Config() && !c.RedisStartDegraded:
		return fmt.Errorf("sidecar: redis refuses sluice at start (%s): %v: %s; or pass --redis-start-degraded to start anyway, with every decision following its rule's failure mode", cause, err, startFix(cause, err))
	case cause == enforcer.CauseUnreachable && enforcer.ClosedOnConnect(err) && !c.RedisAuth.TLS:
		// Found by a fresh user: a Redis at its maxclients said "ERR max
		// number of clients reached" and closed, and sluice reported the
		// write that met the closed socket ("broken pipe"). Read what it
		// says to a new connection.
		for _, addr := range c.Redis {
			if reply := enforcer.ReplyOnConnect(ctx, addr); reply != "" {
				c.Logger.Error("redis closes new connections with an error: every decision follows its rule's failure mode until it takes them (a Redis at its maxclients: raise its maxclients; each sidecar opens 32 connections at start and up to 128)",
					"addr", addr, "reply", reply, "err", err)
				return nil
			}
		}
		// Found by a fresh user: a TLS-only Redis given as redis:// started
		// "ready", and every decision degraded. A server that completes a
		// TLS handshake on the address is one.
		for _, addr := range c.Redis {
			if speaksTLS(ctx, addr) && !c.RedisStartDegraded {
				return fmt.Errorf("sidecar: redis at %s speaks TLS (it closed the plain-text connection at once; a TLS handshake on it completed): pass --redis-tls (REDIS_TLS) with --redis-tls-ca, or use a rediss:// URL; or pass --redis-start-degraded to start anyway", addr)
			}
		}
		c.Logger.Warn("redis closed the connection at once: if it takes TLS only, pass --redis-tls (or a rediss:// URL)", "err", err)
	case cause == enforcer.CauseTimeout && c.RedisAuth.TLS:
		// A plain-text Redis reads a TLS ClientHello as the start of an
		// inline command and waits for its end: the handshake times out
		// rather than fails. Asked in plain text, such a server answers.
		for _, addr := range c.Redis {
			if speaksPlainText(ctx, addr) && !c.RedisStartDegraded {
				return fmt.Errorf("sidecar: redis at %s speaks plain text, not TLS (the TLS handshake timed out; PING in plain text was answered): drop --redis-tls (REDIS_TLS), or use a redis:// URL rather than rediss://; or pass --redis-start-degraded to start anyway", addr)
			}
		}
	}
	if mem == nil {
		return nil
	}
	if st := mem.Status(); st.Evicting && !c.RedisAllowEviction {
		return fmt.Errorf("sidecar: redis maxmemory-policy %s can evict sluice's counters under memory pressure, and an evicted counter resets its limit: set maxmemory-policy noeviction (docs/operations.md, \"Production Redis\"), or pass --redis-allow-eviction to start anyway", strings.Join(st.Policies, ", "))
	}
	return nil
}

// checkHomesStart probes each --home region's Redis once at start: one
// that refuses sluice (credentials, ACL, TLS, a database it lacks) stops
// the start, as the region's own Redis does, unless --redis-start-degraded;
// one that does not answer is logged (by its probe) and the sidecar
// starts: another region's outage must not stop this one's sidecars, and
// the pinned rules homed there follow their failure modes until it
// answers.
func checkHomesStart(ctx context.Context, c *serveConfig, homes map[string]*enforcer.Probe) error {
	for _, region := range slices.Sorted(maps.Keys(homes)) {
		err := homes[region].Check(ctx)
		if err == nil || c.RedisStartDegraded {
			continue
		}
		cause := enforcer.ClassifyRedisError(err)
		switch {
		case strings.Contains(err.Error(), "DB index is out of range"):
			return fmt.Errorf("sidecar: --home %s: its redis has no such database (%v): give one it has in the URL's /DB (redis://HOST:PORT/DB); or pass --redis-start-degraded to start anyway, with the rules homed there following their failure modes", region, err)
		case cause.Config():
			return fmt.Errorf("sidecar: --home %s: its redis refuses sluice at start (%s): %v: %s (a --home URL's own user:password, or the region's --redis credentials); or pass --redis-start-degraded to start anyway, with the rules homed there following their failure modes", region, cause, err, startFix(cause, err))
		}
	}
	return nil
}

// refusedAtStart is checkRedis's error for an address that refuses INFO to
// sluice's credentials, permissions or TLS (nil with --redis-start-degraded):
// it names the Sentinels' flags for a Sentinel.
func refusedAtStart(c *serveConfig, addr string, cause enforcer.RedisCause, err error) error {
	if c.RedisStartDegraded {
		return nil
	}
	fix := startFix(cause, err)
	what := "redis at " + addr
	if c.RedisSentinel != "" {
		what = "the Sentinel at " + addr
		if cause == enforcer.CauseNoAuth || cause == enforcer.CauseWrongPass {
			fix = "give the Sentinels' own credentials with --redis-sentinel-password-file (or REDIS_SENTINEL_PASSWORD_FILE, REDIS_SENTINEL_PASSWORD) and --redis-sentinel-username, or in the --redis URL"
		}
	}
	return fmt.Errorf("sidecar: %s refuses sluice at start (%s): %v: %s; or pass --redis-start-degraded to start anyway, with every decision following its rule's failure mode", what, cause, err, fix)
}

// startFix names the flags to fix for a start-up refusal.
func startFix(cause enforcer.RedisCause, err error) string {
	switch cause {
	case enforcer.CauseNoAuth:
		return "Redis wants a password: give it with --redis-password-file FILE (or REDIS_PASSWORD_FILE, REDIS_PASSWORD, or redis://USER:PASSWORD@HOST:PORT in --redis)"
	case enforcer.CauseWrongPass:
		return "Redis refuses the username or password: check --redis-username and --redis-password-file (or REDIS_USERNAME, REDIS_PASSWORD_FILE, REDIS_PASSWORD, the --redis URL's user:password)"
	case enforcer.CauseNoPerm:
		what := "a command or key (Redis's ACL LOG names it)"
		if cmd := enforcer.NoPermCommand(err); cmd != "" {
			what = "the command " + cmd
		}
		return "the ACL user (--redis-username) may not run " + what + ": give it the ACL line of docs/operations.md, \"Production Redis\", or name another user"
	case enforcer.CauseTLS:
		return "check --redis-tls-ca (the CA that signed Redis's certificate), --redis-tls-server-name (the name in it), and --redis-tls-cert and --redis-tls-key when Redis asks for a client certificate"
	}
	return enforcer.CauseHint(cause)
}

// speaksPlainText reports whether addr answers PING sent in plain text
// within 500 ms (a +PONG, or an error reply such as -NOAUTH: RESP either way).
func speaksPlainText(ctx context.Context, addr string) bool {
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	var b [1]byte
	if _, err := io.ReadFull(conn, b[:]); err != nil {
		return false
	}
	return b[0] == '+' || b[0] == '-'
}

// speaksTLS reports whether the server at addr completes a TLS handshake
// within 500 ms. It verifies nothing (it sends nothing but the handshake,
// and only asks what the server speaks).
func speaksTLS(ctx context.Context, addr string) bool {
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	d := &tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // a probe of the protocol, no data sent
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

// checkRedisExtras tells, at start, what the ACL user may not do besides
// deciding (which checkRedisStart and the heartbeat check): run the
// read-only scripts of /v1/usage (EVALSHA_RO, EVAL_RO), and, with
// --rules-redis, SUBSCRIBE to rule-set pushes. Each refusal is logged as a
// warning naming what stops working (found by a fresh user: both started
// silently, and /v1/usage then blamed Redis for the decisions). Other
// errors say nothing here: the probe speaks for an unreachable Redis.
func checkRedisExtras(ctx context.Context, c *serveConfig, rdb redis.UniversalClient) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	fix := "give the ACL user the line of docs/operations.md, \"Production Redis\""
	// A script that reads nothing: its EVAL_RO and its EVALSHA_RO (NOSCRIPT
	// when allowed and not cached) are refused by the ACL before they run.
	nothing := redis.NewScript("return 1")
	for _, err := range []error{
		nothing.EvalRO(ctx, rdb, nil).Err(),
		rdb.EvalShaRO(ctx, nothing.Hash(), nil).Err(),
	} {
		if enforcer.ClassifyRedisError(err) == enforcer.CauseNoPerm {
			c.Logger.Warn("redis refuses the read-only usage script: /v1/usage cannot read remaining counts (decisions are not affected); "+fix,
				"command", enforcer.NoPermCommand(err), "err", err)
			break
		}
	}
	if !c.RulesRedis {
		return
	}
	ps := rdb.Subscribe(ctx, store.RuleSetChannel)
	defer ps.Close()
	if _, err := ps.ReceiveTimeout(ctx, time.Second); enforcer.ClassifyRedisError(err) == enforcer.CauseNoPerm {
		c.Logger.Warn("redis refuses SUBSCRIBE to rule-set pushes: a pushed rule set arrives only by polling, up to --rules-poll late; "+fix,
			"channel", store.RuleSetChannel, "err", err)
	}
}
