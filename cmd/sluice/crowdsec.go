//go:build !nocharts && !sidecar

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluice-rl/sluice/crowdsec"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

// This file is left out of the sidecar's build (-tags nocharts, make
// sidecar), as html.go is: a sidecar needs no CrowdSec client.
// crowdsec_nocharts.go keeps the flags, which fail there.

// crowdsecRegion is one --region NAME=ADDR of sluice crowdsec: its
// address (HOST:PORT), database and credentials (redisconn.go).
type crowdsecRegion struct {
	Name, Addr string
	DB         int
	Auth       redisAuth
}

// crowdsecConfig is sluice crowdsec's: the Local API and its bouncer key,
// the regions' Redis, and the bouncer's options.
type crowdsecConfig struct {
	LAPI    string
	APIKey  string // a secret: never logged
	Regions []crowdsecRegion
	// Cap is the regions' cap on active dynamic rules (sluice serve's
	// --dynamic-cap).
	Cap     int
	Bouncer crowdsec.Options
	// Metrics is the address of /metrics, /healthz and /readyz; "" none.
	Metrics string
	// Registry, when set, receives the metrics (tests read them); nil: a
	// new one.
	Registry *prometheus.Registry
	Logger   *slog.Logger
	// Listening, when set, receives the metrics address once bound.
	Listening func(addr string)
}

func crowdsecCmd() *cobra.Command {
	var (
		c          crowdsecConfig
		keyFile    string
		regions    []string
		typeLimits []string
		defLimit   string
		rf         redisFlags
	)
	cmd := &cobra.Command{
		Use:   "crowdsec --lapi URL --region NAME=HOST:PORT...",
		Short: "Be a CrowdSec bouncer: keep the Local API's decisions as dynamic rules in every region's Redis",
		Long: `Crowdsec follows a CrowdSec Local API's decision stream as a bouncer
(cscli bouncers add NAME gives its API key) and keeps one dynamic rule per
source and decision type in every region's Redis, where the region's sluice
serve applies it within a second (docs/crowdsec.md):

  ban on Ip or Range       client_ip in the network: denied
  ban on AS                asn = the AS number: denied
  captcha, throttle, ...   the same match, limited (--limit TYPE=N/PERIOD,
                           else --default-limit)
  Country, Username, ...   no rule: counted and logged

Each rule expires with its decisions, and deleted decisions delete their rules.
--shadow writes them in shadow mode (sluice rules promote ID enforces one);
--max-rules and the regions' cap bound them; while a region's kill switch is
on (sluice rules kill on) nothing new is written there.

The API key is read from --api-key-file, else $CROWDSEC_API_KEY. While the
Local API is unreachable the rules already written stay until they expire and
nothing new arrives (sluice_crowdsec_stream_age_seconds grows). Metrics are
served on --metrics at /metrics (sluice_crowdsec_*), with /healthz and /readyz
(503 while a region's Redis does not answer PING). SIGTERM or SIGINT stops it;
the rules stay.`,
		Example: `  cscli bouncers add sluice -o raw > /etc/sluice/crowdsec.key
  sluice crowdsec --lapi http://127.0.0.1:8080 --api-key-file /etc/sluice/crowdsec.key \
      --region us-east=10.0.1.5:6379 --region eu-west=10.0.2.5:6379 --limit captcha=10/1m`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if c.LAPI == "" {
				return errors.New("--lapi is required: the CrowdSec Local API's URL, e.g. http://127.0.0.1:8080 (cscli config show --key Config.API.Server.ListenURI)")
			}
			key, err := secret(keyFile, "--api-key-file", "CROWDSEC_API_KEY")
			if err != nil {
				return err
			}
			if key == "" {
				return errors.New("no API key: give the bouncer's key (cscli bouncers add NAME) in --api-key-file FILE or $CROWDSEC_API_KEY")
			}
			c.APIKey = key
			if len(regions) == 0 {
				return errors.New("--region is required: name each region's Redis, e.g. --region eu-west=10.0.2.5:6379")
			}
			rt, err := rf.resolve(cmd.Flags())
			if err != nil {
				return err
			}
			for _, a := range regions {
				name, addr, ok := strings.Cut(a, "=")
				if !ok || !rules.ValidID(name) {
					return fmt.Errorf("--region %q: want NAME=HOST:PORT, NAME of letters, digits, '-', '_' and '.'", name+"="+redactURL(addr))
				}
				addr, db, auth, err := nodeAddr("--region "+name+"=", addr, rt.Auth)
				if err != nil {
					return fmt.Errorf("%w (want NAME=HOST:PORT or NAME=redis://...)", err)
				}
				if slices.ContainsFunc(c.Regions, func(r crowdsecRegion) bool { return r.Name == name }) {
					return fmt.Errorf("--region %s is given twice", name)
				}
				c.Regions = append(c.Regions, crowdsecRegion{Name: name, Addr: addr, DB: db, Auth: auth})
			}
			m := &c.Bouncer.Mapping
			if m.Default, err = crowdsec.ParseLimit(defLimit); err != nil {
				return fmt.Errorf("--default-limit: %w", err)
			}
			for _, tl := range typeLimits {
				typ, l, ok := strings.Cut(tl, "=")
				typ = strings.ToLower(strings.TrimSpace(typ))
				if !ok || typ == "" {
					return fmt.Errorf("--limit %q: want TYPE=N/PERIOD, e.g. captcha=10/1m", tl)
				}
				if typ == crowdsec.TypeBan {
					return fmt.Errorf("--limit %q: a ban denies; give a limit to other types (captcha, throttle, ...)", tl)
				}
				lim, err := crowdsec.ParseLimit(l)
				if err != nil {
					return fmt.Errorf("--limit %q: %w", tl, err)
				}
				if m.Limits == nil {
					m.Limits = map[string]crowdsec.Limit{}
				}
				if _, dup := m.Limits[typ]; dup {
					return fmt.Errorf("--limit: type %s is given twice", typ)
				}
				m.Limits[typ] = lim
			}
			for flag, d := range map[string]time.Duration{"--interval": c.Bouncer.Interval, "--full-pull": c.Bouncer.FullPull, "--retry-max": c.Bouncer.RetryMax, "--resync": c.Bouncer.Resync} {
				if d <= 0 {
					return fmt.Errorf("%s %v: want a positive duration", flag, d)
				}
			}
			if c.Bouncer.MaxRules < 1 {
				return fmt.Errorf("--max-rules %d: want at least 1", c.Bouncer.MaxRules)
			}
			if c.Cap < 1 {
				return fmt.Errorf("--cap %d: want at least 1 (the regions' sluice serve --dynamic-cap)", c.Cap)
			}
			if p := m.IPv6Prefix; p < 1 || p > 128 {
				return fmt.Errorf("--ipv6-prefix %d: want 1 to 128, as sluice serve keys IPv6 clients (64)", p)
			}
			c.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			return runCrowdSec(cmd.Context(), c)
		},
	}
	f := cmd.Flags()
	f.StringVar(&c.LAPI, "lapi", "", "the CrowdSec Local API's URL, http(s)://HOST:PORT (required)")
	f.StringVar(&keyFile, "api-key-file", "", "file holding the bouncer's API key (cscli bouncers add NAME); default $CROWDSEC_API_KEY")
	f.StringArrayVar(&regions, "region", nil, "a region's Redis, NAME=HOST:PORT (or NAME=redis://USER:PASSWORD@HOST:PORT, rediss:// for TLS, with credentials of its own); repeat for each region (required)")
	rf.addAuth(f) // the regions' Redis credentials and TLS
	f.DurationVar(&c.Bouncer.Interval, "interval", 10*time.Second, "how often the decision stream is pulled (CrowdSec bouncers' update_frequency)")
	f.DurationVar(&c.Bouncer.FullPull, "full-pull", 5*time.Minute, "how often a pull asks for every active decision instead of the changes (a Local API before v1.5 can leave a decision committed during a pull out of every later answer of changes)")
	f.DurationVar(&c.Bouncer.RetryMax, "retry-max", 30*time.Second, "longest wait between retries while the Local API or a region's Redis fails")
	f.DurationVar(&c.Bouncer.Resync, "resync", 30*time.Second, "how often each region is checked against the decisions without a change (rules a restarted Redis lost, renewals, the kill switch turned off)")
	f.StringSliceVar(&c.Bouncer.Scopes, "scopes", crowdsec.DefaultScopes, "decision scopes asked of the stream; those sluice cannot enforce (Country, Username) are counted and logged, those not asked for never arrive")
	f.StringArrayVar(&typeLimits, "limit", nil, "TYPE=N/PERIOD: the limit sources of decisions of TYPE get (captcha=10/1m); repeat per type")
	f.StringVar(&defLimit, "default-limit", crowdsec.DefaultLimit.String(), "N/PERIOD: the limit of decision types other than ban without a --limit")
	f.BoolVar(&c.Bouncer.Mapping.Shadow, "shadow", false, "write the rules in shadow mode: they count would-be denials and deny nothing until promoted (sluice rules promote ID)")
	f.IntVar(&c.Bouncer.MaxRules, "max-rules", 500, "most rules the bouncer keeps in each region (bans first, then by arrival); more decisions wait, counted")
	f.IntVar(&c.Cap, "cap", store.DefaultDynamicCap, "the regions' cap on active dynamic rules of every origin, as their sluice serve --dynamic-cap")
	f.IntVar(&c.Bouncer.Mapping.IPv6Prefix, "ipv6-prefix", 64, "the prefix length sluice serve keys IPv6 clients by: an IPv6 decision is widened to it")
	f.StringVar(&c.Metrics, "metrics", "127.0.0.1:9468", "address for /metrics, /healthz and /readyz (empty: none)")
	return cmd
}

// secret reads a credential from file (flag names it), trimmed of
// surrounding space, else from the environment variable env; "" when
// neither gives one. Errors name the file, never its content.
func secret(file, flag, env string) (string, error) {
	if file == "" {
		return strings.TrimSpace(os.Getenv(env)), nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("%s %s: the file is empty", flag, file)
	}
	return s, nil
}

// runCrowdSec runs the bouncer until ctx ends.
func runCrowdSec(ctx context.Context, c crowdsecConfig) error {
	log := c.Logger
	if log == nil {
		log = slog.Default()
	}
	reg := c.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	cl, err := crowdsec.NewClient(crowdsec.ClientOptions{URL: c.LAPI, APIKey: c.APIKey, UserAgent: "sluice-bouncer/" + readBuildInfo().Version})
	if err != nil {
		return fmt.Errorf("--lapi: %w", err)
	}
	clients := map[string]redis.UniversalClient{}
	o := c.Bouncer
	for _, r := range c.Regions {
		rdb := redis.NewClient(r.Auth.options(&redis.Options{Addr: r.Addr, DB: r.DB, DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second}))
		defer rdb.Close()
		clients[r.Name] = rdb
		o.Regions = append(o.Regions, crowdsec.Region{Name: r.Name, Store: store.NewStore(rdb, store.DynamicCap(c.Cap))})
	}
	o.Source, o.Logger, o.Registerer = cl, log, reg
	b, err := crowdsec.NewBouncer(o)
	if err != nil {
		return err
	}
	addr, serve, stop, err := serveMetrics(reg, c.Metrics, pingAll(clients))
	if err != nil {
		return err
	}
	if c.Listening != nil {
		c.Listening(addr)
	}
	names := make([]string, len(c.Regions))
	for i, r := range c.Regions {
		names[i] = r.Name + "=" + r.Addr
	}
	log.Info("CrowdSec bouncer running", "lapi", cl.URL(), "regions", names, "interval", o.Interval, "scopes", strings.Join(o.Scopes, ","),
		"shadow", o.Mapping.Shadow, "max_rules", o.MaxRules, "metrics", addr)
	g := newRunGroup(ctx)
	g.addStop("metrics server", serve, stop)
	g.add("bouncer", b.Run)
	err = g.wait()
	b.Close()
	log.Info("CrowdSec bouncer stopped: the rules it wrote stay until they expire")
	return err
}

// crowdsecAlertFlags are sluice pipeline's and sluice replay's flags for
// pushing the detector's rules to a CrowdSec Local API as alerts.
type crowdsecAlertFlags struct {
	url, machine, passwordFile string
	remediation                bool
}

func (a *crowdsecAlertFlags) add(f *pflag.FlagSet) {
	f.StringVar(&a.url, "crowdsec-alerts", "", "also push every rule the detector emits to this CrowdSec Local API as an alert (scenario sluice/<signal>), http(s)://HOST:PORT (docs/crowdsec.md)")
	f.StringVar(&a.machine, "crowdsec-machine", "sluice", "the machine id alerts are pushed as (cscli machines add NAME --password ...)")
	f.StringVar(&a.passwordFile, "crowdsec-password-file", "", "file holding the machine's password; default $CROWDSEC_PASSWORD")
	f.BoolVar(&a.remediation, "crowdsec-remediation", false, "let the Local API's profiles turn the alerts into decisions (for CrowdSec's other bouncers); by default they are alerts only")
}

// start, when --crowdsec-alerts is given, starts an alert pusher and makes
// *w also write to it (be it, when nil); stop pushes what is queued (up to 30 s, logged when
// some is left) and stops it. Without the flag, stop does nothing.
func (a *crowdsecAlertFlags) start(w *stage.Writer, log *slog.Logger, reg prometheus.Registerer) (stop func(), err error) {
	if a.url == "" {
		return func() {}, nil
	}
	pw, err := secret(a.passwordFile, "--crowdsec-password-file", "CROWDSEC_PASSWORD")
	if err != nil {
		return nil, err
	}
	if pw == "" {
		return nil, errors.New("--crowdsec-alerts: no password: give the machine's (cscli machines add NAME --password ...) in --crowdsec-password-file FILE or $CROWDSEC_PASSWORD")
	}
	v := readBuildInfo().Version
	cl, err := crowdsec.NewClient(crowdsec.ClientOptions{URL: a.url, MachineID: a.machine, Password: pw, UserAgent: "sluice/" + v})
	if err != nil {
		return nil, fmt.Errorf("--crowdsec-alerts: %w", err)
	}
	p, err := crowdsec.NewAlertPusher(crowdsec.AlertOptions{Client: cl, Remediation: a.remediation, Version: v, Logger: log, Registerer: reg})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(ctx) }()
	if *w == nil {
		*w = p
	} else {
		*w = p.Wrap(*w)
	}
	log.Info("pushing the detector's rules to the CrowdSec Local API as alerts", "lapi", cl.URL(), "machine", a.machine)
	return func() {
		fctx, fcancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := p.Flush(fctx); err != nil {
			log.Warn("alerts left unpushed at exit", "err", err)
		}
		fcancel()
		cancel()
		<-done
		s := p.Stats()
		log.Info("CrowdSec alerts", "sent", s.Sent, "dropped", s.Dropped, "refused", s.Refused)
	}, nil
}
