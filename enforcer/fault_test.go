package enforcer_test

import (
	"bytes"
	"context"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/enforcer/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// lossyConn loses one reply on demand: when armed, the first read after it
// sends a script call waits for the read deadline and reports a timeout,
// while Redis has received the call and runs it. That is a reply lost to a
// slow network or a stalled server, the case in which a retry charges a
// request twice.
type lossyConn struct {
	net.Conn
	arm      *atomic.Bool
	lose     atomic.Bool
	deadline atomic.Int64 // unix ns
}

func (c *lossyConn) Write(b []byte) (int, error) {
	if bytes.Contains(bytes.ToLower(b), []byte("evalsha")) && c.arm.CompareAndSwap(true, false) {
		c.lose.Store(true)
	}
	return c.Conn.Write(b)
}

func (c *lossyConn) SetReadDeadline(t time.Time) error {
	c.deadline.Store(t.UnixNano())
	return c.Conn.SetReadDeadline(t)
}

func (c *lossyConn) SetDeadline(t time.Time) error {
	c.deadline.Store(t.UnixNano())
	return c.Conn.SetDeadline(t)
}

func (c *lossyConn) Read(b []byte) (int, error) {
	if c.lose.CompareAndSwap(true, false) {
		time.Sleep(time.Until(time.Unix(0, c.deadline.Load())))
		return 0, os.ErrDeadlineExceeded
	}
	return c.Conn.Read(b)
}

// TestLostReplyIsChargedOnce: a decision whose reply is lost after Redis ran
// it degrades (the rule's failure mode decides) and is charged exactly once:
// no layer retries the script, on a single node or on a Cluster, whose
// client would otherwise retry timed-out commands in its redirect loop.
func TestLostReplyIsChargedOnce(t *testing.T) {
	const yaml = `
domain: f
rules: [{id: fw, algorithm: fixed_window, match: [{key: user}], limit: 10, period: 1h}]`
	var arm atomic.Bool
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &lossyConn{Conn: c, arm: &arm}, nil
	}
	body := func(t *testing.T, rdb redis.UniversalClient) {
		l := newLimiter(t, rdb, yaml)
		check := func() enforcer.Decision {
			d, err := l.Check(context.Background(), req(0, 1, rules.KeyUser, "u"))
			if err != nil {
				t.Fatal(err)
			}
			return d
		}
		if d := check(); d.Outcome != enforcer.Allowed || d.Remaining != 9 { // warm: script cached, slots known
			t.Fatalf("first: %v remaining %d", d.Outcome, d.Remaining)
		}
		arm.Store(true)
		if d := check(); d.Outcome != enforcer.DegradedOpen || d.Err == nil {
			t.Fatalf("lost reply: %v (err %v), want degraded_open with the error", d.Outcome, d.Err)
		}
		if arm.Load() {
			t.Fatal("no reply was lost: the test did not test")
		}
		time.Sleep(50 * time.Millisecond)
		if d := check(); d.Outcome != enforcer.Allowed || d.Remaining != 7 {
			t.Errorf("after the lost reply: %v remaining %d; want allowed, 7: the lost one charged once", d.Outcome, d.Remaining)
		}
	}
	t.Run("redis-server", func(t *testing.T) {
		c := redis.NewClient(&redis.Options{Addr: redistest.Addr(t), Dialer: dial, MaxRetries: -1,
			ContextTimeoutEnabled: true, ReadTimeout: 500 * time.Millisecond})
		t.Cleanup(func() { c.Close() })
		body(t, c)
	})
	t.Run("cluster", func(t *testing.T) {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.ClusterAddrs(t), Dialer: dial,
			ContextTimeoutEnabled: true, ReadTimeout: 500 * time.Millisecond})
		t.Cleanup(func() { c.Close() })
		body(t, c)
	})
}
