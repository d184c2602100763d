package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/pflag"
)

// How every command that talks to Redis is told where it is and how to
// reach it: one set of flags, each with an environment variable of its own
// (the flag's name upper-cased, dashes as underscores: --redis-username is
// REDIS_USERNAME; --redis is REDIS_ADDR), which a flag on the command line
// overrides.
//
//	--redis ADDR,...            HOST:PORT, or a redis:// or rediss:// URL
//	                            (user, password, database; rediss: TLS)
//	--redis-cluster             a Cluster (also: several addresses)
//	--redis-sentinel MASTER     Sentinels at --redis, following MASTER
//	--redis-username USER       an ACL user (default: the default user)
//	--redis-password PASS       visible in the process list: prefer the next
//	--redis-password-file FILE  read at every new connection, so that a
//	                            rotated secret (a Kubernetes secret mounted
//	                            as a file) is used without a restart
//	--redis-tls                 speak TLS (also: rediss://, or any TLS file)
//	--redis-tls-ca FILE         PEM CA(s) to trust instead of the system's
//	--redis-tls-cert FILE       client certificate (with --redis-tls-key),
//	--redis-tls-key FILE        re-read at every TLS handshake
//	--redis-tls-server-name N   the name the server's certificate must hold
//	                            (default: each node's host)
//	--redis-sentinel-username, --redis-sentinel-password(-file)
//	                            the Sentinels' own credentials (read at start)
//
// The same credentials and TLS apply to every node: a Cluster's nodes
// found after start (go-redis's ClusterOptions hand them to every node
// client) and a Sentinel group's master and replicas. A password never
// appears in a log line, an error (a URL is shown with its password as
// "xxxxx"), /readyz, a metric or --help.

// redisFlags are a command's Redis flags, as parsed.
type redisFlags struct {
	addrs                            []string
	cluster                          bool
	sentinel                         string
	username, password, passwordFile string
	tls                              bool
	tlsCA, tlsCert, tlsKey           string
	tlsServerName                    string
	sentinelUsername                 string
	sentinelPassword, sentinelFile   string
	names                            []string // the flags registered, for their environment variables
}

// redisTopology says which flags a command takes: a single node
// (sluice replay, apply) or also a Cluster and Sentinels.
type redisTopology bool

const (
	singleNode   redisTopology = false
	anyTopology  redisTopology = true
	redisAddrEnv               = "REDIS_ADDR"
)

// add registers the flags on f; addrHelp describes --redis for the
// command. No flag's default comes from the environment: --help shows no
// secret.
func (r *redisFlags) add(f *pflag.FlagSet, addrHelp string, topo redisTopology) {
	f.StringSliceVar(&r.addrs, "redis", nil, addrHelp+" (or "+redisAddrEnv+"); HOST:PORT, or a URL redis://[USER[:PASSWORD]@]HOST:PORT[/DB] (rediss:// for TLS)")
	r.names = []string{"redis"}
	if topo == anyTopology {
		f.BoolVar(&r.cluster, "redis-cluster", false, "treat a single --redis address as a Redis Cluster (or REDIS_CLUSTER)")
		f.StringVar(&r.sentinel, "redis-sentinel", "", "name of the master that the Sentinels at --redis monitor: follow its failovers (or REDIS_SENTINEL)")
		f.StringVar(&r.sentinelUsername, "redis-sentinel-username", "", "ACL user for the Sentinels, when they are protected apart from the data nodes (or REDIS_SENTINEL_USERNAME)")
		f.StringVar(&r.sentinelPassword, "redis-sentinel-password", "", "the Sentinels' password; visible in the process list: prefer REDIS_SENTINEL_PASSWORD or --redis-sentinel-password-file")
		f.StringVar(&r.sentinelFile, "redis-sentinel-password-file", "", "file holding the Sentinels' password, read at start (or REDIS_SENTINEL_PASSWORD_FILE)")
		r.names = append(r.names, "redis-cluster", "redis-sentinel", "redis-sentinel-username", "redis-sentinel-password", "redis-sentinel-password-file")
	}
	r.addAuth(f)
}

// addAuth registers the credential and TLS flags only, for a command that
// names its Redis servers otherwise (sluice pipeline --region NAME=ADDR).
func (r *redisFlags) addAuth(f *pflag.FlagSet) {
	f.StringVar(&r.username, "redis-username", "", "Redis ACL user (or REDIS_USERNAME); default: the default user")
	f.StringVar(&r.password, "redis-password", "", "Redis password; visible in the process list: prefer REDIS_PASSWORD or --redis-password-file")
	f.StringVar(&r.passwordFile, "redis-password-file", "", "file holding the Redis password (a mounted secret), re-read for every new connection, so a rotated password needs no restart (or REDIS_PASSWORD_FILE)")
	f.BoolVar(&r.tls, "redis-tls", false, "speak TLS to Redis (or REDIS_TLS=true; also implied by rediss:// and the TLS files)")
	f.StringVar(&r.tlsCA, "redis-tls-ca", "", "PEM file of the CA(s) that signed Redis's certificate; default: the system's (or REDIS_TLS_CA)")
	f.StringVar(&r.tlsCert, "redis-tls-cert", "", "PEM client certificate for Redis servers that ask for one (tls-auth-clients), with --redis-tls-key; re-read at each handshake (or REDIS_TLS_CERT)")
	f.StringVar(&r.tlsKey, "redis-tls-key", "", "PEM key of --redis-tls-cert (or REDIS_TLS_KEY)")
	f.StringVar(&r.tlsServerName, "redis-tls-server-name", "", "name Redis's certificate must hold; default: the host of each address (or REDIS_TLS_SERVER_NAME)")
	r.names = append(r.names, "redis-username", "redis-password", "redis-password-file", "redis-tls", "redis-tls-ca", "redis-tls-cert", "redis-tls-key", "redis-tls-server-name")
}

// envName is a flag's environment variable.
func envName(flag string) string {
	if flag == "redis" {
		return redisAddrEnv
	}
	return strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// secretFlag reports a flag whose value is a secret: never echoed.
func secretFlag(name string) bool { return strings.HasSuffix(name, "-password") }

// fromEnv sets every Redis flag the command line left unset from its
// environment variable, parsed as the flag parses its value.
func (r *redisFlags) fromEnv(fs *pflag.FlagSet) error {
	for _, name := range r.names {
		fl := fs.Lookup(name)
		if fl == nil || fl.Changed {
			continue
		}
		v := os.Getenv(envName(name))
		if v == "" {
			continue
		}
		if err := fl.Value.Set(v); err != nil {
			if secretFlag(name) {
				return fmt.Errorf("%s (no --%s): %v", envName(name), name, err)
			}
			return fmt.Errorf("%s=%q (no --%s): %v", envName(name), v, name, err)
		}
	}
	return nil
}

// redisTarget is a command's Redis: where it is and how to reach it.
type redisTarget struct {
	// Addrs are HOST:PORT: one node, a Cluster's seeds, or the Sentinels.
	Addrs   []string
	DB      int
	Cluster bool
	Master  string // Sentinel: the master's name
	Auth    redisAuth
	// From names where the addresses came from, for errors: "--redis" or
	// "REDIS_ADDR (no --redis)".
	From string
}

// redisAuth is how to authenticate to Redis and whether to speak TLS. It
// holds secrets: its String and LogValue say what it is without them.
type redisAuth struct {
	Username     string
	Password     string // "" with PasswordFile
	PasswordFile string
	TLS          bool
	tlsConfig    *tls.Config // from the TLS flags; used when TLS
	// The Sentinels' own, for a Sentinel group.
	SentinelUsername, SentinelPassword string
}

// String describes the credentials without the password.
func (a redisAuth) String() string {
	var parts []string
	if a.Username != "" {
		parts = append(parts, "user "+a.Username)
	}
	switch {
	case a.PasswordFile != "":
		parts = append(parts, "password from "+a.PasswordFile)
	case a.Password != "":
		parts = append(parts, "password")
	}
	if a.TLS {
		parts = append(parts, "TLS")
	}
	if len(parts) == 0 {
		return "no credentials, no TLS"
	}
	return strings.Join(parts, ", ")
}

// GoString keeps %#v from printing the password.
func (a redisAuth) GoString() string { return "redisAuth{" + a.String() + "}" }

// resolve applies the environment and reads the flags into a target: URLs
// parsed by go-redis (redis.ParseURL, ParseClusterURL, ParseFailoverURL),
// the TLS files loaded, the password file read once to check it. With no
// address it returns a target without Addrs. Its errors name the flag (or
// variable) and never hold a password.
func (r *redisFlags) resolve(fs *pflag.FlagSet) (*redisTarget, error) {
	if err := r.fromEnv(fs); err != nil {
		return nil, err
	}
	t := &redisTarget{Cluster: r.cluster, Master: r.sentinel, From: "--redis"}
	if fl := fs.Lookup("redis"); fl != nil {
		if !fl.Changed && len(r.addrs) > 0 {
			t.From = redisAddrEnv + " (no --redis)"
		}
		// An address given empty (a template's unset variable, an empty
		// ConfigMap key) is not "no Redis": found by a fresh user, it
		// started serve on an in-process Redis, every pod counting alone.
		v, set := os.LookupEnv(redisAddrEnv)
		switch {
		case fl.Changed && len(r.addrs) == 0:
			return nil, errors.New("--redis is empty: give HOST:PORT or a redis:// URL, or leave --redis out to try sluice on an in-process Redis")
		case !fl.Changed && set && strings.TrimSpace(v) == "":
			return nil, errors.New(redisAddrEnv + " is set but empty (no --redis): give HOST:PORT or a redis:// URL, or unset it to try sluice on an in-process Redis")
		}
	}
	if err := r.resolvePasswords(&t.Auth); err != nil {
		return nil, err
	}
	if r.cluster && r.sentinel != "" {
		return nil, fmt.Errorf("--redis-cluster and --redis-sentinel %s: a Sentinel group is not a Cluster: give one", r.sentinel)
	}
	scheme, err := r.resolveAddrs(t)
	if err != nil {
		return nil, err
	}
	if len(t.Addrs) > 1 && r.sentinel == "" {
		t.Cluster = true
	}
	if t.Cluster && t.DB != 0 {
		return nil, fmt.Errorf("%s: database %d on a Redis Cluster, which has only database 0", t.From, t.DB)
	}
	tlsFiles := r.tlsCA != "" || r.tlsCert != "" || r.tlsKey != "" || r.tlsServerName != ""
	if scheme == "redis" && (r.tls || tlsFiles) {
		return nil, fmt.Errorf("%s is a redis:// URL (plain text), but TLS flags are given: use rediss://, or drop --redis-tls*", t.From)
	}
	t.Auth.TLS = r.tls || tlsFiles || scheme == "rediss"
	if t.Auth.tlsConfig, err = r.tlsConfig(); err != nil {
		return nil, err
	}
	return t, nil
}

// resolvePasswords fills a's credentials from the flags and the Sentinels'
// password file, and checks that the master's password file reads.
func (r *redisFlags) resolvePasswords(a *redisAuth) error {
	a.Username, a.Password, a.PasswordFile = r.username, r.password, r.passwordFile
	a.SentinelUsername, a.SentinelPassword = r.sentinelUsername, r.sentinelPassword
	if r.password != "" && r.passwordFile != "" {
		return errors.New("--redis-password and --redis-password-file (or REDIS_PASSWORD and REDIS_PASSWORD_FILE) both given: give one")
	}
	if r.sentinelPassword != "" && r.sentinelFile != "" {
		return errors.New("--redis-sentinel-password and --redis-sentinel-password-file both given: give one")
	}
	if r.sentinelFile != "" {
		pw, err := readPasswordFile("--redis-sentinel-password-file", r.sentinelFile)
		if err != nil {
			return err
		}
		a.SentinelPassword = pw
	}
	if r.passwordFile != "" {
		if _, err := readPasswordFile("--redis-password-file", r.passwordFile); err != nil {
			return err
		}
	}
	return nil
}

// resolveAddrs reads the --redis addresses (HOST:PORT or URLs, with their
// credentials and database) into t, and returns the URLs' scheme ("" for
// none).
func (r *redisFlags) resolveAddrs(t *redisTarget) (scheme string, err error) {
	a := &t.Auth
	cluster := r.cluster || len(r.addrs) > 1
	urlAuth := false // a URL gave user or password
	for _, s := range r.addrs {
		s = strings.TrimSpace(s)
		if !strings.Contains(s, "://") {
			if err := hostPort(s); err != nil {
				return "", badHostPort(t.From, s, err)
			}
			t.Addrs = append(t.Addrs, s)
			continue
		}
		u, err := parseRedisURL(t.From, s, cluster, r.sentinel != "")
		if err != nil {
			return "", err
		}
		if scheme != "" && scheme != u.scheme {
			return "", fmt.Errorf("%s: the URLs mix redis:// and rediss://: give one scheme", t.From)
		}
		scheme = u.scheme
		switch hasCreds := u.username != "" || u.password != ""; {
		case hasCreds && r.sentinel != "":
			// A Sentinel URL's user and password are the Sentinels'
			// (go-redis's ParseFailoverURL); the master's come from the
			// flags.
			if r.sentinelUsername != "" || r.sentinelPassword != "" || r.sentinelFile != "" {
				return "", fmt.Errorf("%s %s has the Sentinels' credentials, and so do --redis-sentinel-username/--redis-sentinel-password(-file) (or their variables): give them once", t.From, redactURL(s))
			}
			a.SentinelUsername, a.SentinelPassword = u.username, u.password
		case hasCreds:
			if r.username != "" || r.password != "" || r.passwordFile != "" {
				return "", fmt.Errorf("%s %s has credentials, and so do --redis-username/--redis-password/--redis-password-file (or their variables): give them once", t.From, redactURL(s))
			}
			if urlAuth && (u.username != a.Username || u.password != a.Password) {
				return "", fmt.Errorf("%s: the URLs give different credentials: give them once", t.From)
			}
			urlAuth = true
			a.Username, a.Password = u.username, u.password
		}
		t.DB = u.db
		t.Addrs = append(t.Addrs, u.addrs...)
	}
	return scheme, nil
}

// redisURL is what a redis:// URL says, as go-redis parsed it.
type redisURL struct {
	scheme             string
	addrs              []string
	username, password string
	db                 int
}

// urlParams are the query parameters a --redis URL may carry: more
// addresses (a Cluster's or the Sentinels'). Timeouts, pools and retries
// are sluice's to set, as the limiter needs them.
var urlParams = []string{"addr"}

// parseRedisURL parses one --redis URL with go-redis's parser for the
// topology. Its errors show the URL with its password as xxxxx.
func parseRedisURL(from, s string, cluster, sentinel bool) (*redisURL, error) {
	shown := from + " " + redactURL(s) // "--redis redis://u:xxxxx@h:p"
	if strings.HasSuffix(from, "=") {
		shown = from + redactURL(s) // "--home eu=redis://..."
	}
	u, err := url.Parse(s)
	if err != nil {
		// url.Parse's error may quote any part of it, the password too.
		return nil, fmt.Errorf("%s: not a URL: want redis://[USER[:PASSWORD]@]HOST:PORT[/DB] or rediss://...", shown)
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return nil, fmt.Errorf("%s: scheme %q: want redis:// or rediss://", shown, u.Scheme)
	}
	for k := range u.Query() {
		if !slices.Contains(urlParams, k) {
			return nil, fmt.Errorf("%s: query parameter %q: a --redis URL takes only addr= (more addresses); sluice sets timeouts, pools and retries itself", shown, k)
		}
	}
	if u.Port() == "" {
		return nil, fmt.Errorf("%s: no port: give HOST:PORT (6379 is Redis's default)", shown)
	}
	bad := func(err error) error {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("%s: %v", shown, scrubUserinfo(err.Error())) // go-redis's errors quote addr= values
	}
	out := &redisURL{scheme: u.Scheme}
	switch {
	case sentinel:
		o, err := redis.ParseFailoverURL(s)
		if err != nil {
			return nil, bad(err)
		}
		out.addrs, out.username, out.password, out.db = o.SentinelAddrs, o.SentinelUsername, o.SentinelPassword, o.DB
	case cluster || u.Query().Has("addr"):
		o, err := redis.ParseClusterURL(s)
		if err != nil {
			return nil, bad(err)
		}
		out.addrs, out.username, out.password = o.Addrs, o.Username, o.Password
		if p := strings.Trim(u.Path, "/"); p != "" && p != "0" {
			return nil, fmt.Errorf("%s: database %s on a Redis Cluster, which has only database 0", shown, p)
		}
	default:
		o, err := redis.ParseURL(s)
		if err != nil {
			return nil, bad(err)
		}
		out.addrs, out.username, out.password, out.db = []string{o.Addr}, o.Username, o.Password, o.DB
	}
	for _, a := range out.addrs {
		if err := hostPort(a); err != nil {
			return nil, fmt.Errorf("%s: address %s: %v", shown, a, err)
		}
	}
	if out.db < 0 {
		// go-redis reads /-1 as database -1, and SELECTs none: database 0.
		return nil, fmt.Errorf("%s: database %d: a Redis database number is >= 0", shown, out.db)
	}
	return out, nil
}

// userinfo matches what may be a user and password before a host in an
// address or a message quoting one ("u:secret@h:6379"), for scrubUserinfo.
var userinfo = regexp.MustCompile(`[^\s"'()@/]+@`)

// scrubUserinfo replaces each USER[:PASSWORD]@ in msg with xxxxx@: an
// address typed without redis:// (or a parser's error quoting one) must not
// show its password.
func scrubUserinfo(msg string) string { return userinfo.ReplaceAllString(msg, "xxxxx@") }

// badHostPort is the error of a --redis, REDIS_ADDR or --home value that is
// neither HOST:PORT nor a URL (from names it, "--home eu=" ends in =).
func badHostPort(from, s string, err error) error {
	sep := " "
	if strings.HasSuffix(from, "=") {
		sep = ""
	}
	hint := ""
	if strings.Contains(s, "@") {
		hint = "; a user and password need the redis:// or rediss:// scheme"
	}
	return errors.New(scrubUserinfo(fmt.Sprintf("%s%s%q: want HOST:PORT or a redis:// URL (%v)%s", from, sep, s, err, hint)))
}

// redactURL returns a --redis value fit to show: a URL with its password
// as xxxxx and without its query; one that does not parse as its scheme and
// host only; HOST:PORT as it is (an address with USER:PASSWORD@ but no
// scheme as xxxxx@HOST:PORT).
func redactURL(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return scrubUserinfo(s)
	}
	u, err := url.Parse(s)
	if err != nil {
		host := "..."
		if i := strings.LastIndexByte(rest, '@'); i >= 0 {
			host = "xxxxx@" + rest[i+1:]
			host, _, _ = strings.Cut(host, "?")
		}
		return scheme + "://" + host
	}
	if strings.ContainsRune(u.Path, '@') || strings.ContainsRune(u.Opaque, '@') {
		// No host: "redis:///:PASSWORD@HOST:PORT" parses the userinfo as
		// the path.
		rest, _, _ = strings.Cut(rest, "?")
		return scheme + "://" + scrubUserinfo(rest)
	}
	u.RawQuery, u.Fragment = "", ""
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

// readPasswordFile reads a password file: its content without trailing
// line breaks. Its errors name the flag and the file, never the content.
func readPasswordFile(flag, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	pw := strings.TrimRight(string(b), "\r\n")
	if pw == "" {
		return "", fmt.Errorf("%s %s: the file is empty", flag, path)
	}
	return pw, nil
}

// tlsConfig builds the TLS configuration of the TLS flags: TLS 1.2 at
// least, the CA file's certificates as roots (else the system's), the
// client certificate re-read at every handshake that asks for one (so that
// a renewed one is used without a restart), the server name.
func (r *redisFlags) tlsConfig() (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: r.tlsServerName}
	if r.tlsCA != "" {
		pem, err := os.ReadFile(r.tlsCA)
		if err != nil {
			return nil, fmt.Errorf("--redis-tls-ca: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--redis-tls-ca %s: no PEM certificate in it", r.tlsCA)
		}
	}
	switch {
	case (r.tlsCert == "") != (r.tlsKey == ""):
		return nil, errors.New("--redis-tls-cert and --redis-tls-key go together: give both, or neither")
	case r.tlsCert != "":
		cert, key := r.tlsCert, r.tlsKey
		if _, err := tls.LoadX509KeyPair(cert, key); err != nil {
			return nil, fmt.Errorf("--redis-tls-cert %s, --redis-tls-key %s: %w", cert, key, err)
		}
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			kp, err := tls.LoadX509KeyPair(cert, key)
			if err != nil {
				return nil, fmt.Errorf("--redis-tls-cert %s, --redis-tls-key %s: %w", cert, key, err)
			}
			return &kp, nil
		}
	}
	return c, nil
}

// credentials is the CredentialsProviderContext of a password file: the
// file is read for every new connection.
func (a *redisAuth) credentials(ctx context.Context) (string, string, error) {
	pw, err := readPasswordFile("--redis-password-file", a.PasswordFile)
	return a.Username, pw, err
}

// options sets o's credentials and TLS for a data node (single node, home
// region, replay's server).
func (a *redisAuth) options(o *redis.Options) *redis.Options {
	o.Username, o.Password = a.Username, a.Password
	if a.PasswordFile != "" {
		o.CredentialsProviderContext = a.credentials
	}
	if a.TLS {
		o.TLSConfig = a.tlsConfig
	}
	return o
}

// sentinelOptions sets o's credentials and TLS for a Sentinel.
func (a *redisAuth) sentinelOptions(o *redis.Options) *redis.Options {
	o.Username, o.Password = a.SentinelUsername, a.SentinelPassword
	if a.TLS {
		o.TLSConfig = a.tlsConfig
	}
	return o
}

// universal sets o's addresses, topology, credentials and TLS: go-redis
// hands them to every node client (a Cluster's nodes found later, a
// Sentinel group's master and replicas).
func (t *redisTarget) universal(o *redis.UniversalOptions) *redis.UniversalOptions {
	o.Addrs, o.DB, o.IsClusterMode, o.MasterName = t.Addrs, t.DB, t.Cluster, t.Master
	a := &t.Auth
	o.Username, o.Password = a.Username, a.Password
	if a.PasswordFile != "" {
		o.CredentialsProviderContext = a.credentials
	}
	o.SentinelUsername, o.SentinelPassword = a.SentinelUsername, a.SentinelPassword
	if a.TLS {
		o.TLSConfig = a.tlsConfig
	}
	return o
}

// nodeAddr reads one address of a --home or --region entry (flag is
// "--home eu=", for errors): HOST:PORT, or a
// redis:// or rediss:// URL whose user and password (and rediss: TLS)
// replace base's for that address. It returns the address, its database
// and its credentials.
func nodeAddr(flag, s string, base redisAuth) (string, int, redisAuth, error) {
	if !strings.Contains(s, "://") {
		if err := hostPort(s); err != nil {
			return "", 0, base, badHostPort(flag, s, err)
		}
		return s, 0, base, nil
	}
	u, err := parseRedisURL(flag, s, false, false)
	if err != nil {
		return "", 0, base, err
	}
	a := base
	if u.username != "" || u.password != "" {
		a.Username, a.Password, a.PasswordFile = u.username, u.password, ""
	}
	a.TLS = u.scheme == "rediss"
	return u.addrs[0], u.db, a, nil
}

// single refuses a target of several nodes, for the commands that take one
// redis-server.
func (t *redisTarget) single() error {
	if t.Cluster || len(t.Addrs) > 1 {
		return fmt.Errorf("%s: one redis-server (HOST:PORT or a URL), not a Cluster", t.From)
	}
	return nil
}

// describe names a target for the start-up log: the addresses, topology,
// database and credentials, never a password.
func (t *redisTarget) describe() string {
	var s string
	switch {
	case len(t.Addrs) == 0:
		return "in-process"
	case t.Master != "":
		s = fmt.Sprintf("sentinel master %s at %v", t.Master, t.Addrs)
	case t.Cluster:
		s = fmt.Sprintf("cluster %v", t.Addrs)
	default:
		s = fmt.Sprint(t.Addrs)
		if t.DB != 0 {
			s += " db " + strconv.Itoa(t.DB)
		}
	}
	return s + " (" + t.Auth.String() + ")"
}
