package enforcer

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// RedisCause names why a Redis call failed, for the error metric's cause
// label, the log, the circuit breaker and readiness. The zero value,
// CauseNone, is no failure. ClassifyRedisError gives an error's cause.
type RedisCause uint8

// The causes, from Redis's error replies (the reply's first word) and the
// client's own errors.
const (
	CauseNone RedisCause = iota
	// CauseNoAuth: NOAUTH, the server wants a password and got none.
	CauseNoAuth
	// CauseWrongPass: WRONGPASS, the username or password is wrong (or the
	// ACL user is disabled).
	CauseWrongPass
	// CauseNoPerm: NOPERM, the ACL user may not run a command (the reply
	// names it; see NoPermCommand) or touch a key or channel.
	CauseNoPerm
	// CauseOOM: OOM, used memory is over maxmemory and the policy
	// (noeviction) refuses writes.
	CauseOOM
	// CauseReadOnly: READONLY, a replica (or a demoted master).
	CauseReadOnly
	// CauseMisconf: MISCONF, writes refused because the server cannot
	// persist (stop-writes-on-bgsave-error).
	CauseMisconf
	// CauseLoading: LOADING, the dataset is still being loaded.
	CauseLoading
	// CauseMasterDown: MASTERDOWN, a replica cut off from its master.
	CauseMasterDown
	// CauseClusterDown: CLUSTERDOWN, slots that no master serves.
	CauseClusterDown
	// CauseMoved: MOVED or ASK, a Cluster redirection.
	CauseMoved
	// CauseTLS: the TLS handshake failed (unknown authority, wrong host
	// name, a client certificate refused or missing, a server that speaks
	// no TLS).
	CauseTLS
	// CauseTimeout: no answer within the deadline (the budget).
	CauseTimeout
	// CauseLate: Redis ran the script past its deadline (ErrLate).
	CauseLate
	// CauseUnreachable: the connection was refused, reset or closed.
	CauseUnreachable
	// CauseBreakerOpen: the circuit breaker kept the call off Redis.
	CauseBreakerOpen
	// CauseReply: another error reply (a script error, NOSCRIPT, ...).
	CauseReply
	// CauseOther: anything else.
	CauseOther
	// CauseStalled: the wait for the answer ended well past its deadline
	// because this process did not run (ErrStalled): a CPU quota's
	// throttling, not Redis.
	CauseStalled
	numCauses
)

var causeNames = [numCauses]string{"none", "noauth", "wrongpass", "noperm", "oom", "readonly", "misconf", "loading",
	"masterdown", "clusterdown", "moved", "tls", "timeout", "late", "unreachable", "breaker_open", "reply", "other", "stalled"}

// String returns the cause's metric label: "noauth", "noperm", "tls", ...
func (c RedisCause) String() string {
	if c < numCauses {
		return causeNames[c]
	}
	return "other"
}

// Refusal reports a cause that refuses every decision however fast Redis
// answers (credentials, permissions, memory, persistence, a replica, a
// node still loading or cut off, a cluster down): the circuit breaker counts
// such error replies as failures, and readiness reports them.
func (c RedisCause) Refusal() bool {
	switch c {
	case CauseNoAuth, CauseWrongPass, CauseNoPerm, CauseOOM, CauseMisconf,
		CauseReadOnly, CauseLoading, CauseMasterDown, CauseClusterDown:
		return true
	}
	return false
}

// Config reports a cause that a change of sluice's own configuration fixes
// (credentials, ACL permissions, TLS settings), as opposed to the state of
// Redis: sluice serve stops at start on these unless told to start degraded.
func (c RedisCause) Config() bool {
	return c == CauseNoAuth || c == CauseWrongPass || c == CauseNoPerm || c == CauseTLS
}

// ClassifyRedisError returns err's cause; CauseNone for nil. It costs a few
// errors.As and a prefix compare: it runs on the error path only.
func ClassifyRedisError(err error) RedisCause {
	if err == nil {
		return CauseNone
	}
	switch {
	case errors.Is(err, ErrStalled):
		return CauseStalled
	case errors.Is(err, ErrBreakerOpen):
		return CauseBreakerOpen
	case errors.Is(err, ErrLate):
		return CauseLate
	}
	var re redis.Error
	if errors.As(err, &re) {
		return replyCause(re.Error())
	}
	if tlsError(err) {
		return CauseTLS
	}
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return CauseTimeout
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, net.ErrClosed), errors.Is(err, syscall.EPIPE):
		return CauseUnreachable
	}
	var op *net.OpError
	if errors.As(err, &op) {
		return CauseUnreachable
	}
	return CauseOther
}

// replyCause maps an error reply by its first word.
func replyCause(msg string) RedisCause {
	msg = strings.TrimPrefix(msg, "ERR ") // some servers (and some script errors) prefix the reply
	word, _, _ := strings.Cut(msg, " ")
	switch word {
	case "NOAUTH":
		return CauseNoAuth
	case "WRONGPASS":
		return CauseWrongPass
	case "NOPERM":
		return CauseNoPerm
	case "OOM":
		return CauseOOM
	case "READONLY":
		return CauseReadOnly
	case "MISCONF":
		return CauseMisconf
	case "LOADING":
		return CauseLoading
	case "MASTERDOWN":
		return CauseMasterDown
	case "CLUSTERDOWN":
		return CauseClusterDown
	case "MOVED", "ASK":
		return CauseMoved
	}
	// A client that has not authenticated and sends a long command (the
	// decision script's call) is cut off by Redis with "ERR Protocol error:
	// unauthenticated multibulk length" (or bulk length): NOAUTH too.
	if strings.Contains(msg, "unauthenticated") {
		return CauseNoAuth
	}
	// A script's failed redis.call comes back as "ERR Error running
	// script ...: @user_script:12: OOM command not allowed ..." on older
	// servers: look for the reply inside.
	if strings.Contains(msg, "@user_script") || strings.HasPrefix(msg, "Error running script") {
		// Redis 7.0 words an ACL refusal inside a script without NOPERM:
		// "The user executing the script can't run this command or
		// subcommand" (or "can't access at least one of the keys", "...
		// channels").
		if strings.Contains(msg, "The user executing the script can't") {
			return CauseNoPerm
		}
		for _, w := range [...]struct {
			s string
			c RedisCause
		}{{"OOM ", CauseOOM}, {"NOPERM ", CauseNoPerm}, {"READONLY ", CauseReadOnly}, {"MISCONF ", CauseMisconf}} {
			if strings.Contains(msg, w.s) {
				return w.c
			}
		}
	}
	return CauseReply
}

// tlsError reports a failed TLS handshake: a certificate the client does not
// trust or that names another host, an alert from the server (a client
// certificate refused or missing), or a server that does not speak TLS.
func tlsError(err error) bool {
	var (
		cv  *tls.CertificateVerificationError
		rh  tls.RecordHeaderError
		al  tls.AlertError
		ua  x509.UnknownAuthorityError
		he  x509.HostnameError
		inv x509.CertificateInvalidError
	)
	if errors.As(err, &cv) || errors.As(err, &rh) || errors.As(err, &al) || errors.As(err, &ua) || errors.As(err, &he) || errors.As(err, &inv) {
		return true
	}
	// The server's alerts come back as "remote error: tls: ...".
	return strings.Contains(err.Error(), "tls: ")
}

// ClosedOnConnect reports an error of a connection the server closed as
// soon as it was opened, before answering: the peer closed it (EOF), reset
// it, or a write met the closed socket (EPIPE). A Redis over its maxclients
// closes so, after an error reply the client may never read; a TLS-only
// Redis closes a plain-text client without a word.
func ClosedOnConnect(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE)
}

// ReplyOnConnect opens a plain-text connection to addr, sends nothing, and
// returns the error reply the server sends at once (without its "-" and
// CRLF), such as "ERR max number of clients reached", or "" if it sends
// none within 300 ms (a healthy Redis waits for a command) or cannot be
// reached. It explains a connection closed on connect (ClosedOnConnect),
// which go-redis reports as the write that met the closed socket ("write:
// broken pipe"); it runs on that error path only.
func ReplyOnConnect(ctx context.Context, addr string) string {
	ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return ""
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	_ = conn.SetReadDeadline(deadline)
	var b [256]byte
	n, _ := io.ReadAtLeast(conn, b[:], 1)
	line, _, _ := strings.Cut(string(b[:n]), "\r\n")
	if !strings.HasPrefix(line, "-") {
		return ""
	}
	return strings.Map(func(r rune) rune { // a line for logs: printable only
		if r < 0x20 || r == 0x7f {
			return -1
		}
		return r
	}, line[1:])
}

// NoPermCommand returns the command a NOPERM reply names ("evalsha" from
// "NOPERM User sluice has no permissions to run the 'evalsha' command"), or
// "" (a key or channel refused, or another reply).
func NoPermCommand(err error) string {
	if err == nil {
		return ""
	}
	msg := err.Error()
	i := strings.Index(msg, "NOPERM")
	if i < 0 {
		return ""
	}
	msg = msg[i:]
	_, after, ok := strings.Cut(msg, "run the '")
	if !ok {
		return ""
	}
	cmd, _, ok := strings.Cut(after, "'")
	if !ok {
		return ""
	}
	return cmd
}

// CauseHint says what to look at for a cause, in a few words for logs and
// /readyz; "" when the error says it all.
func CauseHint(c RedisCause) string {
	switch c {
	case CauseNoAuth:
		return "Redis wants a password: give sluice's (--redis-password-file, REDIS_PASSWORD, or a redis://user:password@host URL)"
	case CauseWrongPass:
		return "Redis refuses sluice's username or password: check --redis-username and the password (--redis-password-file, REDIS_PASSWORD)"
	case CauseNoPerm:
		return "sluice's ACL user lacks a permission: give it the ACL line of docs/operations.md, \"Production Redis\""
	case CauseOOM:
		return "Redis is out of memory (at maxmemory, with nothing it may evict) and refuses the decisions' writes: raise maxmemory or free memory"
	case CauseMisconf:
		return "Redis refuses writes because it cannot persist to disk (stop-writes-on-bgsave-error): fix its disk"
	case CauseReadOnly:
		return "a replica, or a master demoted by a failover: give the master, or its Sentinels"
	case CauseLoading:
		return "Redis is loading its dataset"
	case CauseTLS:
		return "the TLS handshake failed: check --redis-tls-ca, --redis-tls-server-name and the client certificate (--redis-tls-cert, --redis-tls-key)"
	}
	return ""
}

// redisErrors are the limiter's failed Redis calls by cause: a counter and
// a rate-limited log line each, so that one cause's flood does not hide
// another's first line.
type redisErrors struct {
	counts  [numCauses]prometheus.Counter
	lastLog [numCauses]atomic.Int64 // unix ns of each cause's last log line
}

// logEvery is the least time between two log lines of one cause.
const logEvery = 10 * time.Second

// newRedisErrors sets m.redisErrs up and returns its vector, to register.
func (m *metrics) newRedisErrors() *prometheus.CounterVec {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_enforcer_redis_errors_total",
		Help: "Redis script calls that failed, or were not made because the circuit breaker was open, and were handed to the rules' failure modes, by cause (noauth, wrongpass, noperm, oom, readonly, misconf, loading, tls, timeout, unreachable, breaker_open, ...).",
	}, []string{"cause"})
	e := &redisErrors{}
	for c := RedisCause(1); c < numCauses; c++ {
		e.counts[c] = vec.WithLabelValues(c.String())
	}
	m.redisErrs = e
	return vec
}

// failed counts a failed decision call and logs it, at most once per
// logEvery per cause. A caller's cancellation is neither: it says nothing
// about Redis.
func (e *redisErrors) failed(log *slog.Logger, err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	c := ClassifyRedisError(err)
	e.counts[c].Inc()
	now, last := time.Now().UnixNano(), e.lastLog[c].Load()
	if now-last <= int64(logEvery) || !e.lastLog[c].CompareAndSwap(last, now) {
		return
	}
	args := []any{"cause", c.String(), "err", err}
	if c == CauseNoPerm {
		args = append(args, "command", NoPermCommand(err))
	}
	if h := CauseHint(c); h != "" {
		log.Warn("rate limit script failed; using failure modes: "+h, args...)
		return
	}
	log.Warn("rate limit script failed; using failure modes", args...)
}
