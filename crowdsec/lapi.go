package crowdsec

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode"
)

// Errors of the Local API client.
var (
	// ErrUnauthorized: the Local API refused the bouncer's API key or the
	// machine's login (401 or 403): the key was deleted (cscli bouncers
	// delete), the machine's password is wrong, or the machine is not
	// validated (cscli machines validate).
	ErrUnauthorized = errors.New("crowdsec: the Local API refused the credentials")
	// ErrNoCredentials: the call needs an API key (decisions) or a machine
	// id and password (alerts) that the client was not given.
	ErrNoCredentials = errors.New("crowdsec: no credentials for this call")
)

// StatusError is an answer of the Local API other than success: its status
// and the start of its body (which carries no credential of ours).
type StatusError struct {
	Op     string // e.g. "GET /v1/decisions/stream"
	Status int
	Body   string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("crowdsec: %s: status %d: %s", e.Op, e.Status, e.Body)
}

// ClientOptions configure a Client.
type ClientOptions struct {
	// URL is the Local API's base URL, http(s)://HOST:PORT, as `cscli
	// config show` gives api.server.listen_uri (required). It may not carry
	// a user or password: credentials go in APIKey and Password.
	URL string
	// APIKey is a bouncer's key (`cscli bouncers add NAME`), for the
	// decision stream. Sent as X-Api-Key; never logged.
	APIKey string
	// MachineID and Password are a machine's (`cscli machines add NAME
	// --password ...`), for pushing alerts: the client logs in
	// (/v1/watchers/login) and sends the JWT it gets. The password is
	// never logged.
	MachineID, Password string
	// Scenarios are announced at login (the machine's scenarios, which
	// cscli machines list shows); optional.
	Scenarios []string
	// Timeout bounds each request, the whole answer read. Default 10 s.
	Timeout time.Duration
	// Transport is the HTTP transport; default a clone of
	// http.DefaultTransport (proxy from the environment, system CAs for
	// https).
	Transport http.RoundTripper
	// UserAgent is sent with every request, NAME/VERSION: the Local API
	// refuses a machine's login without a "/" in it (1.4), and cscli
	// machines list shows what follows it as the machine's version.
	// Default "sluice/dev".
	UserAgent string
}

// Client speaks the CrowdSec Local API's v1 REST interface (its swagger,
// crowdsec's pkg/models/localapi_swagger.yaml): the bouncer's decision
// stream with an API key, and a machine's login and alerts with a JWT. It
// is safe for concurrent use. Build one with NewClient.
//
// It is plain net/http and encoding/json rather than CrowdSec's Go
// client (docs/crowdsec.md says why).
type Client struct {
	base *url.URL
	o    ClientOptions
	hc   *http.Client

	mu     sync.Mutex
	token  string
	expire time.Time
}

// NewClient checks o and returns a client. It does not contact the Local
// API.
func NewClient(o ClientOptions) (*Client, error) {
	u, err := url.Parse(o.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("crowdsec: Local API URL %q: want http(s)://HOST:PORT", redact(o.URL))
	}
	if u.User != nil {
		return nil, fmt.Errorf("crowdsec: Local API URL %s: carries a user or password; give the bouncer's API key or the machine's password instead", u.Redacted())
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawQuery, u.Fragment = "", ""
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Transport == nil {
		o.Transport = http.DefaultTransport.(*http.Transport).Clone()
	}
	if o.UserAgent == "" {
		o.UserAgent = "sluice/dev"
	}
	if !strings.Contains(o.UserAgent, "/") {
		return nil, fmt.Errorf("crowdsec: user agent %q: want NAME/VERSION, e.g. sluice/v0.1.0 (the Local API refuses a login without it)", o.UserAgent)
	}
	return &Client{base: u, o: o, hc: &http.Client{Transport: o.Transport, Timeout: o.Timeout}}, nil
}

// redact keeps a malformed URL's password out of an error.
func redact(s string) string {
	if u, err := url.Parse(s); err == nil {
		return u.Redacted()
	}
	if i := strings.LastIndexByte(s, '@'); i >= 0 {
		return "…" + s[i:]
	}
	return s
}

// URL returns the Local API's base URL.
func (c *Client) URL() string { return c.base.String() }

// Decision is one CrowdSec decision as the Local API's decision stream
// gives it. Duration is what remains of it when the answer was made, a Go
// duration ("3h59m58.4s"); newer Local APIs also give Until (RFC 3339).
type Decision struct {
	ID       int64  `json:"id"`
	Origin   string `json:"origin"`   // crowdsec, cscli, CAPI, lists, ...
	Scenario string `json:"scenario"` // e.g. crowdsecurity/http-probing, or cscli's "manual 'ban' from 'NAME'"
	Scope    string `json:"scope"`    // Ip, Range, AS, Country, Username, ...
	Type     string `json:"type"`     // ban, captcha, throttle, or a custom type
	Value    string `json:"value"`
	Duration string `json:"duration"`
	Until    string `json:"until,omitempty"`
}

// Stream is one answer of the decision stream: decisions that appeared
// and decisions that were deleted or expired since the bouncer's previous
// pull (all active ones, with Startup).
type Stream struct {
	New     []Decision `json:"new"`
	Deleted []Decision `json:"deleted"`
}

// StreamQuery narrows the decision stream.
type StreamQuery struct {
	// Startup asks for every active decision instead of the changes since
	// the bouncer's previous pull (the Local API keeps that per bouncer).
	Startup bool
	// Scopes are the decision scopes asked for; the Local API's default
	// (none given) is Ip and Range only. Scope names are as CrowdSec
	// writes them (Ip, Range, AS, Country, Username); the Local API
	// compares Ip, Range, AS and Country case-insensitively and others
	// exactly.
	Scopes []string
}

// maxBody bounds an answer read: a startup stream of the Central API's
// community blocklist is some megabytes.
const maxBody = 64 << 20

// Stream pulls the decision stream (GET /v1/decisions/stream) with the
// bouncer's API key. Errors: ErrNoCredentials, ErrUnauthorized, a
// *StatusError, or the transport's.
func (c *Client) Stream(ctx context.Context, q StreamQuery) (*Stream, error) {
	if c.o.APIKey == "" {
		return nil, fmt.Errorf("%w: the decision stream needs a bouncer's API key (cscli bouncers add)", ErrNoCredentials)
	}
	v := url.Values{}
	v.Set("startup", fmt.Sprint(q.Startup))
	// Every decision with its own id: by default the Local API sends, per
	// scope, type and value, only the longest decision, and of deleted
	// ones only that one too, so that a bouncer that counts decisions
	// would never see the others go.
	v.Set("dedup", "false")
	if len(q.Scopes) > 0 {
		v.Set("scopes", strings.Join(q.Scopes, ","))
	}
	req, err := c.request(ctx, http.MethodGet, "/v1/decisions/stream", v, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-Api-Key", c.o.APIKey)
	var s Stream
	if err := c.do(req, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// request builds a request to path under the base URL.
func (c *Client) request(ctx context.Context, method, path string, q url.Values, body any) (*http.Request, error) {
	u := *c.base
	u.Path += path
	u.RawQuery = q.Encode()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("crowdsec: encoding %s %s: %w", method, path, err)
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), r)
	if err != nil {
		return nil, fmt.Errorf("crowdsec: %s %s: %w", method, path, err)
	}
	req.Header.Set("User-Agent", c.o.UserAgent)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, nil
}

// do sends req and decodes a 2xx answer's JSON into out.
func (c *Client) do(req *http.Request, out any) error {
	op := req.Method + " " + req.URL.Path
	resp, err := c.hc.Do(req)
	if err != nil {
		// The error names the URL, which carries no credential (the
		// key is a header, and NewClient refused a URL with a user).
		return fmt.Errorf("crowdsec: %s: %w", op, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return fmt.Errorf("crowdsec: %s: reading the answer: %w", op, err)
	}
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		return fmt.Errorf("%w (%s: status %d: %s)", ErrUnauthorized, op, resp.StatusCode, snippet(body))
	}
	if resp.StatusCode/100 != 2 {
		return &StatusError{Op: op, Status: resp.StatusCode, Body: snippet(body)}
	}
	if len(body) > maxBody {
		return fmt.Errorf("crowdsec: %s: the answer is over %d MiB", op, maxBody>>20)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("crowdsec: %s: the answer is not the JSON expected: %w", op, err)
	}
	return nil
}

// snippet is the start of an error answer, printable, for an error message.
func snippet(b []byte) string {
	const n = 200
	s := strings.TrimSpace(string(b))
	if len(s) > n {
		s = s[:n] + "…"
	}
	return strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return ' '
	}, s)
}

// login gets a JWT for the machine (POST /v1/watchers/login) unless the one
// held is valid for another minute.
func (c *Client) login(ctx context.Context, force bool) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !force && c.token != "" && time.Until(c.expire) > time.Minute {
		return c.token, nil
	}
	if c.o.MachineID == "" || c.o.Password == "" {
		return "", fmt.Errorf("%w: pushing alerts needs a machine id and password (cscli machines add)", ErrNoCredentials)
	}
	scenarios := c.o.Scenarios
	if scenarios == nil {
		scenarios = []string{}
	}
	req, err := c.request(ctx, http.MethodPost, "/v1/watchers/login", nil,
		map[string]any{"machine_id": c.o.MachineID, "password": c.o.Password, "scenarios": scenarios})
	if err != nil {
		return "", err
	}
	var a struct {
		Token  string `json:"token"`
		Expire string `json:"expire"`
	}
	if err := c.do(req, &a); err != nil {
		return "", err
	}
	if a.Token == "" {
		return "", fmt.Errorf("crowdsec: POST /v1/watchers/login: no token in the answer")
	}
	c.token = a.Token
	c.expire, err = time.Parse(time.RFC3339, a.Expire)
	if err != nil {
		c.expire = time.Now().Add(10 * time.Minute) // log in again soon rather than fail
	}
	return c.token, nil
}

// PushAlerts sends alerts (POST /v1/alerts) as the machine, logging in
// first when it holds no valid token, and once more if the Local API
// refuses the token (it restarted with another signing secret, or the
// token expired). It returns the ids the Local API gave them. Errors:
// ErrNoCredentials, ErrUnauthorized, a *StatusError (400: an alert the
// Local API's validation refused), or the transport's.
func (c *Client) PushAlerts(ctx context.Context, alerts []Alert) ([]string, error) {
	if len(alerts) == 0 {
		return nil, nil
	}
	for attempt := 0; ; attempt++ {
		token, err := c.login(ctx, attempt > 0)
		if err != nil {
			return nil, err
		}
		req, err := c.request(ctx, http.MethodPost, "/v1/alerts", nil, alerts)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		var ids []string
		err = c.do(req, &ids)
		if errors.Is(err, ErrUnauthorized) && attempt == 0 {
			continue
		}
		return ids, err
	}
}
