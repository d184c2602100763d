package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Password returns a fresh random password, "pw-" and 32 hex digits, that
// no log line could contain by chance: tests grep logs, /readyz and
// /metrics for it.
func Password(t testing.TB) string {
	t.Helper()
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return "pw-" + hex.EncodeToString(b[:])
}

// RequirePass starts a redis-server whose default user needs password
// (requirepass), with extra config arguments, and returns its address.
func RequirePass(t testing.TB, password string, extra ...string) string {
	t.Helper()
	return start(t, false, append([]string{"--requirepass", password}, extra...)...)
}

// ACLServer is a redis-server with ACL users: the default user needs
// AdminPassword (for the test's own clients), and each of Users is an ACL
// line of its own.
type ACLServer struct {
	Addr          string
	AdminPassword string
}

// WithACL starts a redis-server with the ACL users of lines, each a user
// directive's arguments as in an ACL file or ACL SETUSER ("sluice on >pw
// ~sl:* +evalsha"), and a default user that needs a password of its own;
// extra are more config arguments.
func WithACL(t testing.TB, lines []string, extra ...string) *ACLServer {
	t.Helper()
	s := &ACLServer{AdminPassword: Password(t)}
	args := []string{"--user", "default", "on", ">" + s.AdminPassword, "~*", "&*", "+@all"}
	for _, l := range lines {
		args = append(args, "--user")
		args = append(args, strings.Fields(l)...)
	}
	s.Addr = start(t, false, append(args, extra...)...)
	return s
}

// Admin returns a client on the server as its default user, closed at
// cleanup.
func (s *ACLServer) Admin(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, Password: s.AdminPassword, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

// TLSServer is a redis-server that speaks only TLS, with certificates made
// for the test: a CA, a server certificate it signed for 127.0.0.1 and
// localhost, a client certificate it signed, and another CA that signed
// neither (a client that trusts only it refuses the server).
type TLSServer struct {
	Addr string
	// PEM files in a temporary directory.
	CAFile, CertFile, KeyFile     string
	ClientCertFile, ClientKeyFile string
	OtherCAFile                   string
	ca                            *x509.CertPool
	clientCert                    tls.Certificate
}

// TLSOptions configure StartTLS.
type TLSOptions struct {
	// ClientCerts makes the server require a client certificate signed by
	// the CA (tls-auth-clients yes); default: none asked (no).
	ClientCerts bool
	// Password, when set, is the server's requirepass.
	Password string
	// Extra are more config arguments.
	Extra []string
}

// StartTLS starts a redis-server on a TLS port only (port 0), with
// certificates generated now with crypto/x509 (ECDSA P-256, valid an
// hour).
func StartTLS(t testing.TB, o TLSOptions) *TLSServer {
	t.Helper()
	dir := t.TempDir()
	s := &TLSServer{}
	ca, caKey := newCA(t, "sluice test CA")
	other, _ := newCA(t, "another CA")
	s.CAFile = writePEM(t, dir, "ca.pem", "CERTIFICATE", ca.Raw)
	s.OtherCAFile = writePEM(t, dir, "other-ca.pem", "CERTIFICATE", other.Raw)
	s.CertFile, s.KeyFile = leaf(t, dir, "server", ca, caKey, x509.ExtKeyUsageServerAuth)
	s.ClientCertFile, s.ClientKeyFile = leaf(t, dir, "client", ca, caKey, x509.ExtKeyUsageClientAuth)
	s.ca = x509.NewCertPool()
	s.ca.AddCert(ca)
	var err error
	if s.clientCert, err = tls.LoadX509KeyPair(s.ClientCertFile, s.ClientKeyFile); err != nil {
		t.Fatal(err)
	}
	auth := "no"
	if o.ClientCerts {
		auth = "yes"
	}
	args := []string{"--tls-cert-file", s.CertFile, "--tls-key-file", s.KeyFile, "--tls-ca-cert-file", s.CAFile,
		"--tls-auth-clients", auth}
	if o.Password != "" {
		args = append(args, "--requirepass", o.Password)
	}
	s.Addr = startOn(t, false, func(port int) []string { return []string{"--port", "0", "--tls-port", strconv.Itoa(port)} },
		append(args, o.Extra...)...)
	return s
}

// Config returns a client TLS configuration that trusts the server's CA,
// with the client certificate when withCert.
func (s *TLSServer) Config(withCert bool) *tls.Config {
	c := &tls.Config{RootCAs: s.ca, MinVersion: tls.VersionTLS12}
	if withCert {
		c.Certificates = []tls.Certificate{s.clientCert}
	}
	return c
}

// newCA makes a self-signed CA certificate and its key.
func newCA(t testing.TB, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(t), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c, key
}

// leaf makes a certificate for 127.0.0.1 and localhost signed by ca, writes
// it and its key to dir, and returns the two paths.
func leaf(t testing.TB, dir, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(t), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return writePEM(t, dir, name+".pem", "CERTIFICATE", der), writePEM(t, dir, name+"-key.pem", "PRIVATE KEY", kb)
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 64))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func writePEM(t testing.TB, dir, name, kind string, der []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// SentinelAuth is a master whose default user needs MasterPassword and a
// Sentinel monitoring it (as SentinelMaster) that needs SentinelPassword of
// its own, as Sentinels are often protected apart from the data nodes.
type SentinelAuth struct {
	Master, Sentinel                 string
	MasterPassword, SentinelPassword string
}

// NewSentinelAuth starts a master with requirepass and a Sentinel with a
// requirepass of its own, which knows the master's (sentinel auth-pass).
func NewSentinelAuth(t testing.TB) *SentinelAuth {
	t.Helper()
	g := &SentinelAuth{MasterPassword: Password(t), SentinelPassword: Password(t)}
	g.Master = RequirePass(t, g.MasterPassword)
	g.Sentinel = startSentinelWith(t, g.Master, g.MasterPassword, g.SentinelPassword)
	return g
}

// ClusterAuth starts a three-master Redis Cluster, as ClusterAddrs does,
// with requirepass (and masterauth) password on every node, and returns the
// masters' addresses.
func ClusterAuth(t testing.TB, password string) []string {
	t.Helper()
	masters, _ := startClusterWith(t, 0, password)
	return masters
}
