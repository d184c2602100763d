package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/sluice-rl/sluice/enforcer/sidecar"
	"github.com/sluice-rl/sluice/rules"
)

// The default listen addresses of sluice serve. Decisions and usage
// (--grpc, --http) are on loopback: the gateway is in the pod (Envoy,
// nginx, Caddy) or on the host, and anyone who reaches /v1/check or the
// rate limit service can spend any client's tokens, and /v1/usage read any
// key's. The probes and metrics (--admin-http) are on every interface, for
// the kubelet and Prometheus, and serve nothing else.
const (
	defaultHTTPAddr  = "127.0.0.1:8080"
	defaultAdminAddr = ":8082"
)

// adminServer serves the probes and metrics (sidecar.Server.AdminHandler)
// on a listener of their own, --admin-http.
type adminServer struct {
	l  net.Listener
	hs *http.Server
}

// newAdmin is the admin server (the probes and metrics, --admin-http) on
// l; nil without a listener.
func newAdmin(l net.Listener, srv *sidecar.Server, log *slog.Logger) *adminServer {
	if l == nil {
		return nil
	}
	return &adminServer{l: l, hs: &http.Server{
		Handler:           srv.AdminHandler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}}
}

// addr is the listener's address, "" without one.
func (a *adminServer) addr() string {
	if a == nil {
		return ""
	}
	return a.l.Addr().String()
}

// serve serves until shutdown; nil after it.
func (a *adminServer) serve() error {
	if a == nil {
		return nil
	}
	if err := a.hs.Serve(a.l); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// shutdown stops the server, waiting for its requests until ctx ends.
func (a *adminServer) shutdown(ctx context.Context) {
	if a == nil {
		return
	}
	if err := a.hs.Shutdown(ctx); err != nil {
		a.hs.Close()
	}
}

// warnTrustAll warns about a --trusted-proxies network that holds every
// address (0.0.0.0/0, ::/0): every caller's X-Forwarded-For is then
// trusted, so a client picks its own address, and a fresh key of its own
// for each request.
func warnTrustAll(log *slog.Logger, trusted []netip.Prefix) {
	for _, p := range trusted {
		if p.Bits() == 0 {
			log.Warn("--trusted-proxies holds every address: any caller of forward-auth may write its own X-Forwarded-For and so choose the client address it is limited by; name the gateways' networks instead",
				"network", p.String())
		}
	}
}

// warnExposed warns about a decision listener (gRPC or HTTP) bound to an
// address other hosts can reach: fine behind a network policy that admits
// only gateways, a hole without one.
func warnExposed(log *slog.Logger, grpcAddr, httpAddr net.Addr) {
	for _, l := range []struct {
		name, flag string
		addr       net.Addr
	}{{"gRPC", "--grpc", grpcAddr}, {"HTTP", "--http", httpAddr}} {
		if ap, err := netip.ParseAddrPort(l.addr.String()); err == nil && !ap.Addr().IsLoopback() {
			log.Warn("the "+l.name+" decisions listener is on an address other hosts can reach: whoever reaches it can spend any client's tokens and read any key's usage; keep it on loopback (the default), or admit only the gateways (a network policy, docs/forward-auth.md)",
				"flag", l.flag, "addr", l.addr.String())
		}
	}
}

// frontDoorFlags adds the flags of the listeners and the forward-auth
// endpoint to f, and returns what sets c from them once they are parsed.
func frontDoorFlags(f *pflag.FlagSet, c *serveConfig) (apply func() error) {
	f.StringVar(&c.AdminAddr, "admin-http", defaultAdminAddr, "admin HTTP listen address: /healthz, /readyz and /metrics only, for the kubelet and Prometheus; \"\" for none")
	var (
		trusted  []string
		headers  map[string]string
		hashFile string
	)
	def := sidecar.DefaultForwardAuthOptions()
	f.BoolVar(&c.Server.ForwardAuth.Off, "no-forward-auth", false, "do not serve "+sidecar.ForwardAuthPath+" (nginx's auth_request, Caddy's forward_auth, Traefik's ForwardAuth)")
	f.StringSliceVar(&trusted, "trusted-proxies", []string{"127.0.0.0/8", "::1/128"}, "networks of the gateways that may call forward-auth; their X-Forwarded-For is trusted, and a call from elsewhere is refused (403)")
	f.StringVar(&c.Server.ForwardAuth.ClientIPHeader, "forward-auth-client-ip-header", def.ClientIPHeader, "forward-auth: the header with the client's address: X-Forwarded-For (the rightmost address not in --trusted-proxies), or one that holds one address (X-Real-IP)")
	f.StringVar(&c.Server.ForwardAuth.APIKeyHeader, "forward-auth-key-header", def.APIKeyHeader, "forward-auth: the header of the api_key descriptor")
	f.StringToStringVar(&headers, "forward-auth-header", nil, "forward-auth: another descriptor from a header, KEY=HEADER (user=X-User-Id, tenant=X-Tenant-Id); repeat for each; custom keys are read from the header of their name")
	f.StringVar(&hashFile, "value-hash-key-file", "", "file holding the secret key of the hash that stands for descriptor values over 4096 bytes in decision records (the same on every sidecar, e.g. a Kubernetes Secret); default: a public key")
	return func() error {
		c.Server.ForwardAuth.TrustedProxies = nil
		for _, s := range trusted {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				a, aerr := netip.ParseAddr(s)
				if aerr != nil {
					return fmt.Errorf("--trusted-proxies %q: want a network such as 10.0.0.0/8 or an address", s)
				}
				p = netip.PrefixFrom(a, a.BitLen())
			}
			c.Server.ForwardAuth.TrustedProxies = append(c.Server.ForwardAuth.TrustedProxies, p.Masked())
		}
		if len(c.Server.ForwardAuth.TrustedProxies) == 0 {
			return fmt.Errorf("--trusted-proxies is empty: forward-auth would refuse every gateway; give --no-forward-auth to turn it off")
		}
		for k, h := range headers {
			key, err := rules.ParseKey(k)
			if err != nil {
				return fmt.Errorf("--forward-auth-header %s=%s: %w", k, h, err)
			}
			if c.Server.ForwardAuth.Headers == nil {
				c.Server.ForwardAuth.Headers = map[rules.Key]string{}
			}
			c.Server.ForwardAuth.Headers[key] = h
		}
		if hashFile != "" {
			b, err := os.ReadFile(hashFile)
			if err != nil {
				return fmt.Errorf("--value-hash-key-file: %w", err)
			}
			key := bytes.TrimSpace(b)
			if len(key) < 16 {
				return fmt.Errorf("--value-hash-key-file %s: the key is %d bytes; want at least 16 (e.g. head -c 32 /dev/urandom | base64)", hashFile, len(key))
			}
			c.Limiter.ValueHashKey = key
		}
		return nil
	}
}
