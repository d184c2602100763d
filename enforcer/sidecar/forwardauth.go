package sidecar

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/rules"
)

// ForwardAuthPath is where the forward-auth endpoint is served: nginx's
// auth_request, Caddy's forward_auth and Traefik's ForwardAuth middleware
// call it, with any method, before they proxy a request
// (docs/forward-auth.md).
const ForwardAuthPath = "/v1/forward-auth"

// ForwardAuthOptions configure the forward-auth endpoint (ForwardAuthPath).
// The zero value serves it with the defaults DefaultForwardAuthOptions shows.
//
// A call's descriptors are the original request's, from the headers the
// gateway sets: method (X-Forwarded-Method; else the call's own method),
// path and route (X-Forwarded-Uri, required: the path with its query, which
// the enforcer normalizes), client_ip (ClientIPHeader), api_key
// (APIKeyHeader), the well-known keys of Headers, and every custom key the
// rule set matches that is a header name, from that header (host and
// :authority from X-Forwarded-Host); query:NAME keys come from the path.
// The user agent and X-Request-Id go to the decision record. Identity
// headers (the API key, a single-address client header, Headers, custom
// keys' headers) given twice are refused (400), as are X-Forwarded-Method,
// -Uri and -Host given twice: a gateway that checks one copy and forwards
// another would let a caller spend another's tokens.
type ForwardAuthOptions struct {
	// Off turns the endpoint off (404).
	Off bool
	// TrustedProxies are the networks of the gateways that call the
	// endpoint: a call from any other address is refused (403), since the
	// client's address and the request come from headers that only a
	// gateway may set. Default loopback (127.0.0.0/8, ::1/128): a gateway
	// in the same pod or host.
	TrustedProxies []netip.Prefix
	// ClientIPHeader is where the client's address comes from. With
	// X-Forwarded-For (the default, which all three gateways send), it is
	// the rightmost address not in TrustedProxies (the one the first
	// trusted proxy saw), every X-Forwarded-For line read as one list;
	// any other header (X-Real-IP) must hold one address and come once.
	ClientIPHeader string
	// APIKeyHeader carries the api_key descriptor. Default "x-api-key".
	APIKeyHeader string
	// Headers maps other well-known descriptor keys to the request headers
	// they are read from, e.g. user: X-User-Id, tenant: X-Tenant-Id. A
	// header that is absent leaves its descriptor out.
	Headers map[rules.Key]string
}

// DefaultForwardAuthOptions returns the defaults that zero fields of
// ForwardAuthOptions get.
func DefaultForwardAuthOptions() ForwardAuthOptions {
	return ForwardAuthOptions{
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")},
		ClientIPHeader: "X-Forwarded-For",
		APIKeyHeader:   "x-api-key",
	}
}

func (o *ForwardAuthOptions) validate() error {
	def := DefaultForwardAuthOptions()
	if o.TrustedProxies == nil {
		o.TrustedProxies = def.TrustedProxies
	}
	if o.ClientIPHeader == "" {
		o.ClientIPHeader = def.ClientIPHeader
	}
	if o.APIKeyHeader == "" {
		o.APIKeyHeader = def.APIKeyHeader
	}
	seen := map[string]string{}
	named := func(what, h string) error {
		c := http.CanonicalHeaderKey(h)
		if !validHeaderName(h) {
			return fmt.Errorf("sidecar: forward-auth: %s header %q is not a header name", what, h)
		}
		if prev, dup := seen[c]; dup {
			return fmt.Errorf("sidecar: forward-auth: header %q is both %s's and %s's", h, prev, what)
		}
		seen[c] = what
		return nil
	}
	if err := named("the client address", o.ClientIPHeader); err != nil {
		return err
	}
	if err := named("api_key", o.APIKeyHeader); err != nil {
		return err
	}
	for k, h := range o.Headers {
		switch k {
		case rules.KeyAPIKey, rules.KeyClientIP, rules.KeyMethod, rules.KeyPath, rules.KeyRoute:
			return fmt.Errorf("sidecar: forward-auth: %s comes from its own header (APIKeyHeader, ClientIPHeader, X-Forwarded-Method, X-Forwarded-Uri), not Headers", k)
		}
		if k >= rules.NumKeys {
			return fmt.Errorf("sidecar: forward-auth: Headers: key %d is not a well-known key", k)
		}
		if err := named(k.String(), h); err != nil {
			return err
		}
	}
	for _, p := range o.TrustedProxies {
		if !p.IsValid() {
			return fmt.Errorf("sidecar: forward-auth: a trusted proxy network is not valid")
		}
	}
	return nil
}

// validHeaderName reports whether s is an HTTP field name (RFC 9110 token).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// forwardAuth is one call's request, built in the scratch's memory: a
// RateLimitRequest of one descriptor, decided by check as the other APIs'
// are.
type forwardAuth struct {
	desc    ratelimitv3.RateLimitDescriptor
	descs   [1]*ratelimitv3.RateLimitDescriptor
	entries [MaxEntries]ratelimitv3.RateLimitDescriptor_Entry
	ptrs    [MaxEntries]*ratelimitv3.RateLimitDescriptor_Entry
	n       int
	size    int64 // bytes of header values read
}

func (f *forwardAuth) reset() {
	f.n, f.size = 0, 0
}

// add appends an entry.
func (f *forwardAuth) add(key, value string) {
	if f.n == len(f.entries) {
		return // more than a rule set can name; not reached
	}
	e := &f.entries[f.n]
	e.Reset()
	e.Key, e.Value = key, value
	f.ptrs[f.n] = e
	f.n++
	f.size += int64(len(value))
}

// request returns the RateLimitRequest of the entries added.
func (f *forwardAuth) request(in *rlsv3.RateLimitRequest, domain string) {
	f.desc.Reset()
	f.desc.Entries = f.ptrs[:f.n]
	f.descs[0] = &f.desc
	in.Reset()
	in.Domain = domain
	in.Descriptors = f.descs[:]
}

// errRefused is a forward-auth call refused before any decision, with the
// status to answer.
type errRefused struct {
	code int
	msg  string
}

func (e *errRefused) Error() string { return e.msg }

func refuse(code int, format string, a ...any) error {
	return &errRefused{code: code, msg: fmt.Sprintf(format, a...)}
}

// The headers every gateway sets for the original request (nginx with
// proxy_set_header, as docs/forward-auth.md shows; Caddy and Traefik on
// their own).
const (
	hdrMethod = "X-Forwarded-Method"
	hdrURI    = "X-Forwarded-Uri"
	hdrHost   = "X-Forwarded-Host"
)

// serveForwardAuth answers a gateway's forward-auth call: 200 with the
// rate-limit headers when the original request may pass, 429 (or the
// deny_status query parameter's 401 or 403, for nginx's auth_request, which
// passes no other) with Retry-After and the rate-limit headers when a rule
// denies it, 503 with Retry-After when the limiter sheds it or a fail-closed
// rule denies while Redis is unavailable (Options.UnavailableStatus; with
// deny_status, that status), 400 for a request it cannot decide, 403 for a
// caller that is not a trusted proxy, 431 for headers past
// Options.MaxBody.
func (s *Server) serveForwardAuth(w http.ResponseWriter, hr *http.Request) {
	sc := s.scratch.Get().(*scratch)
	defer s.scratch.Put(sc)
	denyStatus, err := denyStatusOf(hr)
	if err == nil {
		err = s.forwardAuthRequest(hr, sc)
	}
	if err != nil {
		s.checks[apiForwardAuth][codeInvalid].Inc()
		code := http.StatusBadRequest
		var rf *errRefused
		if errors.As(err, &rf) {
			code = rf.code
		}
		writeError(w, code, err.Error())
		return
	}
	r := s.checkHTTP(w, hr, sc, apiForwardAuth)
	if r == nil {
		return
	}
	defer s.replies.Put(r)
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		w.WriteHeader(http.StatusOK)
		return
	}
	code := http.StatusTooManyRequests
	switch {
	case denyStatus != 0:
		code = denyStatus
	case sc.d.Reason == decision.ReasonLimiterUnavailable:
		code = s.opts.UnavailableStatus
	case sc.d.Reason == decision.ReasonShed:
		code = http.StatusServiceUnavailable
	}
	writeError(w, code, http.StatusText(code))
}

// denyStatusOf reads the deny_status query parameter: 0 (none), 401, 403 or
// 429.
func denyStatusOf(hr *http.Request) (int, error) {
	if hr.URL.RawQuery == "" {
		return 0, nil
	}
	vs := hr.URL.Query()["deny_status"]
	if len(vs) > 1 { // as a header given twice (found by a fresh user: the first was taken)
		return 0, refuse(http.StatusBadRequest, "deny_status given %d times: give it once", len(vs))
	}
	v := ""
	if len(vs) == 1 {
		v = vs[0]
	}
	switch v {
	case "":
		return 0, nil
	case "401":
		return http.StatusUnauthorized, nil
	case "403":
		return http.StatusForbidden, nil
	case "429":
		return http.StatusTooManyRequests, nil
	default:
		return 0, refuse(http.StatusBadRequest, "deny_status=%s: want 401 or 403 (for nginx's auth_request), or 429", v)
	}
}

// forwardAuthRequest builds sc.in from the gateway's headers.
func (s *Server) forwardAuthRequest(hr *http.Request, sc *scratch) error {
	o := &s.opts.ForwardAuth
	peer, err := netip.ParseAddrPort(hr.RemoteAddr)
	if err != nil || !trusted(o.TrustedProxies, peer.Addr()) {
		return refuse(http.StatusForbidden, "the caller %s is not a trusted proxy: forward-auth takes the client's address and request from headers that only a gateway may set (sluice serve --trusted-proxies)", hr.RemoteAddr)
	}
	f := &sc.fa
	f.reset()
	h := hr.Header
	uri, err := once(h, hdrURI)
	if err != nil {
		return err
	}
	if uri == "" {
		return refuse(http.StatusBadRequest, "no %s header: the gateway must send the original request's path and query in it (docs/forward-auth.md)", hdrURI)
	}
	if uri[0] != '/' && !strings.Contains(uri, "://") {
		// Found by a fresh user: "v1/login" escaped a path: /v1/login rule.
		// A request target is origin-form (/path?query) or absolute-form.
		return refuse(http.StatusBadRequest, "%s %q: want the request's path, starting with /, and its query (or an absolute URI)", hdrURI, uri)
	}
	method, err := once(h, hdrMethod)
	if err != nil {
		return err
	}
	if method == "" {
		method = hr.Method
	}
	f.add("method", method)
	f.add("path", uri)
	f.add("route", uri)
	f.size -= int64(len(uri)) // one header read, two entries: counted once (a fresh user's 32 800-byte URI was refused as 65 623 bytes)
	ip, err := clientIP(h, o)
	if err != nil {
		return err
	}
	f.add("client_ip", ip)
	if k, err := once(h, o.APIKeyHeader); err != nil {
		return err
	} else if k != "" {
		f.add("api_key", k)
	}
	for k, name := range o.Headers {
		if v, err := once(h, name); err != nil {
			return err
		} else if v != "" {
			f.add(k.String(), v)
		}
	}
	set := s.lim.Rules()
	for _, name := range set.CustomKeys() {
		header := name
		if name == "host" || name == ":authority" {
			header = hdrHost
		} else if !validHeaderName(name) {
			continue // query:NAME, from the path; or no header's name
		}
		if v, err := once(h, header); err != nil {
			return err
		} else if v != "" {
			f.add(name, v)
		}
	}
	if ua := h.Get("User-Agent"); ua != "" {
		f.add("user_agent", ua)
	}
	if id := h.Get("X-Request-Id"); id != "" {
		f.add("request_id", id)
	}
	if f.size > s.opts.MaxBody {
		return refuse(http.StatusRequestHeaderFieldsTooLarge, "the headers read are %d bytes, more than %d", f.size, s.opts.MaxBody)
	}
	f.request(&sc.in, set.Domain)
	return nil
}

// once returns header name's value, "" when absent, and an error (400) when
// it is given more than once.
func once(h http.Header, name string) (string, error) {
	vs := h.Values(name)
	switch len(vs) {
	case 0:
		return "", nil
	case 1:
		return vs[0], nil
	}
	return "", refuse(http.StatusBadRequest, "header %s is given %d times: a request has one (a gateway that reads one copy and forwards another would let a caller act as someone else)", name, len(vs))
}

// clientIP returns the client's address from the gateway's headers (see
// ForwardAuthOptions.ClientIPHeader).
func clientIP(h http.Header, o *ForwardAuthOptions) (string, error) {
	if !strings.EqualFold(o.ClientIPHeader, "X-Forwarded-For") {
		v, err := once(h, o.ClientIPHeader)
		if err != nil {
			return "", err
		}
		a, err := netip.ParseAddr(strings.TrimSpace(v))
		if err != nil {
			return "", refuse(http.StatusBadRequest, "header %s: %q is not an address: the gateway must set it to the client's", o.ClientIPHeader, v)
		}
		return a.String(), nil
	}
	vs := h.Values(o.ClientIPHeader)
	if len(vs) == 0 {
		return "", refuse(http.StatusBadRequest, "no %s header: the gateway must send the client's address in it", o.ClientIPHeader)
	}
	// Rightmost first: each proxy appends the address it saw, so the first
	// address from the right that no trusted proxy has is the client's; an
	// address further left was written by the client, and anyone can
	// write anything there.
	var leftmost string
	for i := len(vs) - 1; i >= 0; i-- {
		list := vs[i]
		for list != "" {
			var entry string
			if j := strings.LastIndexByte(list, ','); j >= 0 {
				list, entry = list[:j], list[j+1:]
			} else {
				list, entry = "", list
			}
			entry = strings.TrimSpace(entry)
			if entry == "" {
				continue
			}
			a, err := netip.ParseAddr(entry)
			if err != nil {
				if ap, perr := netip.ParseAddrPort(entry); perr == nil {
					a, err = ap.Addr(), nil
				}
			}
			if err != nil {
				return "", refuse(http.StatusBadRequest, "header %s: %q is not an address", o.ClientIPHeader, entry)
			}
			a = a.Unmap()
			if !trusted(o.TrustedProxies, a) {
				return a.String(), nil
			}
			leftmost = a.String()
		}
	}
	if leftmost == "" {
		return "", refuse(http.StatusBadRequest, "header %s holds no address", o.ClientIPHeader)
	}
	return leftmost, nil // every hop a trusted proxy: the client is the first
}

// trusted reports whether a is in one of the networks.
func trusted(nets []netip.Prefix, a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range nets {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
