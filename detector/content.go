package detector

import (
	"encoding/binary"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/detector/enrich"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/sketch"
)

// ContentOptions configure the content signal. Zero fields take the
// defaults named on each.
type ContentOptions struct {
	// Windows are the event-time windows, one stage each, sharing one
	// cool-down. Default 10 s, 1 min, 10 min and 1 h: an exploit or a
	// rotating prober draws its rule at the end of the 10 s window it
	// shows in, a scanner at 0.5 requests a second passes every floor
	// below within 2 minutes, a slow prober within 10, and a distributed
	// prober (AgentAddresses) that sends one address an hour or two within
	// the hour.
	Windows []time.Duration
	// K bounds the clients and the networks tracked per window and
	// partition (each); a client is tracked from its first hit, 4xx,
	// failed login or scanner user agent, and further ones are left out
	// when K are. Default 4096.
	K int
	// MinHits: a scope that asks for at least MinHits distinct probe
	// paths (the lists' and the CRS's restricted files and extensions,
	// refused) is probing. Default 0: scaled by the site's traffic in the
	// window (siteFloor): 2 below 100 000 requests an hour, 3 above.
	MinHits int
	// MinExploits: a scope with at least MinExploits unambiguous probes
	// is attacking, whatever the site's traffic: an exploit payload (the
	// CRS's SQL injection, XSS, command and PHP injection, traversal, OS
	// file, file inclusion, Java rules), a known exploit's URI
	// (cve.txt), a secret (sensitive.txt, a dotfile the CRS restricts),
	// a CMS or admin path the site refused. Default 1.
	MinExploits int
	// Signatures checks requests against the OWASP Core Rule Set; nil:
	// DefaultSignatures (the embedded CRS), unless NoSignatures.
	Signatures   *Signatures
	NoSignatures bool
	// MaxChecks bounds the CRS checks of one client's targets per window
	// and partition (a check costs 5-200 µs): past it, a
	// flood of payloads is judged on the first MaxChecks, which flag it
	// long before. Default 16.
	MaxChecks int
	// RotationNetworks: a TLS client (JA4) in one ASN whose probes come
	// from at least RotationNetworks networks (/24, /48) within
	// RotationMemory, and whose requests in the window are at least
	// NetShare what flags it, is one prober rotating its addresses: it
	// draws a rule on that JA4 and ASN, which stay the same when the
	// address moves. Defaults 2 and 10 min.
	RotationNetworks int
	RotationMemory   time.Duration
	// ErrorShare, MinErrorRequests, MinErrorPaths: a client whose answers
	// are at least ErrorShare 4xx (429 aside: the site's own throttle) over
	// at least MinErrorRequests requests and MinErrorPaths distinct failing
	// paths is probing. Defaults 0.8, 10 and 5.
	ErrorShare       float64
	MinErrorRequests int
	MinErrorPaths    int
	// MinLogins: a scope with at least MinLogins failed logins (a 401; a
	// 403 on an auth route; a POST to a login form that answers 200 to a
	// failure, such as /wp-login.php) is guessing passwords. Default 5.
	MinLogins int
	// MinScanner: a scope with a scanner user agent (the CRS's list, or
	// scanners.txt) and at least MinScanner requests that are a scanner's
	// or hits or failed logins is scanning. Default 1: a scanner names
	// itself.
	MinScanner int
	// NetAddresses is the least number of distinct addresses a network
	// needs for a rule on the network rather than on its clients. Default 2.
	NetAddresses int
	// NetShare is the least share of a network's requests in the window
	// that must be what flags it (its probe hits, failed logins, 4xx or
	// scanner requests, the largest of the four) for a rule on the whole
	// network: a /24 of a residential carrier where bots fail logins
	// beside people who browse is not a prober's network (its bots are
	// judged one by one). Default 0.9.
	NetShare float64
	// NetLoginsPerAddress is the least failed logins per distinct address
	// for failed logins to flag a network (see judge). Default 2.
	NetLoginsPerAddress float64
	// AgentAddresses: a user agent whose probe hits or refused requests
	// (4xx but failed logins, which credential stuffers spread over
	// addresses that people share, and assets) come from at least
	// AgentAddresses distinct addresses, and whose requests in the window
	// are at least NetShare what flags it (probe hits, failed logins or
	// 4xx), is one distributed prober's: a botnet that asks for a CMS's
	// files once from each of its addresses with one user agent. It draws one rule on those addresses (client_ip
	// in a list of single-address networks, a shared bucket). A browser's
	// user agent, which people send too, is never mostly failing. Default 3.
	AgentAddresses int
	// IPv4Prefix and IPv6Prefix are the networks rotating probers are
	// judged in. Defaults 24 and 48.
	IPv4Prefix, IPv6Prefix int
	// Lists is a folder of list files replacing the defaults (see
	// LoadContentLists); empty: the defaults. Ignored when Patterns is set.
	Lists string
	// Patterns are lists already loaded (LoadContentLists), e.g. shared by
	// several detectors.
	Patterns *ContentLists
	// TTL of an emitted rule, at least its window (a longer window's rules
	// live for that window); a scope is not emitted again while its rule
	// has more than half of it left. Default 10 min.
	TTL time.Duration
	// Limit of an emitted rule, requests per window. Default 10.
	Limit int64
	// Enforce emits rules in enforce mode; default shadow.
	Enforce bool
}

func (o *ContentOptions) defaults() error {
	if len(o.Windows) == 0 {
		o.Windows = []time.Duration{10 * time.Second, time.Minute, 10 * time.Minute, time.Hour}
	}
	orDefault(&o.K, 4096)
	orDefault(&o.MinExploits, 1)
	orDefault(&o.MaxChecks, 16)
	orDefault(&o.RotationNetworks, 2)
	orDefault(&o.RotationMemory, 10*time.Minute)
	orDefault(&o.ErrorShare, 0.8)
	orDefault(&o.MinErrorRequests, 10)
	orDefault(&o.MinErrorPaths, 5)
	orDefault(&o.MinLogins, 5)
	orDefault(&o.MinScanner, 1)
	orDefault(&o.NetAddresses, 2)
	orDefault(&o.NetShare, 0.9)
	orDefault(&o.NetLoginsPerAddress, 2)
	orDefault(&o.AgentAddresses, 3)
	orDefault(&o.IPv4Prefix, 24)
	orDefault(&o.IPv6Prefix, 48)
	orDefault(&o.TTL, 10*time.Minute)
	orDefault(&o.Limit, 10)
	c := optCheck{signal: "content"}
	for _, w := range o.Windows {
		c.window(w)
		c.ttl(max(o.TTL, w), w)
	}
	if len(o.Windows) > 4 {
		c.fail("Windows %v: want at most 4", o.Windows)
	}
	c.count("K", o.K, MaxK)
	// The distinct sets keep maxContentSet hashes.
	if o.MinHits < 0 || o.MinHits > maxContentSet {
		c.fail("MinHits %d: want 1 to %d, or 0 for the site's scale", o.MinHits, maxContentSet)
	}
	c.count("MinExploits", o.MinExploits, 1<<30)
	c.count("MaxChecks", o.MaxChecks, 1<<20)
	c.count("RotationNetworks", o.RotationNetworks, maxContentSet)
	if o.RotationMemory < 0 || o.RotationMemory > 24*time.Hour {
		c.fail("RotationMemory %v: want at most 24h", o.RotationMemory)
	}
	c.fraction("ErrorShare", o.ErrorShare)
	c.count("MinErrorRequests", o.MinErrorRequests, 1<<30)
	c.count("MinErrorPaths", o.MinErrorPaths, maxContentSet)
	c.count("MinLogins", o.MinLogins, 1<<30)
	c.count("MinScanner", o.MinScanner, 1<<30)
	c.count("NetAddresses", o.NetAddresses, maxContentSet)
	c.count("AgentAddresses", o.AgentAddresses, maxContentSet)
	c.fraction("NetShare", o.NetShare)
	c.positive("NetLoginsPerAddress", o.NetLoginsPerAddress)
	if o.IPv4Prefix < 8 || o.IPv4Prefix > 32 {
		c.fail("IPv4Prefix %d: want 8 to 32", o.IPv4Prefix)
	}
	if o.IPv6Prefix < 16 || o.IPv6Prefix > 128 {
		c.fail("IPv6Prefix %d: want 16 to 128", o.IPv6Prefix)
	}
	c.limit("Limit", o.Limit)
	return c.err()
}

// Content flags clients by what they ask for rather than how often: probes
// for sensitive files, backdoors, admin consoles, CMS files the site does
// not have, exploited CVEs' URIs and path traversal; mostly failing answers
// over many paths; failed logins; and scanner user agents. The patterns
// are lists an operator can replace (LoadContentLists). Per window it
// counts, for each client address and each network (/24, /48) that did
// anything of the kind, the hits per category, the 4xx answers and their
// distinct paths, the failed logins and the scanner requests, beside a
// count-min sketch of every client's requests (for the 4xx share). A
// network whose probes come from several addresses draws one rule on the
// network (a rotating prober); a user agent whose probes come from several
// addresses and who sends little else draws one rule on those addresses (a
// distributed prober); other clients draw rules on their address. The
// rule's evidence holds the counts per category and example paths.
//
// Content is a stage.Stage and Checkpointer, not safe for concurrent use;
// the stages NewContent returns share a cool-down and must be driven by one
// goroutine (a pipeline's merge tier is).
type Content struct {
	o      ContentOptions
	window time.Duration
	lists  *ContentLists
	sigs   *Signatures // nil: no signature checks
	active coolDown    // scope -> expiry of its rule, shared by the windows
	// rotations remember, per JA4 and ASN, the networks it probed from
	// and when last (see RotationNetworks), shared by the windows.
	rotations rotationMemory
	// memo shares each record's classification among the windows.
	memo *contentMemo
	// exempt, when set, leaves records out (verified crawlers).
	exempt func(*decisionpb.Decision) bool
}

// NewContent returns the content signal's stages, one per window of o, or
// an error wrapping ErrBadOptions (naming the list file and line of a bad
// pattern).
func NewContent(o ContentOptions) ([]*Content, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	lists := o.Patterns
	if lists == nil {
		var err error
		if lists, err = LoadContentLists(o.Lists); err != nil {
			return nil, err
		}
	}
	sigs := o.Signatures
	if sigs == nil && !o.NoSignatures {
		var err error
		if sigs, err = DefaultSignatures(); err != nil {
			return nil, err
		}
	}
	active, rot, memo := coolDown{}, rotationMemory{}, &contentMemo{}
	var out []*Content
	for _, w := range o.Windows {
		out = append(out, &Content{o: o, window: w, lists: lists, sigs: sigs, active: active, rotations: rot, memo: memo})
	}
	return out, nil
}

// Name is the stage's name in the pipeline: content-<window>.
func (c *Content) Name() string { return "content-" + c.window.String() }

// Window is the event-time window the signal counts in.
func (c *Content) Window() time.Duration { return c.window }

// maxContentSet bounds the distinct sets (paths, addresses) a tally keeps:
// the smallest hashes, so that counts are exact up to it and merges are
// independent of order. maxContentExamples is the example paths kept.
const (
	maxContentSet      = 16
	maxContentExamples = 3
	maxContentPath     = 256
	maxContentCRS      = 4
)

// contentTally is one scope's window.
type contentTally struct {
	// n counts the scope's requests that are a hit, a 4xx, a failed login
	// or a scanner's (0 in a state written before it was kept: see bad).
	n                uint64
	hits             [numHitCategories]uint64
	errors, logins   uint64
	scanner          uint64
	hitPaths         []uint64 // smallest hashes of distinct hit paths
	errPaths         []uint64 // of distinct 4xx paths
	addrs            []uint64 // of distinct client addresses (networks, agents)
	examples, others []string // smallest hit paths; smallest other paths
	ips              []string // smallest client addresses (agents)
	hitAddrs         []uint64 // of distinct addresses with a probe hit (agents)
	crs              []uint64 // smallest CRS rule ids of its exploit hits (v3)
}

// strong counts the tally's unambiguous probes, each enough alone: exploit
// payloads (the CRS), known exploits' URIs (cve.txt), secrets (the
// sensitive list, the CRS's restricted dotfiles) and CMS and admin paths
// the site refused (it does not run them: someone is fingerprinting it).
func (t *contentTally) strong() uint64 {
	return t.hits[catExploit] + t.hits[catCVE] + t.hits[catSensitive] + t.hits[catCMS] + t.hits[catAdmin]
}

func (t *contentTally) hitCount() uint64 {
	var n uint64
	for _, h := range t.hits {
		n += h
	}
	return n
}

// bad is how many of the scope's requests are a hit, a 4xx, a failed login
// or a scanner's: n, or for a tally decoded from a state without n the
// largest of the four counts.
func (t *contentTally) bad() uint64 {
	return max(t.n, t.hitCount(), t.logins, t.errors, t.scanner)
}

func (t *contentTally) merge(x *contentTally) {
	t.n += x.n
	for i := range t.hits {
		t.hits[i] += x.hits[i]
	}
	t.errors += x.errors
	t.logins += x.logins
	t.scanner += x.scanner
	for _, h := range x.hitPaths {
		t.hitPaths = addSmallest(t.hitPaths, h, maxContentSet)
	}
	for _, h := range x.errPaths {
		t.errPaths = addSmallest(t.errPaths, h, maxContentSet)
	}
	for _, h := range x.addrs {
		t.addrs = addSmallest(t.addrs, h, maxContentSet)
	}
	for _, s := range x.examples {
		t.examples = addSmallest(t.examples, s, maxContentExamples)
	}
	for _, s := range x.others {
		t.others = addSmallest(t.others, s, maxContentExamples)
	}
	for _, s := range x.ips {
		t.ips = addSmallest(t.ips, s, maxContentSet)
	}
	for _, h := range x.hitAddrs {
		t.hitAddrs = addSmallest(t.hitAddrs, h, maxContentSet)
	}
	for _, h := range x.crs {
		t.crs = addSmallest(t.crs, h, maxContentCRS)
	}
}

// addSmallest adds v to the sorted set s, keeping its n smallest.
func addSmallest[T uint64 | string](s []T, v T, n int) []T {
	i, found := slices.BinarySearch(s, v)
	if found || i >= n {
		return s
	}
	s = slices.Insert(s, i, v)
	if len(s) > n {
		s = s[:n]
	}
	return s
}

type contentPartial struct {
	exempt  func(*decisionpb.Decision) bool // verified crawlers, when set
	k       int
	n       uint64                   // every request observed (the site's traffic; v3)
	totals  *sketch.CountMin         // requests per client address
	clients map[string]*contentTally // by client_ip
	nets    map[string]*contentTally // by network
	agents  map[string]*contentTally // by user agent (up to maxContentPath bytes)
	// groups are the TLS clients (JA4) per ASN, for rotating probers:
	// addrs and ips hold the networks they probed from (v3).
	groups map[string]*contentTally
	// checks counts each client's CRS checks of targets (MaxChecks); not
	// part of the state: a decoded partial starts it over.
	checks map[string]int
	memo   *contentMemo // shared by the signal's windows
	lists  *ContentLists
	sigs   *Signatures
	o      *ContentOptions
}

// newContentPartial returns an empty state of K k.
func (c *Content) newContentPartial(k int, totals *sketch.CountMin) *contentPartial {
	return &contentPartial{exempt: c.exempt, k: k, totals: totals, clients: map[string]*contentTally{}, nets: map[string]*contentTally{},
		agents: map[string]*contentTally{}, groups: map[string]*contentTally{}, checks: map[string]int{}, memo: c.memo, lists: c.lists, sigs: c.sigs, o: &c.o}
}

// NewPartial returns an empty window state.
func (c *Content) NewPartial() stage.Partial {
	cm, _ := sketch.NewCountMin(0.002, 0.01)
	return c.newContentPartial(c.o.K, cm)
}

// contentNet is the network of a client_ip value (an address, or the /64
// a replay or gateway keys IPv6 by), or "" for none (a host name).
func contentNet(ip string, v4, v6 int) string {
	var a netip.Addr
	if p, err := netip.ParsePrefix(ip); err == nil {
		a = p.Addr()
	} else if a, err = netip.ParseAddr(ip); err != nil {
		return ""
	}
	a = a.Unmap()
	bits := v4
	if a.Is6() {
		bits = v6
	}
	p, err := a.Prefix(bits)
	if err != nil {
		return ""
	}
	return p.String()
}

// cmsRefused reports whether an answer to a CMS path says the site has no
// such page or refuses it: a 4xx other than 401 and 403 (a CMS's own login
// wall answers its users so) and 429 (the site's throttle). A site that
// runs the CMS serves its paths; SecRepo answers 418 to WordPress probes.
func cmsRefused(status uint32) bool {
	return status >= 400 && status < 500 && status != 401 && status != 403 && status != 429
}

// groupKey is the rotation key of a record: its JA4 and ASN, "" when
// either is unknown.
func groupKey(x *decisionpb.Descriptors) string {
	ja4, asn := x.GetJa4(), x.GetAsn()
	if ja4 == "" || asn == 0 || strings.IndexByte(ja4, 0) >= 0 {
		return ""
	}
	return ja4 + "\x00" + strconv.FormatUint(uint64(asn), 10)
}

// selfDeclaredCrawler reports whether a user agent says it is a crawler
// (enrich.UAFamily: Googlebot, Bingbot or another crawler's words).
func selfDeclaredCrawler(ua string) bool {
	switch enrich.UAFamily(ua) {
	case "Crawler", "Googlebot", "Bingbot":
		return true
	}
	return false
}

// dotfile reports whether a lower-cased path has a segment that starts
// with a dot, but for /.well-known/ (RFC 8615), which browsers and
// certificate authorities ask for: a hidden file no page links to.
func dotfile(path string) bool {
	for i := strings.Index(path, "/."); i >= 0; i = strings.Index(path, "/.") {
		rest := path[i+2:]
		if !strings.HasPrefix(rest, "well-known/") && rest != "well-known" && rest != "" && rest[0] != '/' && rest[0] != '.' {
			return true
		}
		path = rest
	}
	return false
}

// contentRecord is what the content signal takes from one record that is
// the same in every window: its scopes and their count-min keys, its
// request line, and its classification. The first of the signal's window
// stages to observe a record computes it and the others reuse it
// (contentMemo), so that four windows cost about one.
type contentRecord struct {
	// Identity: the record observed (a pointer and the data of two of
	// its strings, which a decoder reusing the struct would change).
	d                *decisionpb.Decision
	ipData, pathData *byte
	t                int64

	ip, network, ua, group    string
	hIP, hNet, hAgent, hGroup uint64
	method, raw, target, path string
	status                    uint32
	needs                     bool // NeedsCheck(raw)
	ph, ih                    uint64
	kinds                     [2]contentKind // with the user agent's verdict only, with the target's too
	done                      [2]bool
}

// contentKind is a record's classification under one signature verdict.
type contentKind struct {
	sig                             Verdict
	cat                             contentCategory
	refused, failed, login, scanner bool
}

// contentMemo holds the records being observed, one slot per hash of
// their pointer, shared by a signal's window stages. Each slot is an
// atomic pointer to a record that, once published, only its observing
// goroutine (the partition's) changes.
type contentMemo struct {
	slots [64]atomic.Pointer[contentRecord]
}

// record returns d's contentRecord, computing it when no window of this
// partition has yet.
func (m *contentMemo) record(d *decisionpb.Decision, p *contentPartial) *contentRecord {
	x := d.GetDescriptors()
	ip, raw := x.GetClientIp(), x.GetPath()
	slot := &m.slots[(uintptr(unsafe.Pointer(d))>>4)%uintptr(len(m.slots))]
	if r := slot.Load(); r != nil && r.d == d && r.ipData == unsafe.StringData(ip) && r.pathData == unsafe.StringData(raw) && r.t == d.EventTimeMs {
		return r
	}
	r := &contentRecord{d: d, ipData: unsafe.StringData(ip), pathData: unsafe.StringData(raw), t: d.EventTimeMs,
		ip: ip, method: x.GetMethod(), raw: raw, status: d.GetStatus()}
	r.hIP, r.ih = sketch.Hash64(ip), sketch.Hash64(ip)
	if r.network = contentNet(ip, p.o.IPv4Prefix, p.o.IPv6Prefix); r.network != "" {
		r.hNet = netTotalKey(r.network)
	}
	if r.ua = d.GetUserAgent(); len(r.ua) > maxContentPath {
		r.ua = r.ua[:maxContentPath]
	}
	if r.ua != "" {
		r.hAgent = agentTotalKey(r.ua)
	}
	if r.group = groupKey(x); r.group != "" {
		r.hGroup = groupTotalKey(r.group)
	}
	r.needs = NeedsCheck(raw, r.status)
	r.target = strings.ToLower(raw)
	r.path, _, _ = strings.Cut(r.target, "?")
	r.ph = sketch.Hash64(r.path)
	slot.Store(r)
	return r
}

// kind classifies the record with the target's signatures (full) or the
// user agent's only.
func (r *contentRecord) kind(p *contentPartial, d *decisionpb.Decision, full bool) *contentKind {
	i := 0
	if full {
		i = 1
	}
	k := &r.kinds[i]
	if r.done[i] {
		return k
	}
	r.done[i] = true
	if p.sigs != nil {
		k.sig = p.sigs.check(r.method, r.raw, d.GetUserAgent(), r.status, full)
	}
	sig, status, path, target := k.sig, r.status, r.path, r.target
	cat := numHitCategories
	switch {
	case sig.Class == SigExploit:
		cat = catExploit
	case sig.Class == SigProbe && (status == 0 || status >= 300):
		// A restricted file or extension the site did not serve: a
		// secret when it is a dotfile (/.env, /.git/config, /.ssh/),
		// which no page links to, else a probe among others (the CRS
		// also lists error.log and browserconfig.xml).
		cat = catRestricted
		if dotfile(path) {
			cat = catSensitive
		}
	case sig.Class == SigWeak:
		// A noisy rule's match: a probe, not one request's evidence.
		cat = catRestricted
	}
	// refused: a request the site said it does not have (not a login
	// wall, not its throttle, not an asset), which a distributed prober's
	// addresses count (AgentAddresses).
	k.refused = cmsRefused(status) && !IsAsset(path)
	if (cat == catRestricted || k.refused) && selfDeclaredCrawler(d.GetUserAgent()) {
		// A self-declared crawler following a site's broken or stale
		// links (AhrefsBot to /self.logs/error.log.<date>.gz, MJ12bot
		// to an unexpanded template): not a probe. Its exploits and
		// secrets still count.
		k.refused = false
		if cat == catRestricted {
			cat = numHitCategories
		}
	}
	var cand contentCandidates // the lists' globs whose literal the target holds
	p.lists.candidates(target, &cand)
	for c := range catExploit {
		if cat < numHitCategories {
			break
		}
		if (c == catCMS || c == catAdmin) && !cmsRefused(status) {
			continue
		}
		s := path
		if contentWithQuery[c] {
			s = target
		}
		if p.lists.matchIn(c, s, &cand) {
			cat = c
		}
	}
	k.cat = cat
	// A page's missing image is not a probe: assets do not count as
	// failures (a browser fetches dozens with every page).
	k.failed = status >= 400 && status < 500 && status != 429 && !IsAsset(path)
	k.login = status == 401 || status == 403 && p.lists.matchIn(catAuth, path, &cand) ||
		strings.EqualFold(r.method, "POST") && p.lists.matchIn(catAuthPost, path, &cand)
	k.scanner = sig.Scanner || p.lists.matchAgent(d.GetUserAgent())
	return k
}

// Observe counts one record.
func (p *contentPartial) Observe(d *decisionpb.Decision) {
	x := d.GetDescriptors()
	ip := x.GetClientIp()
	if ip == "" || strings.IndexByte(ip, 0) >= 0 || (p.exempt != nil && p.exempt(d)) {
		return
	}
	r := p.memo.record(d, p)
	p.n++
	p.totals.Add(r.hIP, 1)
	network, ua, group := r.network, r.ua, r.group
	if network != "" {
		p.totals.Add(r.hNet, 1)
	}
	if ua != "" {
		p.totals.Add(r.hAgent, 1)
	}
	if group != "" {
		p.totals.Add(r.hGroup, 1)
	}
	full := p.sigs != nil
	if full && r.needs {
		n := p.checks[ip]
		full = n < p.o.MaxChecks
		if full && (n > 0 || len(p.checks) < 4*p.k) {
			p.checks[ip] = n + 1
		}
	}
	k := r.kind(p, d, full)
	sig, cat, refused, failed, login, scanner := k.sig, k.cat, k.refused, k.failed, k.login, k.scanner
	if cat == numHitCategories && !failed && !login && !scanner {
		return
	}
	target := r.target
	if len(target) > maxContentPath {
		target = target[:maxContentPath]
	}
	ph, ih := r.ph, r.ih
	for i, key := range [...]string{ip, network, ua, group} {
		isNet, isAgent, isGroup := i == 1, i == 2, i == 3
		var m map[string]*contentTally
		switch i {
		case 0:
			m = p.clients
		case 1:
			m = p.nets
		case 2:
			m = p.agents
		default:
			m = p.groups
		}
		if key == "" {
			continue
		}
		t := m[key]
		if t == nil {
			if len(m) >= p.k {
				continue
			}
			t = &contentTally{}
			m[key] = t
		}
		t.n++
		switch {
		case isNet || isAgent:
			t.addrs = addSmallest(t.addrs, ih, maxContentSet)
		case isGroup && cat < numHitCategories && network != "":
			// The networks it probed from.
			t.addrs = addSmallest(t.addrs, sketch.Hash64(network), maxContentSet)
			t.ips = addSmallest(t.ips, network, maxContentSet)
		}
		if isAgent && (cat < numHitCategories || refused && !login) {
			// Its addresses that probed or were refused (a failed
			// login aside: stuffers spread those over addresses
			// people share).
			t.hitAddrs = addSmallest(t.hitAddrs, ih, maxContentSet)
			t.ips = addSmallest(t.ips, ip, maxContentSet)
		}
		if cat < numHitCategories {
			t.hits[cat]++
			t.hitPaths = addSmallest(t.hitPaths, ph, maxContentSet)
			t.examples = addSmallest(t.examples, target, maxContentExamples)
			if cat == catExploit && sig.Rule != 0 {
				t.crs = addSmallest(t.crs, uint64(sig.Rule), maxContentCRS)
			}
		} else {
			t.others = addSmallest(t.others, target, maxContentExamples)
		}
		if failed {
			t.errors++
			t.errPaths = addSmallest(t.errPaths, ph, maxContentSet)
		}
		if login {
			t.logins++
		}
		if scanner {
			t.scanner++
		}
	}
}

// Merge folds in another partition's state of the same window.
func (p *contentPartial) Merge(o stage.Partial) error {
	x, ok := o.(*contentPartial)
	if !ok {
		return fmt.Errorf("detector: content cannot merge a %T", o)
	}
	if err := p.totals.Merge(x.totals); err != nil {
		return err
	}
	p.n += x.n
	for _, pair := range [4][2]map[string]*contentTally{{p.clients, x.clients}, {p.nets, x.nets}, {p.agents, x.agents}, {p.groups, x.groups}} {
		for _, k := range slices.Sorted(maps.Keys(pair[1])) {
			t := pair[0][k]
			if t == nil {
				if len(pair[0]) >= p.k {
					continue
				}
				t = &contentTally{}
				pair[0][k] = t
			}
			t.merge(pair[1][k])
		}
	}
	return nil
}

// The state's formats: the first had K where later ones have a 0, then
// the format's number. The first had no user agents and no n; 2 added
// them; 3 added the exploit category, the site's request count, the CRS
// rule ids and the JA4-and-ASN groups.
const (
	contentStateV2 = 2
	contentStateV3 = 3
)

// MarshalBinary encodes the state: 0 and contentStateV3, K, the request
// count, the count-min, then the clients, the networks, the user agents
// (with their addresses) and the groups, each sorted by key.
func (p *contentPartial) MarshalBinary() ([]byte, error) {
	cm, err := p.totals.MarshalBinary()
	if err != nil {
		return nil, err
	}
	b := binary.AppendUvarint(nil, 0)
	b = binary.AppendUvarint(b, contentStateV3)
	b = binary.AppendUvarint(b, uint64(p.k))
	b = binary.AppendUvarint(b, p.n)
	b = stage.AppendBytes(b, cm)
	for i, m := range []map[string]*contentTally{p.clients, p.nets, p.agents, p.groups} {
		b = binary.AppendUvarint(b, uint64(len(m)))
		for _, k := range slices.Sorted(maps.Keys(m)) {
			b = stage.AppendString(b, k)
			b = m[k].appendTo(b, i >= 2)
		}
	}
	return b, nil
}

// appendTo encodes a tally in the latest format; addressed (user agents,
// groups) adds its probing addresses or networks.
func (t *contentTally) appendTo(b []byte, addressed bool) []byte {
	b = binary.AppendUvarint(b, t.n)
	for _, n := range t.hits {
		b = binary.AppendUvarint(b, n)
	}
	b = binary.AppendUvarint(b, t.errors)
	b = binary.AppendUvarint(b, t.logins)
	b = binary.AppendUvarint(b, t.scanner)
	sets := [][]uint64{t.hitPaths, t.errPaths, t.addrs, t.crs}
	strs := [][]string{t.examples, t.others}
	if addressed {
		sets = append(sets, t.hitAddrs)
		strs = append(strs, t.ips)
	}
	for _, set := range sets {
		b = binary.AppendUvarint(b, uint64(len(set)))
		for _, h := range set {
			b = binary.AppendUvarint(b, h)
		}
	}
	for _, set := range strs {
		b = binary.AppendUvarint(b, uint64(len(set)))
		for _, s := range set {
			b = stage.AppendString(b, s)
		}
	}
	return b
}

// readTally decodes what appendTo wrote in format v (1, 2 or 3),
// refusing sets out of order or over their bounds.
func readTally(r *stage.StateReader, key string, v uint64, addressed bool) (*contentTally, error) {
	t := &contentTally{}
	if v >= contentStateV2 {
		t.n = r.Uvarint()
	}
	hits := int(numHitCategories)
	if v < contentStateV3 {
		hits = int(catExploit) // no exploit category before
	}
	for i := range hits {
		t.hits[i] = r.Uvarint()
	}
	t.errors, t.logins, t.scanner = r.Uvarint(), r.Uvarint(), r.Uvarint()
	sets := []*[]uint64{&t.hitPaths, &t.errPaths, &t.addrs}
	setBounds := []int{maxContentSet, maxContentSet, maxContentSet}
	if v >= contentStateV3 {
		sets = append(sets, &t.crs)
		setBounds = append(setBounds, maxContentCRS)
	}
	strs := []*[]string{&t.examples, &t.others}
	bounds := []int{maxContentExamples, maxContentExamples}
	if addressed {
		sets = append(sets, &t.hitAddrs)
		setBounds = append(setBounds, maxContentSet)
		strs = append(strs, &t.ips)
		bounds = append(bounds, maxContentSet)
	}
	for i, set := range sets {
		for range r.Count(1) {
			*set = append(*set, r.Uvarint())
		}
		if len(*set) > setBounds[i] || !slices.IsSorted(*set) || len(slices.Compact(slices.Clone(*set))) != len(*set) {
			return nil, fmt.Errorf("detector: content window state of %.64q: a set out of order or over %d", key, setBounds[i])
		}
	}
	for i, set := range strs {
		for range r.Count(1) {
			*set = append(*set, r.String())
		}
		if len(*set) > bounds[i] || !slices.IsSorted(*set) || len(slices.Compact(slices.Clone(*set))) != len(*set) {
			return nil, fmt.Errorf("detector: content window state of %.64q: examples or addresses out of order or over %d", key, bounds[i])
		}
	}
	return t, nil
}

// DecodePartial decodes what a partial's MarshalBinary wrote, or an
// earlier format (1: no user agents; 2: no exploits, site count or
// groups); it refuses an unknown format and sets out of order or over
// their bounds.
func (c *Content) DecodePartial(b []byte) (stage.Partial, error) {
	r := stage.NewStateReader(b)
	k := r.Uvarint()
	v := uint64(1)
	if k == 0 {
		if v = r.Uvarint(); v != contentStateV2 && v != contentStateV3 {
			return nil, fmt.Errorf("detector: content window state of format %d: want %d or %d", v, contentStateV2, contentStateV3)
		}
		k = r.Uvarint()
	}
	var n uint64
	if v >= contentStateV3 {
		n = r.Uvarint()
	}
	cmb := r.Bytes()
	p := c.newContentPartial(int(min(k, MaxK)), new(sketch.CountMin))
	p.n = n
	tallies := []map[string]*contentTally{p.clients, p.nets}
	if v >= contentStateV2 {
		tallies = append(tallies, p.agents)
	}
	if v >= contentStateV3 {
		tallies = append(tallies, p.groups)
	}
	for i, m := range tallies {
		for range r.Count(1 + int(numHitCategories) + 3 + 5) {
			key := r.String()
			t, err := readTally(r, key, v, i >= 2)
			if err != nil {
				return nil, err
			}
			if m[key] != nil {
				return nil, fmt.Errorf("detector: content window state: %.64q twice", key)
			}
			m[key] = t
		}
	}
	if err := r.Done(); err != nil {
		return nil, fmt.Errorf("detector: content window state: %w", err)
	}
	if k == 0 || k > MaxK || len(p.clients) > int(k) || len(p.nets) > int(k) || len(p.agents) > int(k) || len(p.groups) > int(k) {
		return nil, fmt.Errorf("detector: content window state of %d clients, %d networks, %d user agents and %d groups with K %d", len(p.clients), len(p.nets), len(p.agents), len(p.groups), k)
	}
	if err := p.totals.UnmarshalBinary(cmb); err != nil {
		return nil, fmt.Errorf("detector: content totals: %w", err)
	}
	return p, nil
}

// distinctAddrs estimates the distinct addresses behind a network's
// smallest address hashes (sorted): exact below maxContentSet of them,
// else the k-minimum-values estimate (k-1) / (the k-th smallest hash as a
// fraction of 2^64) (Bar-Yossef et al. 2002).
func distinctAddrs(h []uint64) float64 {
	if len(h) < maxContentSet || h[len(h)-1] == 0 {
		return float64(len(h))
	}
	return float64(len(h)-1) / (float64(h[len(h)-1]) / (1 << 64))
}

// netTotalKey is the count-min key of a network's requests, beside its
// clients' (an address never starts with a NUL).
func netTotalKey(network string) uint64 { return sketch.Hash64("\x00net " + network) }

// agentTotalKey is the count-min key of a user agent's requests.
func agentTotalKey(ua string) uint64 { return sketch.Hash64("\x00ua " + ua) }

// groupTotalKey is the count-min key of a JA4 and ASN's requests.
func groupTotalKey(g string) uint64 { return sketch.Hash64("\x00group " + g) }

// siteFloor is the least number of distinct probe paths (other than the
// unambiguous ones, see strong) that flags a scope in a window with n
// requests in all: MinHits when set, else 2 below 100 000 requests an hour
// (a sparse site, where two probes stand out) and 3 above, where a person
// following stale links is likelier.
func (c *Content) siteFloor(n uint64) int {
	if c.o.MinHits > 0 {
		return c.o.MinHits
	}
	if perHour := float64(n) * float64(time.Hour) / float64(c.window); perHour < 100_000 {
		return 2
	}
	return 3
}

// Finish judges the window's rotating probers (JA4 and ASN groups), its
// networks, then its clients outside a flagged network, then its user
// agents over the addresses left, and returns their rules.
func (c *Content) Finish(w stage.Window, merged stage.Partial) stage.Output {
	p, ok := merged.(*contentPartial)
	if !ok {
		return stage.Output{}
	}
	var out stage.Output
	floor := c.siteFloor(p.n)
	for _, g := range slices.Sorted(maps.Keys(p.groups)) {
		if r, ok := c.rotationRule(w, p, g); ok {
			out.Rules = append(out.Rules, r)
		}
	}
	flagged := map[string]bool{}
	for _, n := range slices.Sorted(maps.Keys(p.nets)) {
		t := p.nets[n]
		if len(t.addrs) < c.o.NetAddresses {
			continue
		}
		why := c.judge(t, 0, distinctAddrs(t.addrs), floor)
		if why == "" {
			continue
		}
		total := p.totals.Estimate(netTotalKey(n))
		if float64(t.bad()) < c.o.NetShare*float64(total) {
			continue // mixed traffic: its clients are judged one by one
		}
		flagged[n] = true
		pre, err := netip.ParsePrefix(n)
		if err != nil {
			continue
		}
		if r, ok := c.rule(w, "network "+n, []rules.Match{{Key: rules.KeyClientIP, CIDR: []netip.Prefix{pre}, Shared: true}}, t, 0, why); ok {
			out.Rules = append(out.Rules, r)
		}
	}
	for _, ip := range slices.Sorted(maps.Keys(p.clients)) {
		if flagged[contentNet(ip, c.o.IPv4Prefix, c.o.IPv6Prefix)] {
			continue
		}
		t := p.clients[ip]
		total := p.totals.Estimate(sketch.Hash64(ip))
		why := c.judge(t, total, 0, floor)
		if why == "" {
			continue
		}
		flagged[ip] = true
		if r, ok := c.rule(w, "client_ip "+ip, []rules.Match{{Key: rules.KeyClientIP, Value: ip}}, t, total, why); ok {
			out.Rules = append(out.Rules, r)
		}
	}
	for _, ua := range slices.Sorted(maps.Keys(p.agents)) {
		if r, ok := c.agentRule(w, p, ua, flagged); ok {
			out.Rules = append(out.Rules, r)
		}
	}
	c.active.expire(w.End)
	c.rotations.expire(w.End.Add(-c.o.RotationMemory))
	return out
}

// rotationMemory remembers, per group (JA4 and ASN), the networks it
// probed from and the end of the last window it did in each. The zero
// value is not usable: make it.
type rotationMemory map[string]map[string]time.Time

// expire forgets the networks last seen before t, and the groups left
// with none.
func (m rotationMemory) expire(t time.Time) {
	for g, nets := range m {
		for n, at := range nets {
			if at.Before(t) {
				delete(nets, n)
			}
		}
		if len(nets) == 0 {
			delete(m, g)
		}
	}
}

// maxRotationGroups bounds the groups a rotation memory keeps.
const maxRotationGroups = 4096

// rotationRule judges a group: a JA4 in one ASN whose probes came from
// RotationNetworks or more networks within RotationMemory (this window's
// and those remembered), and whose requests in the window are at least
// NetShare what flags it (a TLS client people share in that ASN is never
// mostly failing), is a prober rotating its addresses: one rule on the
// JA4 and the ASN, which it keeps when it moves.
func (c *Content) rotationRule(w stage.Window, p *contentPartial, g string) (rules.Rule, bool) {
	t := p.groups[g]
	if len(t.ips) == 0 {
		return rules.Rule{}, false // no probe this window
	}
	seen := c.rotations[g]
	if seen == nil {
		if len(c.rotations) >= maxRotationGroups {
			return rules.Rule{}, false
		}
		seen = map[string]time.Time{}
		c.rotations[g] = seen
	}
	for _, n := range t.ips {
		if len(seen) < maxContentSet || !seen[n].IsZero() {
			seen[n] = w.End
		}
	}
	if len(seen) < c.o.RotationNetworks {
		return rules.Rule{}, false
	}
	total := p.totals.Estimate(groupTotalKey(g))
	if float64(t.bad()) < c.o.NetShare*float64(total) {
		return rules.Rule{}, false // people send it too
	}
	ja4, asn, _ := strings.Cut(g, "\x00")
	why := fmt.Sprintf("probes from %d networks in %v with one TLS client (JA4) in AS%s, %d of its %d requests in the window probes or 4xx",
		len(seen), c.o.RotationMemory, asn, t.bad(), total)
	r, ok := c.rule(w, "rotation "+ja4+" AS"+asn, []rules.Match{{Key: rules.KeyJA4, Value: ja4}, {Key: rules.KeyASN, Value: asn}}, t, total, why)
	if ok {
		nets := slices.Sorted(maps.Keys(seen))
		if len(nets) > 8 {
			nets = nets[:8]
		}
		r.Evidence["networks"] = strings.Join(nets, " ")
		r.Evidence["rotating_networks"] = strconv.Itoa(len(seen))
	}
	return r, ok
}

// agentRule judges a user agent's tally (see AgentAddresses) and builds the
// rule on its probing addresses that no network or client rule of the
// window names.
func (c *Content) agentRule(w stage.Window, p *contentPartial, ua string, flagged map[string]bool) (rules.Rule, bool) {
	t := p.agents[ua]
	n := c.o.AgentAddresses
	probes := t.bad() - min(t.bad(), t.logins)
	if len(t.hitAddrs) < n || probes < uint64(n) {
		return rules.Rule{}, false
	}
	total := p.totals.Estimate(agentTotalKey(ua))
	if float64(t.bad()) < c.o.NetShare*float64(total) {
		return rules.Rule{}, false // people send it too
	}
	var cidr []netip.Prefix
	for _, ip := range t.ips {
		if flagged[ip] || flagged[contentNet(ip, c.o.IPv4Prefix, c.o.IPv6Prefix)] {
			continue
		}
		pre, err := netip.ParsePrefix(ip)
		if err != nil {
			a, err := netip.ParseAddr(ip)
			if err != nil {
				continue
			}
			a = a.Unmap()
			pre = netip.PrefixFrom(a, a.BitLen())
		}
		cidr = append(cidr, pre.Masked())
	}
	if len(cidr) < n {
		return rules.Rule{}, false
	}
	why := fmt.Sprintf("%d probes or refused requests from %.0f addresses with one user agent, %d of its %d requests 4xx", probes, distinctAddrs(t.hitAddrs), t.errors, total)
	r, ok := c.rule(w, "user agent "+ua, []rules.Match{{Key: rules.KeyClientIP, CIDR: cidr, Shared: true}}, t, total, why)
	if ok {
		r.Evidence["user_agent"] = strconv.Quote(ua)
		r.Evidence["probing_addresses"] = strconv.Itoa(len(t.hitAddrs))
	}
	return r, ok
}

// judge says why a scope's tally is probing, or "" if it is not; total is
// a client's requests in the window (0 for a network: the 4xx share is not
// judged on networks, whose clients are unrelated); addrs a network's
// distinct addresses (0 for a client): a network's failed logins count
// only at NetLoginsPerAddress or more an address, as a credential stuffer
// renting a block of servers sends them. A botnet's residential addresses
// fail a login or two each, beside the people of their /24, and are judged
// where they stand out (their JA4, their ASN). An exploit payload or a
// request for a secret (the sensitive list, a dotfile the CRS restricts)
// flags at MinExploits; other probe paths at floor distinct ones
// (siteFloor).
func (c *Content) judge(t *contentTally, total uint64, addrs float64, floor int) string {
	var why []string
	if n := t.strong(); n >= uint64(c.o.MinExploits) {
		s := fmt.Sprintf("%d unambiguous probe%s (an exploit, a known exploit's URI, a secret, a CMS or admin path the site refused)", n, plural(n))
		if len(t.crs) > 0 {
			s += fmt.Sprintf(" (CRS %s)", crsFamily(uint32(t.crs[0])))
		}
		why = append(why, s)
	} else if n := len(t.hitPaths); n >= floor {
		why = append(why, fmt.Sprintf("%d distinct probe paths", n))
	}
	minReq, minPaths := c.o.MinErrorRequests, c.o.MinErrorPaths
	if total >= uint64(minReq) && len(t.errPaths) >= minPaths &&
		float64(t.errors) >= c.o.ErrorShare*float64(total) {
		why = append(why, fmt.Sprintf("%d of %d answers 4xx over %d+ paths", t.errors, total, len(t.errPaths)))
	}
	if t.logins >= uint64(c.o.MinLogins) && float64(t.logins) >= c.o.NetLoginsPerAddress*addrs {
		why = append(why, fmt.Sprintf("%d failed logins", t.logins))
	}
	if t.scanner > 0 && t.scanner+t.hitCount()+t.logins >= uint64(c.o.MinScanner) {
		why = append(why, fmt.Sprintf("%d requests with a scanner's user agent", t.scanner))
	}
	return strings.Join(why, ", ")
}

// rule builds a scope's rule, or reports false while its last one is fresh.
func (c *Content) rule(w stage.Window, scope string, m []rules.Match, t *contentTally, total uint64, why string) (rules.Rule, bool) {
	// Fresh, or emitted within this window (by a shorter window, on part
	// of the same evidence).
	// A window longer than TTL gives its rules its own length; exp - TTL
	// is then later than their emission, which only errs towards quiet.
	ttl := max(c.o.TTL, c.window)
	if exp, ok := c.active[scope]; ok && (c.active.fresh(scope, w.End, ttl) || !exp.Add(-c.o.TTL).Before(w.Start)) {
		return rules.Rule{}, false
	}
	ev := map[string]string{
		"signal":        "content",
		"failed_logins": strconv.FormatUint(t.logins, 10),
		"client_errors": strconv.FormatUint(t.errors, 10),
		"error_paths":   strconv.Itoa(len(t.errPaths)),
		"probe_paths":   strconv.Itoa(len(t.hitPaths)),
		"scanner_ua":    strconv.FormatUint(t.scanner, 10),
	}
	for i, n := range t.hits {
		ev[contentNames[i]] = strconv.FormatUint(n, 10)
	}
	if total > 0 {
		ev["requests"] = strconv.FormatUint(total, 10)
	}
	if len(t.addrs) > 0 {
		ev["addresses"] = strconv.Itoa(len(t.addrs))
	}
	ex := t.examples
	if len(ex) == 0 {
		ex = t.others
	}
	q := make([]string, len(ex))
	for i, s := range ex {
		q[i] = strconv.Quote(s)
	}
	ev["examples"] = strings.Join(q, " ")
	if len(t.crs) > 0 {
		ids := make([]string, len(t.crs))
		for i, id := range t.crs {
			ids[i] = strconv.FormatUint(id, 10)
		}
		ev["crs_rules"] = strings.Join(ids, " ")
		ev["crs_version"] = CRSVersion()
	}
	r := dynamicRule(w, ttl, c.o.Enforce, rules.Rule{
		ID:       "dyn-ct-" + strconv.FormatUint(sketch.Hash64("content|"+scope), 16),
		Match:    m,
		Limit:    c.o.Limit,
		Period:   c.window,
		Origin:   "detector/content",
		Reason:   fmt.Sprintf("%s in the %s window from %s: %s", scope, c.window, w.Start.UTC().Format(time.RFC3339), why),
		Evidence: ev,
	})
	c.active[scope] = r.ExpiresAt
	return r, true
}

// MarshalState encodes the scopes whose rules are fresh (cool-down, shared
// by the signal's windows), then the rotation memory: its groups, sorted,
// each with its networks and when each was last seen (Unix ms).
func (c *Content) MarshalState() ([]byte, error) {
	b := c.active.appendTo(nil)
	b = binary.AppendUvarint(b, uint64(len(c.rotations)))
	for _, g := range slices.Sorted(maps.Keys(c.rotations)) {
		b = stage.AppendString(b, g)
		nets := c.rotations[g]
		b = binary.AppendUvarint(b, uint64(len(nets)))
		for _, n := range slices.Sorted(maps.Keys(nets)) {
			b = stage.AppendString(b, n)
			b = binary.AppendVarint(b, nets[n].UnixMilli())
		}
	}
	return b, nil
}

// UnmarshalState restores what MarshalState wrote (or a cool-down alone,
// the first format), into the cool-down and rotation memory the signal's
// windows share (the later time of a scope or network wins).
func (c *Content) UnmarshalState(b []byte) error {
	r := stage.NewStateReader(b)
	a := readCoolDown(r)
	rot := rotationMemory{}
	if r.More() {
		for range r.Count(2) {
			g := r.String()
			nets := map[string]time.Time{}
			for range r.Count(2) {
				n := r.String()
				nets[n] = time.UnixMilli(r.Varint())
			}
			if len(nets) > maxContentSet || len(rot) >= maxRotationGroups {
				return fmt.Errorf("detector: content state: rotation memory over its bounds")
			}
			rot[g] = nets
		}
	}
	if err := r.Done(); err != nil {
		return fmt.Errorf("detector: content state: %w", err)
	}
	c.active.merge(a)
	for g, nets := range rot {
		if c.rotations[g] == nil {
			c.rotations[g] = map[string]time.Time{}
		}
		for n, at := range nets {
			if at.After(c.rotations[g][n]) {
				c.rotations[g][n] = at
			}
		}
	}
	return nil
}

// plural is "s" unless n is 1.
func plural(n uint64) string {
	if n == 1 {
		return ""
	}
	return "s"
}
