package replay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-rl/sluice/detector/enrich"
	"github.com/sluice-rl/sluice/replay/accesslog"
	"github.com/sluice-rl/sluice/rules"
)

// ScenarioRotatingProber is the name RotatingProber labels its requests
// with unless given another.
const ScenarioRotatingProber = "rotating-prober"

// RotatingProber asks for .env files and other secrets from one address at
// a time, moving to an address in a new /24 every Rotate, while its user
// agent, TLS client (JA4) and network owner (AS35994, Akamai's
// 23.32.0.0/11, where its cloud servers are rented) stay the same: the
// rotating .env prober of issue 36. Label: attack, scope {"ja4": JA4,
// "asn": "35994"}, what stays the same.
type RotatingProber struct {
	Name             string        // default "rotating-prober"
	Offset, Duration time.Duration // from the start; default 0 and 10 min
	Rate             float64       // requests per second; default 0.15 (6 a /24)
	Rotate           time.Duration // how long it stays in one /24; default 40 s
	JA4              string        // default JA4Go
	UserAgent        string        // default a Firefox's
}

// rotatingNet: Akamai's (Linode's cloud) 23.32.0.0/11, AS35994 in the
// GeoLite2 test data.
var rotatingNet = asnNet{35994, mustPrefix("23.32.0.0/11"), "Akamai Technologies"}

// envProbes are what a .env prober asks for (sites' secrets and
// configuration), each answered 404.
var envProbes = []string{"/.env", "/api/.env", "/app/.env", "/backend/.env", "/.env.bak", "/.env.production", "/laravel/.env",
	"/admin/.env", "/config/.env", "/.git/config", "/phpinfo.php", "/.aws/credentials", "/core/.env", "/public/.env"}

func (p *RotatingProber) defaults() {
	if p.Rate == 0 {
		p.Rate = 0.15
	}
	if p.Rotate == 0 {
		p.Rotate = 40 * time.Second
	}
	if p.JA4 == "" {
		p.JA4 = JA4Go
	}
	if p.UserAgent == "" {
		p.UserAgent = "Mozilla/5.0 (X11; Linux x86_64; rv:109.0) Gecko/20100101 Firefox/115.0"
	}
}

func (p RotatingProber) check() (string, time.Duration, time.Duration, error) {
	p.defaults()
	if err := checkWindow(ScenarioRotatingProber, &p.Name, p.Offset, &p.Duration); err != nil {
		return "", 0, 0, err
	}
	if err := nonNegative(p.Name, "rate", p.Rate); err != nil {
		return "", 0, 0, err
	}
	if p.Rotate < time.Second {
		return "", 0, 0, fmt.Errorf("replay: scenario %q: rotate %v: want at least 1s", p.Name, p.Rotate)
	}
	if n := p.Duration/p.Rotate + 1; n > 8192 {
		return "", 0, 0, fmt.Errorf("replay: scenario %q: %d networks (duration %v / rotate %v): at most 8192", p.Name, n, p.Duration, p.Rotate)
	}
	if !enrich.ValidJA4(p.JA4) {
		return "", 0, 0, fmt.Errorf("replay: scenario %q: JA4 %q is not a JA4 fingerprint (want e.g. %s)", p.Name, p.JA4, JA4Go)
	}
	return p.Name, p.Offset, p.Duration, nil
}

func (p RotatingProber) setup(rng *rand.Rand, start, end time.Time) *scenario {
	p.defaults()
	s := &scenario{label: Label{Attack: true, Scope: map[string]string{rules.KeyJA4.String(): p.JA4, rules.KeyASN.String(): "35994"}}}
	// One address in a /24 of its own per Rotate.
	var hosts []string
	taken := map[netip.Prefix]bool{}
	for len(hosts) < int(end.Sub(start)/p.Rotate)+1 {
		a := netip.MustParseAddr(addrs(rng, 1, []asnNet{rotatingNet}, map[netip.Addr]bool{})[0])
		n, _ := a.Prefix(24)
		if !taken[n] {
			taken[n] = true
			hosts = append(hosts, a.String())
		}
	}
	if p.Rate > 0 {
		a := newActor(rng, 0, start, end, gapOf(p.Rate), 0.5)
		a.ua, a.ja4 = p.UserAgent, p.JA4
		s.actors = append(s.actors, a)
	}
	s.emit = func(rng *rand.Rand, a *actor) Request {
		host := hosts[min(int(a.next.Sub(start)/p.Rotate), len(hosts)-1)]
		return Request{Entry: accesslog.Entry{Client: host, Method: "GET", Path: envProbes[rng.IntN(len(envProbes))], Status: 404, UserAgent: a.ua, Bytes: 153}, JA4: a.ja4}
	}
	return s
}

// RequestList is a labelled list of requests, an access log (Apache or
// nginx combined or common, or the NASA TSV) whose requests are moved in
// time so that the first comes Offset after the start, keeping their gaps,
// and labelled as one scenario: the attacks (or benign look-alikes) a user
// recorded on their own site, merged into a background in event time.
// Requests past Duration after the first are left out. Label: Attack, and
// Scope when given (for the report; scoring judges every request).
type RequestList struct {
	Name             string // required
	Offset, Duration time.Duration
	// Requests are the list, in any order (it is sorted by time); Read
	// fills it from a log file.
	Requests []Request
	Attack   bool
	Scope    map[string]string
}

// ReadRequestList reads an access log for a RequestList; malformed lines
// are an error naming the file and line.
func ReadRequestList(path string) ([]Request, error) {
	src, err := OpenFile(context.Background(), path)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	var out []Request
	for {
		r, err := src.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		r.Label = Label{}
		out = append(out, r)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no requests", path)
	}
	return out, nil
}

func (l RequestList) check() (string, time.Duration, time.Duration, error) {
	if l.Name == "" {
		return "", 0, 0, errors.New("replay: a request list needs a name")
	}
	if err := checkWindow(l.Name, &l.Name, l.Offset, &l.Duration); err != nil {
		return "", 0, 0, err
	}
	if len(l.Requests) == 0 {
		return "", 0, 0, fmt.Errorf("replay: scenario %q: no requests", l.Name)
	}
	return l.Name, l.Offset, l.Duration, nil
}

func (l RequestList) setup(_ *rand.Rand, start, end time.Time) *scenario {
	reqs := slices.Clone(l.Requests)
	slices.SortStableFunc(reqs, func(a, b Request) int { return a.Time.Compare(b.Time) })
	first := reqs[0].Time
	s := &scenario{label: Label{Attack: l.Attack, Scope: l.Scope}}
	byActor := map[*actor]Request{}
	for i, r := range reqs {
		at := start.Add(r.Time.Sub(first))
		if !at.Before(end) {
			break
		}
		// One actor per request: it fires once, at its time.
		a := &actor{next: at, end: at.Add(time.Nanosecond), gap: time.Hour, id: i}
		byActor[a] = r
		s.actors = append(s.actors, a)
	}
	s.emit = func(_ *rand.Rand, a *actor) Request {
		r := byActor[a]
		r.Line = 0
		return r
	}
	return s
}

// EvalScenario is a scenario Eval can place in its slots besides the
// built-in ones (EvalScenarios): a name and how to make it at an offset for
// a duration (the eval's slot length when Duration is 0).
type EvalScenario struct {
	Name     string
	Duration time.Duration
	At       func(offset, duration time.Duration) Injection
}

// scenarioSpec is one entry of a scenario file.
type scenarioSpec struct {
	Name     string        `yaml:"name"`
	Kind     string        `yaml:"kind"`
	Duration time.Duration `yaml:"duration"`
	// kind requests
	File   string            `yaml:"file"`
	Attack *bool             `yaml:"attack"`
	Scope  map[string]string `yaml:"scope"`
	// generators' parameters
	IPs       int           `yaml:"ips"`
	Users     int           `yaml:"users"`
	Pages     int           `yaml:"pages"`
	Rate      float64       `yaml:"rate"`
	Interval  time.Duration `yaml:"interval"`
	Rotate    time.Duration `yaml:"rotate"`
	Ramp      time.Duration `yaml:"ramp"`
	Method    string        `yaml:"method"`
	Path      string        `yaml:"path"`
	JA4       string        `yaml:"ja4"`
	UserAgent string        `yaml:"user_agent"`
}

// scenarioKinds are the kinds a scenario file names and the parameters each
// takes (yaml names), beside name, kind and duration.
var scenarioKinds = map[string][]string{
	"botnet":              {"ips", "interval", "method", "path", "ja4"},
	"credential-stuffing": {"ips", "rate", "method", "path"},
	"uri-scan":            {"ips", "rate"},
	"ua-flood":            {"rate"},
	"scraper":             {"rate", "pages"},
	"cgnat":               {"users", "ips", "interval"},
	"flash-crowd":         {"users", "ramp", "interval", "path"},
	"rotating-prober":     {"rate", "rotate", "ja4", "user_agent"},
	"requests":            {"file", "attack", "scope"},
}

// scenarioFile is a scenario file's top level.
type scenarioFile struct {
	Scenarios []scenarioSpec `yaml:"scenarios"`
}

// LoadScenarioFile reads a scenario file (YAML, strict: an unknown field is
// an error) for Eval: a list of scenarios, each a generator with its
// parameters (kind botnet, credential-stuffing, uri-scan, ua-flood, scraper,
// cgnat, flash-crowd or rotating-prober) or a labelled request list (kind
// requests: an access log, relative to the file, with attack true or false
// and an optional scope), under a name of its own. Errors name the file,
// the scenario and the fix.
//
//	scenarios:
//	  - name: env-prober
//	    kind: rotating-prober
//	    rate: 0.15
//	    rotate: 40s
//	  - name: my-sqli
//	    kind: requests
//	    file: sqli.log
//	    attack: true
func LoadScenarioFile(path string) ([]EvalScenario, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("scenario file: %w", err)
	}
	var f scenarioFile
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("scenario file %s: %w (fields: name, kind, duration, and each kind's parameters; see docs/eval.md)", path, err)
	}
	if len(f.Scenarios) == 0 {
		return nil, fmt.Errorf("scenario file %s: no scenarios: want a list under scenarios:", path)
	}
	var out []EvalScenario
	names := map[string]bool{}
	for i, sp := range f.Scenarios {
		es, err := sp.build(filepath.Dir(path))
		if err != nil {
			return nil, fmt.Errorf("scenario file %s: scenario %d (%q): %w", path, i+1, sp.Name, err)
		}
		if names[es.Name] || slices.Contains(EvalScenarios, es.Name) {
			return nil, fmt.Errorf("scenario file %s: scenario %d: the name %q is taken: give each scenario its own, other than the built-in %v", path, i+1, es.Name, EvalScenarios)
		}
		names[es.Name] = true
		out = append(out, es)
	}
	return out, nil
}

// build checks a spec and returns its EvalScenario; dir resolves a request
// list's file.
func (sp scenarioSpec) build(dir string) (EvalScenario, error) {
	params, ok := scenarioKinds[sp.Kind]
	if !ok {
		return EvalScenario{}, fmt.Errorf("kind %q: want one of %v", sp.Kind, slices.Sorted(func(yield func(string) bool) {
			for k := range scenarioKinds {
				if !yield(k) {
					return
				}
			}
		}))
	}
	if sp.Name == "" || strings.ContainsAny(sp.Name, ", \t") {
		return EvalScenario{}, errors.New("a name, without commas or spaces, is required")
	}
	if sp.Duration < 0 {
		return EvalScenario{}, fmt.Errorf("duration %v: want 0 (the eval's) or more", sp.Duration)
	}
	// Every parameter set must be one of the kind's.
	v, t := reflect.ValueOf(sp), reflect.TypeOf(sp)
	for i := range t.NumField() {
		tag := t.Field(i).Tag.Get("yaml")
		if tag == "name" || tag == "kind" || tag == "duration" || v.Field(i).IsZero() {
			continue
		}
		if !slices.Contains(params, tag) {
			return EvalScenario{}, fmt.Errorf("%s is not a parameter of kind %s (it takes %v)", tag, sp.Kind, params)
		}
	}
	es := EvalScenario{Name: sp.Name, Duration: sp.Duration}
	var mk func(off, dur time.Duration) Injection
	switch sp.Kind {
	case "botnet":
		mk = func(off, dur time.Duration) Injection {
			return Botnet{Name: sp.Name, Offset: off, Duration: dur, IPs: sp.IPs, Interval: sp.Interval, Method: sp.Method, Path: sp.Path, JA4: sp.JA4}
		}
	case "credential-stuffing":
		mk = func(off, dur time.Duration) Injection {
			return CredentialStuffing{Name: sp.Name, Offset: off, Duration: dur, IPs: sp.IPs, Rate: sp.Rate, Method: sp.Method, Path: sp.Path}
		}
	case "uri-scan":
		mk = func(off, dur time.Duration) Injection {
			return URIScan{Name: sp.Name, Offset: off, Duration: dur, IPs: sp.IPs, Rate: sp.Rate}
		}
	case "ua-flood":
		mk = func(off, dur time.Duration) Injection {
			return UAFlood{Name: sp.Name, Offset: off, Duration: dur, Rate: sp.Rate}
		}
	case "scraper":
		mk = func(off, dur time.Duration) Injection {
			return Scraper{Name: sp.Name, Offset: off, Duration: dur, Rate: sp.Rate, Pages: sp.Pages}
		}
	case "cgnat":
		mk = func(off, dur time.Duration) Injection {
			return CGNAT{Name: sp.Name, Offset: off, Duration: dur, Users: sp.Users, IPs: sp.IPs, Interval: sp.Interval}
		}
	case "flash-crowd":
		mk = func(off, dur time.Duration) Injection {
			return FlashCrowd{Name: sp.Name, Offset: off, Duration: dur, Users: sp.Users, Ramp: sp.Ramp, Interval: sp.Interval, Path: sp.Path}
		}
	case "rotating-prober":
		mk = func(off, dur time.Duration) Injection {
			return RotatingProber{Name: sp.Name, Offset: off, Duration: dur, Rate: sp.Rate, Rotate: sp.Rotate, JA4: sp.JA4, UserAgent: sp.UserAgent}
		}
	case "requests":
		if sp.File == "" || sp.Attack == nil {
			return EvalScenario{}, errors.New("kind requests needs file (an access log) and attack (true or false)")
		}
		for k := range sp.Scope {
			if _, ok := rules.KeyFor(k); !ok {
				return EvalScenario{}, fmt.Errorf("scope key %q is no descriptor key", k)
			}
		}
		file := sp.File
		if !filepath.IsAbs(file) {
			file = filepath.Join(dir, file)
		}
		reqs, err := ReadRequestList(file)
		if err != nil {
			return EvalScenario{}, err
		}
		mk = func(off, dur time.Duration) Injection {
			return RequestList{Name: sp.Name, Offset: off, Duration: dur, Requests: reqs, Attack: *sp.Attack, Scope: sp.Scope}
		}
	}
	// The parameters are checked now, not in the first replay.
	if _, _, _, err := mk(0, time.Minute).check(); err != nil {
		return EvalScenario{}, err
	}
	es.At = mk
	return es, nil
}
