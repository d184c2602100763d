package replay

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strconv"
	"time"

	"github.com/sluice-rl/sluice/detector/enrich"
	"github.com/sluice-rl/sluice/replay/accesslog"
	"github.com/sluice-rl/sluice/rules"
)

// The scenario names Inject labels requests with, unless a scenario is
// given a Name of its own.
const (
	ScenarioBotnet             = "botnet"
	ScenarioCredentialStuffing = "credential-stuffing"
	ScenarioURIScan            = "uri-scan"
	ScenarioUAFlood            = "ua-flood"
	ScenarioScraper            = "scraper"
	ScenarioCGNAT              = "cgnat"
	ScenarioFlashCrowd         = "flash-crowd"
)

// DefaultDuration is how long an injected scenario lasts unless told.
const DefaultDuration = 10 * time.Minute

// DefaultInjections returns the seven scenarios with their defaults, one
// after another from 10 minutes into the background (so that a detector has
// a baseline first) and 15 minutes apart: the botnet at 10 min, credential
// stuffing at 25, the URI scan at 40, the UA-switching flood at 55, the
// scraper at 70, the carrier-grade NAT at 85 and the flash crowd at 100,
// each for 10 minutes.
func DefaultInjections() []Injection {
	at := func(i int) time.Duration { return 10*time.Minute + time.Duration(i)*15*time.Minute }
	return []Injection{
		Botnet{Offset: at(0)},
		CredentialStuffing{Offset: at(1)},
		URIScan{Offset: at(2)},
		UAFlood{Offset: at(3)},
		Scraper{Offset: at(4)},
		CGNAT{Offset: at(5)},
		FlashCrowd{Offset: at(6)},
	}
}

// checkWindow defaults and checks the fields every scenario has.
func checkWindow(kind string, name *string, offset time.Duration, duration *time.Duration) error {
	if *name == "" {
		*name = kind
	}
	if offset < 0 || *duration < 0 {
		return fmt.Errorf("replay: scenario %q: offset %v and duration %v must not be negative", *name, offset, *duration)
	}
	if *duration == 0 {
		*duration = DefaultDuration
	}
	return nil
}

func nonNegative(name string, what string, v float64) error {
	if v < 0 || v != v {
		return fmt.Errorf("replay: scenario %q: %s %v must not be negative", name, what, v)
	}
	return nil
}

func gapOf(rate float64) time.Duration { return time.Duration(float64(time.Second) / rate) }

func ipScope(ip string) map[string]string {
	return map[string]string{rules.KeyClientIP.String(): ip}
}

// Botnet is a residential botnet's low-and-slow login attack: many
// addresses across many ASNs, each under any per-IP limit, sharing one TLS
// fingerprint while their user agents vary. Label: attack, scope {"ja4":
// JA4}.
type Botnet struct {
	Name             string        // default "botnet"
	Offset, Duration time.Duration // from the start; default 0 and 10 min
	// IPs is the number of distinct addresses, spread evenly over the 24
	// eyeball ASNs that docs/eval.md lists. Default 50 000.
	IPs int
	// Interval is each bot's mean gap between requests, each gap within
	// ±25% of it, so each address sends about one request per Interval.
	// Default 1 min.
	Interval time.Duration
	Method   string // default POST
	Path     string // default /login
	JA4      string // default JA4IcedID
}

func (b *Botnet) defaults() {
	if b.IPs == 0 {
		b.IPs = 50_000
	}
	if b.Interval == 0 {
		b.Interval = time.Minute
	}
	if b.Method == "" {
		b.Method = "POST"
	}
	if b.Path == "" {
		b.Path = "/login"
	}
	if b.JA4 == "" {
		b.JA4 = JA4IcedID
	}
}

func (b Botnet) check() (string, time.Duration, time.Duration, error) {
	b.defaults()
	if err := checkWindow(ScenarioBotnet, &b.Name, b.Offset, &b.Duration); err != nil {
		return "", 0, 0, err
	}
	if b.IPs < 0 || b.Interval < 0 {
		return "", 0, 0, fmt.Errorf("replay: scenario %q: IPs %d and interval %v must not be negative", b.Name, b.IPs, b.Interval)
	}
	if b.IPs > 1_000_000 {
		return "", 0, 0, fmt.Errorf("replay: scenario %q: %d IPs; at most 1 000 000", b.Name, b.IPs)
	}
	if !enrich.ValidJA4(b.JA4) {
		return "", 0, 0, fmt.Errorf("replay: scenario %q: JA4 %q is not a JA4 fingerprint (want e.g. %s)", b.Name, b.JA4, JA4IcedID)
	}
	return b.Name, b.Offset, b.Duration, nil
}

func (b Botnet) setup(rng *rand.Rand, start, end time.Time) *scenario {
	b.defaults()
	s := &scenario{label: Label{Attack: true, Scope: map[string]string{rules.KeyJA4.String(): b.JA4}}}
	ips := addrs(rng, b.IPs, residentialNets, map[netip.Addr]bool{})
	for i, ip := range ips {
		a := newActor(rng, i, start, end, b.Interval, 0.25)
		a.client = ip
		a.ua, _ = browserUA(rng)
		s.actors = append(s.actors, a)
	}
	s.emit = func(rng *rand.Rand, a *actor) Request {
		return Request{Entry: accesslog.Entry{Client: a.client, Method: b.Method, Path: b.Path, Status: loginStatus(rng, 95, 0), UserAgent: a.ua, Bytes: 512}, JA4: b.JA4}
	}
	return s
}

// loginStatus is the status of a login attempt: 401 for failPct percent,
// 403 (locked out, blocked) for lockPct, 200 otherwise.
func loginStatus(rng *rand.Rand, failPct, lockPct int) int {
	switch p := rng.IntN(100); {
	case p < failPct:
		return 401
	case p < failPct+lockPct:
		return 403
	default:
		return 200
	}
}

// CredentialStuffing is a login attack from a few hundred servers in one
// data-centre ASN (AS7381), at a high total rate, mostly failing (401) or
// locked out (403). Its user agents are a handful of browser strings, so
// their JA4 comes from the Enricher. Label: attack, scope {"asn": "7381"}.
type CredentialStuffing struct {
	Name             string        // default "credential-stuffing"
	Offset, Duration time.Duration // from the start; default 0 and 10 min
	IPs              int           // distinct addresses in the network; default 300, at most the network's hosts (4 094 for AS7381's /20)
	// Network is where the addresses come from: StuffingAS7381 (the
	// default, a data-centre /20) or StuffingAS29518 (an ISP's hosting
	// /18), each mapped to its ASN by the shared data. The label scope is
	// the network's ASN.
	Network StuffingNetwork
	Rate    float64 // requests per second, all addresses together; default 50
	Method  string  // default POST
	Path    string  // default /login
}

// StuffingNetwork names the network a CredentialStuffing draws from.
type StuffingNetwork int

const (
	StuffingAS7381  StuffingNetwork = iota // SunGard Availability Services, 216.83.176.0/20 (GeoLite2 test data)
	StuffingAS29518                        // Bredband2 AB, 89.160.64.0/18 (GeoLite2 test data)
)

func (n StuffingNetwork) net() (asnNet, bool) {
	switch n {
	case StuffingAS7381:
		return stuffingNet, true
	case StuffingAS29518:
		return stuffingNetB, true
	}
	return asnNet{}, false
}

func (c *CredentialStuffing) defaults() {
	if c.IPs == 0 {
		c.IPs = 300
	}
	if c.Rate == 0 {
		c.Rate = 50
	}
	if c.Method == "" {
		c.Method = "POST"
	}
	if c.Path == "" {
		c.Path = "/login"
	}
}

func (c CredentialStuffing) check() (string, time.Duration, time.Duration, error) {
	c.defaults()
	if err := checkWindow(ScenarioCredentialStuffing, &c.Name, c.Offset, &c.Duration); err != nil {
		return "", 0, 0, err
	}
	if err := nonNegative(c.Name, "rate", c.Rate); err != nil {
		return "", 0, 0, err
	}
	n, ok := c.Network.net()
	if !ok {
		return "", 0, 0, fmt.Errorf("replay: scenario %q: network %d; want StuffingAS7381 or StuffingAS29518", c.Name, c.Network)
	}
	if c.IPs < 0 || c.IPs > n.capacity() {
		return "", 0, 0, fmt.Errorf("replay: scenario %q: %d IPs; want 1 to %d (AS%d's %v)", c.Name, c.IPs, n.capacity(), n.asn, n.prefix)
	}
	return c.Name, c.Offset, c.Duration, nil
}

// stuffingUAs are the few user agents a credential-stuffing tool cycles.
var stuffingUAs = []string{
	"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Safari/537.36",
	"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/119.0.0.0 Safari/537.36",
	"Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Safari/537.36",
}

func (c CredentialStuffing) setup(rng *rand.Rand, start, end time.Time) *scenario {
	c.defaults()
	n, _ := c.Network.net()
	s := &scenario{label: Label{Attack: true, Scope: map[string]string{rules.KeyASN.String(): strconv.FormatUint(uint64(n.asn), 10)}}}
	ips := addrs(rng, c.IPs, []asnNet{n}, map[netip.Addr]bool{})
	gap := gapOf(c.Rate / float64(max(c.IPs, 1)))
	if c.Rate > 0 {
		for i, ip := range ips {
			a := newActor(rng, i, start, end, gap, 0)
			a.client, a.ua = ip, stuffingUAs[rng.IntN(len(stuffingUAs))]
			s.actors = append(s.actors, a)
		}
	}
	s.emit = func(rng *rand.Rand, a *actor) Request {
		return Request{Entry: accesslog.Entry{Client: a.client, Method: c.Method, Path: c.Path, Status: loginStatus(rng, 80, 15), UserAgent: a.ua, Bytes: 280}}
	}
	return s
}

// URIScan is a content-discovery scan (gobuster-like) from one or a few
// addresses in AS174: random and well-known paths, mostly 404. Its JA4 is
// Go's (JA4Go). Label: attack, scope {"client_ip": its address}.
type URIScan struct {
	Name             string        // default "uri-scan"
	Offset, Duration time.Duration // from the start; default 0 and 10 min
	IPs              int           // scanning addresses; default 1
	Rate             float64       // requests per second per address; default 5
}

func (u *URIScan) defaults() {
	if u.IPs == 0 {
		u.IPs = 1
	}
	if u.Rate == 0 {
		u.Rate = 5
	}
}

func (u URIScan) check() (string, time.Duration, time.Duration, error) {
	u.defaults()
	if err := checkWindow(ScenarioURIScan, &u.Name, u.Offset, &u.Duration); err != nil {
		return "", 0, 0, err
	}
	if err := nonNegative(u.Name, "rate", u.Rate); err != nil {
		return "", 0, 0, err
	}
	if u.IPs < 0 || u.IPs > 10_000 {
		return "", 0, 0, fmt.Errorf("replay: scenario %q: %d IPs; want 1 to 10 000", u.Name, u.IPs)
	}
	return u.Name, u.Offset, u.Duration, nil
}

// scanProbes are paths scanners try on every host.
var scanProbes = []string{
	"/.env", "/.git/config", "/.git/HEAD", "/wp-admin/", "/wp-config.php.bak", "/phpmyadmin/", "/admin.php", "/administrator/",
	"/config.php.bak", "/server-status", "/actuator/health", "/actuator/env", "/vendor/phpunit/phpunit/src/Util/PHP/eval-stdin.php",
	"/cgi-bin/luci", "/backup.zip", "/db.sql", "/.aws/credentials", "/api/v1/swagger.json", "/.DS_Store", "/console",
}

var scanWords = []string{"admin", "backup", "old", "test", "dev", "api", "private", "tmp", "upload", "files", "conf", "data", "login", "panel", "secret"}
var scanExts = []string{"", ".php", ".bak", ".zip", ".txt", ".asp", ".jsp", "/"}

func (u URIScan) setup(rng *rand.Rand, start, end time.Time) *scenario {
	u.defaults()
	s := &scenario{label: Label{Attack: true}}
	if u.Rate > 0 {
		for i, ip := range addrs(rng, u.IPs, []asnNet{scanNet}, map[netip.Addr]bool{}) {
			a := newActor(rng, i, start, end, gapOf(u.Rate), 0)
			a.client, a.ua, a.ja4, a.scope = ip, "gobuster/3.6", JA4Go, ipScope(ip)
			s.actors = append(s.actors, a)
		}
	}
	s.emit = func(rng *rand.Rand, a *actor) Request {
		var path string
		switch p := rng.IntN(10); {
		case p < 3:
			path = scanProbes[rng.IntN(len(scanProbes))]
		case p < 6:
			path = "/" + scanWords[rng.IntN(len(scanWords))] + strconv.Itoa(rng.IntN(100)) + scanExts[rng.IntN(len(scanExts))]
		default:
			path = fmt.Sprintf("/%08x%s", rng.Uint32(), scanExts[rng.IntN(len(scanExts))])
		}
		status := 404
		switch p := rng.IntN(100); {
		case p < 4:
			status = 403
		case p < 6:
			status = 200
		}
		return Request{Entry: accesslog.Entry{Client: a.client, Method: "GET", Path: path, Status: status, UserAgent: a.ua, Bytes: 196}, JA4: a.ja4}
	}
	return s
}

// UAFlood is one address (Cloudflare WARP egress, AS13335) at a high rate
// that sends a different browser user agent with almost every request, from
// one TLS stack (JA4Python). Label: attack, scope {"client_ip": its address}.
type UAFlood struct {
	Name             string        // default "ua-flood"
	Offset, Duration time.Duration // from the start; default 0 and 10 min
	Rate             float64       // requests per second; default 20
	// Switch is the probability that a request draws a new user agent
	// (there are millions). Default 0.95.
	Switch float64
}

func (u *UAFlood) defaults() {
	if u.Rate == 0 {
		u.Rate = 20
	}
	if u.Switch == 0 {
		u.Switch = 0.95
	}
}

func (u UAFlood) check() (string, time.Duration, time.Duration, error) {
	u.defaults()
	if err := checkWindow(ScenarioUAFlood, &u.Name, u.Offset, &u.Duration); err != nil {
		return "", 0, 0, err
	}
	if err := nonNegative(u.Name, "rate", u.Rate); err != nil {
		return "", 0, 0, err
	}
	if !(u.Switch > 0 && u.Switch <= 1) {
		return "", 0, 0, fmt.Errorf("replay: scenario %q: switch probability %v; want (0, 1]", u.Name, u.Switch)
	}
	return u.Name, u.Offset, u.Duration, nil
}

func (u UAFlood) setup(rng *rand.Rand, start, end time.Time) *scenario {
	u.defaults()
	ip := addrs(rng, 1, []asnNet{uaFloodNet}, map[netip.Addr]bool{})[0]
	s := &scenario{label: Label{Attack: true, Scope: ipScope(ip)}}
	if u.Rate > 0 {
		a := newActor(rng, 0, start, end, gapOf(u.Rate), 0)
		a.client, a.ja4 = ip, JA4Python
		a.ua, _ = browserUA(rng)
		s.actors = append(s.actors, a)
	}
	seen := map[string]bool{}
	s.emit = func(rng *rand.Rand, a *actor) Request {
		if rng.Float64() < u.Switch {
			// A user agent not sent before, as a rotation list gives;
			// after 10 draws, whatever came last.
			a.ua, _ = browserUA(rng)
			for i := 0; i < 10 && seen[a.ua]; i++ {
				a.ua, _ = browserUA(rng)
			}
		}
		seen[a.ua] = true
		return Request{Entry: accesslog.Entry{Client: a.client, Method: "GET", Path: sitePath(rng), Status: 200, UserAgent: a.ua, Bytes: 4096}, JA4: a.ja4}
	}
	return s
}

// Scraper is one address in Google Cloud (AS15169) fetching many pages
// fast with python-requests; its JA4 comes from the Enricher (Python).
// Label: attack, scope {"client_ip": its address}.
type Scraper struct {
	Name             string        // default "scraper"
	Offset, Duration time.Duration // from the start; default 0 and 10 min
	Rate             float64       // requests per second; default 10
	Pages            int           // distinct pages it draws from; default 20 000
}

func (c *Scraper) defaults() {
	if c.Rate == 0 {
		c.Rate = 10
	}
	if c.Pages == 0 {
		c.Pages = 20_000
	}
}

func (c Scraper) check() (string, time.Duration, time.Duration, error) {
	c.defaults()
	if err := checkWindow(ScenarioScraper, &c.Name, c.Offset, &c.Duration); err != nil {
		return "", 0, 0, err
	}
	if err := nonNegative(c.Name, "rate", c.Rate); err != nil {
		return "", 0, 0, err
	}
	if c.Pages < 0 {
		return "", 0, 0, fmt.Errorf("replay: scenario %q: %d pages must not be negative", c.Name, c.Pages)
	}
	return c.Name, c.Offset, c.Duration, nil
}

func (c Scraper) setup(rng *rand.Rand, start, end time.Time) *scenario {
	c.defaults()
	ip := addrs(rng, 1, []asnNet{scraperNet}, map[netip.Addr]bool{})[0]
	s := &scenario{label: Label{Attack: true, Scope: ipScope(ip)}}
	if c.Rate > 0 {
		a := newActor(rng, 0, start, end, gapOf(c.Rate), 0)
		a.client, a.ua = ip, "python-requests/2.31.0"
		s.actors = append(s.actors, a)
	}
	s.emit = func(rng *rand.Rand, a *actor) Request {
		status := 200
		if rng.IntN(100) < 3 {
			status = 404
		}
		return Request{Entry: accesslog.Entry{Client: a.client, Method: "GET", Path: fmt.Sprintf("/products/%d", 1+rng.IntN(c.Pages)), Status: status, UserAgent: a.ua, Bytes: 18000}}
	}
	return s
}

// CGNAT is carrier-grade NAT: thousands of subscribers of a mobile carrier
// (AS23693) behind one address, each browsing at a normal rate with their
// own browser, user agent and matching JA4. Benign: no rule should match
// it. Label: not an attack, scope {"client_ip": the address}.
type CGNAT struct {
	Name             string        // default "cgnat"
	Offset, Duration time.Duration // from the start; default 0 and 10 min
	Users            int           // default 3 000
	Interval         time.Duration // each user's mean gap between requests (Poisson); default 1 min
	// IPs is how many NAT addresses the users share, each user behind one
	// of them (round robin). Default 1, at most 64.
	IPs int
}

func (c *CGNAT) defaults() {
	if c.Users == 0 {
		c.Users = 3000
	}
	if c.IPs == 0 {
		c.IPs = 1
	}
	if c.Interval == 0 {
		c.Interval = time.Minute
	}
}

func (c CGNAT) check() (string, time.Duration, time.Duration, error) {
	c.defaults()
	if err := checkWindow(ScenarioCGNAT, &c.Name, c.Offset, &c.Duration); err != nil {
		return "", 0, 0, err
	}
	if c.Users < 0 || c.Users > 1_000_000 || c.Interval < 0 || c.IPs < 0 || c.IPs > 64 {
		return "", 0, 0, fmt.Errorf("replay: scenario %q: %d users (want 1 to 1 000 000), interval %v (want > 0) and %d IPs (want 1 to 64)", c.Name, c.Users, c.Interval, c.IPs)
	}
	return c.Name, c.Offset, c.Duration, nil
}

func (c CGNAT) setup(rng *rand.Rand, start, end time.Time) *scenario {
	c.defaults()
	ips := addrs(rng, c.IPs, []asnNet{cgnatNet}, map[netip.Addr]bool{})
	s := &scenario{label: Label{Scope: ipScope(ips[0])}}
	seen := map[string]bool{}
	for i := 0; i < c.Users; i++ {
		a := newActor(rng, i, start, end, c.Interval, 0)
		a.client = ips[i%len(ips)]
		for { // distinct user agents: one per subscriber's device
			a.ua, a.ja4 = browser(rng)
			if !seen[a.ua] {
				seen[a.ua] = true
				break
			}
		}
		s.actors = append(s.actors, a)
	}
	s.emit = browse
	return s
}

func browse(rng *rand.Rand, a *actor) Request {
	return Request{Entry: accesslog.Entry{Client: a.client, Method: "GET", Path: sitePath(rng), Status: browseStatus(rng), UserAgent: a.ua, Bytes: 6000}, JA4: a.ja4}
}

// FlashCrowd is a sudden legitimate spike: users from the 24 eyeball ASNs,
// each with their own address, browser and JA4, arrive within Ramp and
// browse, half their requests to one landing page. Benign: no rule should
// match it. Label: not an attack, no scope.
type FlashCrowd struct {
	Name             string        // default "flash-crowd"
	Offset, Duration time.Duration // from the start; default 0 and 10 min
	Users            int           // default 5 000
	// Ramp is the time over which users arrive, uniformly, from the
	// start. Default 1 min.
	Ramp time.Duration
	// Interval is each user's mean gap between requests (Poisson); each
	// stays to the end. Default 20 s.
	Interval time.Duration
	Path     string // the landing page; default /
}

func (f *FlashCrowd) defaults() {
	if f.Users == 0 {
		f.Users = 5000
	}
	if f.Ramp == 0 {
		f.Ramp = time.Minute
	}
	if f.Interval == 0 {
		f.Interval = 20 * time.Second
	}
	if f.Path == "" {
		f.Path = "/"
	}
}

func (f FlashCrowd) check() (string, time.Duration, time.Duration, error) {
	f.defaults()
	if err := checkWindow(ScenarioFlashCrowd, &f.Name, f.Offset, &f.Duration); err != nil {
		return "", 0, 0, err
	}
	if f.Users < 0 || f.Users > 1_000_000 || f.Ramp < 0 || f.Interval < 0 {
		return "", 0, 0, fmt.Errorf("replay: scenario %q: %d users (want 1 to 1 000 000), ramp %v and interval %v must not be negative", f.Name, f.Users, f.Ramp, f.Interval)
	}
	return f.Name, f.Offset, f.Duration, nil
}

func (f FlashCrowd) setup(rng *rand.Rand, start, end time.Time) *scenario {
	f.defaults()
	s := &scenario{label: Label{}}
	for i, ip := range addrs(rng, f.Users, residentialNets, map[netip.Addr]bool{}) {
		arrive := start.Add(time.Duration(rng.Float64() * float64(f.Ramp)))
		a := newActor(rng, i, arrive, end, f.Interval, 0)
		a.next = arrive // the first request on arrival
		a.client = ip
		a.ua, a.ja4 = browser(rng)
		s.actors = append(s.actors, a)
	}
	s.emit = func(rng *rand.Rand, a *actor) Request {
		r := browse(rng, a)
		if rng.IntN(2) == 0 {
			r.Path, r.Status = f.Path, 200
		}
		return r
	}
	return s
}
