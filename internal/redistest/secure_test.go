package redistest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func ping(t *testing.T, o *redis.Options) error {
	t.Helper()
	o.MaxRetries, o.DialerRetries = -1, 1
	c := redis.NewClient(o)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return c.Ping(ctx).Err()
}

func TestRequirePass(t *testing.T) {
	pw := Password(t)
	addr := RequirePass(t, pw)
	if err := ping(t, &redis.Options{Addr: addr}); !redis.IsAuthError(err) {
		t.Errorf("PING without the password: %v, want NOAUTH", err)
	}
	if err := ping(t, &redis.Options{Addr: addr, Password: "wrong"}); !redis.IsAuthError(err) {
		t.Errorf("PING with a wrong password: %v, want WRONGPASS", err)
	}
	if err := ping(t, &redis.Options{Addr: addr, Password: pw}); err != nil {
		t.Errorf("PING with the password: %v", err)
	}
}

func TestWithACL(t *testing.T) {
	pw := Password(t)
	s := WithACL(t, []string{"pinger on >" + pw + " ~sl:* +ping"})
	if err := ping(t, &redis.Options{Addr: s.Addr, Username: "pinger", Password: pw}); err != nil {
		t.Fatalf("PING as pinger: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr, Username: "pinger", Password: pw, MaxRetries: -1})
	defer c.Close()
	err := c.EvalSha(context.Background(), "0123456789012345678901234567890123456789", []string{"sl:x"}).Err()
	if !redis.IsPermissionError(err) || !strings.Contains(err.Error(), "evalsha") {
		t.Errorf("EVALSHA as pinger: %v, want NOPERM naming evalsha", err)
	}
	if err := s.Admin(t).Set(context.Background(), "k", "v", 0).Err(); err != nil {
		t.Errorf("SET as the default user: %v", err)
	}
}

func TestStartTLS(t *testing.T) {
	for _, certs := range []bool{false, true} {
		s := StartTLS(t, TLSOptions{ClientCerts: certs})
		if err := ping(t, &redis.Options{Addr: s.Addr, TLSConfig: s.Config(true)}); err != nil {
			t.Errorf("client certs %v: PING over TLS with the CA and a client certificate: %v", certs, err)
		}
		err := ping(t, &redis.Options{Addr: s.Addr, TLSConfig: s.Config(false)})
		if certs && err == nil {
			t.Errorf("client certs required: PING without a client certificate succeeded")
		} else if !certs && err != nil {
			t.Errorf("no client certs asked: PING with the CA only: %v", err)
		}
		pem, err := os.ReadFile(s.OtherCAFile)
		if err != nil {
			t.Fatal(err)
		}
		other := x509.NewCertPool()
		other.AppendCertsFromPEM(pem)
		var unknown x509.UnknownAuthorityError
		if err := ping(t, &redis.Options{Addr: s.Addr, TLSConfig: &tls.Config{RootCAs: other}}); !errors.As(err, &unknown) {
			t.Errorf("PING trusting another CA: %v, want x509.UnknownAuthorityError", err)
		}
		if err := ping(t, &redis.Options{Addr: s.Addr}); err == nil {
			t.Errorf("PING in plain text to a TLS-only server succeeded")
		}
	}
}

func TestSentinelAuth(t *testing.T) {
	g := NewSentinelAuth(t)
	if g.MasterPassword == g.SentinelPassword {
		t.Fatal("one password for both")
	}
	fo := func(sentinelPass string) error {
		c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: SentinelMaster, SentinelAddrs: []string{g.Sentinel},
			Password: g.MasterPassword, SentinelPassword: sentinelPass, MaxRetries: -1, DialerRetries: 1})
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return c.Ping(ctx).Err()
	}
	if err := fo(g.SentinelPassword); err != nil {
		t.Errorf("PING through the Sentinel with both passwords: %v", err)
	}
	if err := fo(g.MasterPassword); err == nil {
		t.Errorf("PING with the master's password for the Sentinel succeeded")
	}
}

func TestClusterAuth(t *testing.T) {
	pw := Password(t)
	addrs := ClusterAuth(t, pw)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs[:1], Password: pw, MaxRetries: -1})
	defer c.Close()
	for _, k := range []string{"a", "b", "c", "d", "e", "f"} { // several slots, so several masters
		if err := c.Set(ctx, k, "v", time.Minute).Err(); err != nil {
			t.Fatalf("SET %s through the Cluster with the password: %v", k, err)
		}
	}
	for _, a := range addrs {
		if err := ping(t, &redis.Options{Addr: a}); !redis.IsAuthError(err) {
			t.Errorf("PING %s without the password: %v, want NOAUTH", a, err)
		}
	}
}
