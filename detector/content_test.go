package detector

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/sketch"
)

func contentRec(ip, method, path string, status uint32, ua string, at time.Duration) *decisionpb.Decision {
	return &decisionpb.Decision{Version: 1, EventTimeMs: t0.Add(at).UnixMilli(), Outcome: decisionpb.Outcome_OUTCOME_ALLOWED,
		Status: status, UserAgent: ua, Descriptors: &decisionpb.Descriptors{ClientIp: ip, Method: method, Path: path}}
}

// contentRules runs recs, in event-time order, through the content
// signal's stages over 4 partitions and returns the rules.
func contentRules(t *testing.T, recs []*decisionpb.Decision) []rules.Rule {
	t.Helper()
	ct := must(NewContent(ContentOptions{}))
	var st []stage.Stage
	for _, c := range ct {
		st = append(st, c)
	}
	l := stage.NewLocal(st, 4, 5*time.Second)
	slices.SortStableFunc(recs, func(a, b *decisionpb.Decision) int { return cmp.Compare(a.EventTimeMs, b.EventTimeMs) })
	for i, d := range recs {
		l.Observe(int(sketch.Hash64(fmt.Sprint(i))%4), d)
	}
	out := l.Advance(t0.Add(time.Hour)).Rules
	if l.Errors() > 0 || l.Bad() > 0 || l.Late() > 0 {
		t.Fatalf("%v", l)
	}
	for _, r := range out {
		if err := r.Validate(); err != nil {
			t.Errorf("rule %s invalid: %v", r.ID, err)
		}
	}
	return out
}

func scopes(rs []rules.Rule) map[string]string {
	m := map[string]string{}
	for _, r := range rs {
		v := r.Match[0].Value
		if len(r.Match[0].CIDR) > 0 {
			v = r.Match[0].CIDR[0].String()
		}
		m[v] = r.Reason
	}
	return m
}

// A scanner at 0.5 requests a second (probe paths, a scanner user agent),
// a WordPress brute force answered 200, a prober rotating through a /24,
// one request for the WordPress login page on a site that refuses it, and
// one SQL injection each draw a rule within the first minute; benign
// clients (favicon, robots.txt, missing images and pages, one login page
// the site serves) and a crawler following stale links to restricted
// files draw none.
func TestContentFlagsProbersNotBrowsers(t *testing.T) {
	var recs []*decisionpb.Decision
	probe := []string{"/.env", "/.git/config", "/wp-config.php.bak", "/backup.zip", "/phpmyadmin/index.php", "/../../etc/passwd"}
	for i, p := range probe { // one every 2 s
		recs = append(recs, contentRec("198.51.100.7", "GET", p, 404, "Mozilla/5.0", time.Duration(i)*2*time.Second))
	}
	for i := range 6 {
		recs = append(recs, contentRec("203.0.113.9", "POST", "/wp-login.php", 200, "Mozilla/5.0", time.Duration(i)*3*time.Second))
	}
	for i, p := range []string{"/.env", "/api/.env", "/backups/db.sql"} { // one address each
		recs = append(recs, contentRec(fmt.Sprintf("192.0.2.%d", 10+i), "HEAD", p, 404, "-", time.Duration(i)*5*time.Second))
	}
	recs = append(recs, contentRec("2001:db8:1::/64", "GET", "/", 200, "sqlmap/1.7", 0), contentRec("2001:db8:1::/64", "GET", "/?id=1'", 500, "sqlmap/1.7", time.Second))
	recs = append(recs, contentRec("198.18.0.20", "GET", "/wp-login.php?action=register", 404, "Mozilla/5.0", 0),
		contentRec("198.19.0.21", "GET", "/news/?id=1%20and%201=2%20union%20select%20password%20from%20admin", 404, "Mozilla/5.0", 0))
	for c := range 50 { // browsers
		ip := fmt.Sprintf("10.1.%d.%d", c/10, c)
		for i, p := range []string{"/", "/favicon.ico", "/robots.txt", "/login", "/missing.png", "/old-page", "/style.css", "/apple-touch-icon.png"} {
			st := uint32(200)
			if i >= 4 {
				st = 404
			}
			recs = append(recs, contentRec(ip, "GET", p, st, "Mozilla/5.0", time.Duration(c+i)*time.Second))
		}
	}
	for i := range 6 { // AhrefsBot's stale links to a log archive the site rotated
		recs = append(recs, contentRec(fmt.Sprintf("54.36.148.%d", i), "GET", fmt.Sprintf("/self.logs/error.log.2016-0%d-01.gz", i+1), 404,
			"Mozilla/5.0 (compatible; AhrefsBot/5.2; +http://ahrefs.com/robot/)", time.Duration(i)*time.Second))
	}
	got := scopes(contentRules(t, recs))
	for _, want := range []string{"198.51.100.7", "203.0.113.9", "192.0.2.0/24", "2001:db8:1::/64", "198.18.0.20", "198.19.0.21"} {
		if got[want] == "" {
			t.Errorf("%s not flagged", want)
		}
		delete(got, want)
	}
	for s, why := range got {
		if strings.HasPrefix(s, "192.0.2.") {
			continue // the rotating prober's address alone in a 10 s window: flagged alone
		}
		t.Errorf("benign %s flagged: %s", s, why)
	}
}

// A residential /24 where bots fail logins beside people who browse draws
// no rule on the network (the eval's 50 000-address botnet drew 143 such
// rules, each denying the people beside it), nor does a /24 of bots that
// fail one login each (the people may come later); a /24 whose every
// request is a probe does, and so does a block of servers failing several
// logins each; a bot heavy enough on its own is still flagged.
func TestContentNetworksNeedMostlyBadTraffic(t *testing.T) {
	var recs []*decisionpb.Decision
	for i := range 6 { // bots: one failed login each per 10 s, 3 addresses
		recs = append(recs, contentRec(fmt.Sprintf("198.18.7.%d", 10+i%3), "POST", "/login", 401, "Mozilla/5.0", time.Duration(i)*10*time.Second))
	}
	for i := range 20 { // people in the same /24
		recs = append(recs, contentRec(fmt.Sprintf("198.18.7.%d", 100+i%5), "GET", "/page/"+fmt.Sprint(i), 200, "Mozilla/5.0", time.Duration(i)*3*time.Second))
	}
	for i := range 6 { // a lone bot failing 6 logins, in another mixed /24
		recs = append(recs, contentRec("198.18.8.9", "POST", "/login", 401, "Mozilla/5.0", time.Duration(i)*5*time.Second))
		recs = append(recs, contentRec("198.18.8.200", "GET", "/", 200, "Mozilla/5.0", time.Duration(i)*5*time.Second))
		recs = append(recs, contentRec("198.18.8.201", "POST", "/login", 401, "Mozilla/5.0", time.Duration(i)*50*time.Second))
	}
	for i, p := range []string{"/.env", "/backup.zip", "/.git/config", "/db.sql"} { // a prober's /24
		recs = append(recs, contentRec(fmt.Sprintf("192.0.2.%d", 10+i), "HEAD", p, 301, "-", time.Duration(i)*5*time.Second),
			contentRec(fmt.Sprintf("192.0.2.%d", 10+i), "HEAD", p, 404, "-", time.Duration(i)*5*time.Second+time.Second))
	}
	for i := range 12 { // a botnet's /24, no people: 12 addresses, one failed login each
		recs = append(recs, contentRec(fmt.Sprintf("198.18.9.%d", 10+i), "POST", "/login", 401, "Mozilla/5.0", time.Duration(i)*4*time.Second))
	}
	for i := range 12 { // a stuffer's rented block: 3 servers, 4 failed logins each
		recs = append(recs, contentRec(fmt.Sprintf("203.0.113.%d", 10+i%3), "POST", "/login", 401, "Mozilla/5.0", time.Duration(i)*4*time.Second))
	}
	got := scopes(contentRules(t, recs))
	if got["192.0.2.0/24"] == "" || got["198.18.8.9"] == "" || got["203.0.113.0/24"] == "" {
		t.Errorf("prober's /24, lone bot or stuffer's block not flagged: %v", got)
	}
	for _, s := range []string{"198.18.7.0/24", "198.18.8.0/24", "198.18.9.0/24"} {
		if why := got[s]; why != "" {
			t.Errorf("mixed network %s flagged: %s", s, why)
		}
	}
}

// A distributed prober: 5 addresses, one an 11 minutes, each asking once
// for a file of a CMS the site does not know (answered 404) and once for
// /, answered 404 too, all with one old Firefox user agent, draws one rule
// on those addresses (client_ip in 5 single-address networks, one shared
// bucket) in the hour window; no address passes any floor alone. The same
// requests with a user agent that 40 people also send (successfully) draw
// none, and a path answered 403 (a login wall) is no probe.
func TestContentDistributedProber(t *testing.T) {
	const prober = "Mozilla/5.0 (Windows NT 10.0; WOW64; rv:48.0) Gecko/20100101 Firefox/48.0"
	const browser = "Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Gecko/20100101 Firefox/120.0"
	var recs []*decisionpb.Decision
	for i := range 5 {
		ip, at := fmt.Sprintf("198.51.%d.%d", 10*i, 7+i), time.Duration(i)*11*time.Minute
		recs = append(recs, contentRec(ip, "GET", "/e/data/js/ajax.js.php", 404, prober, at), contentRec(ip, "GET", "/", 404, prober, at+time.Second))
		ip = fmt.Sprintf("192.0.2.%d", 10+i) // the browser's: refused among people
		recs = append(recs, contentRec(ip, "GET", "/e/data/js/ajax.js.php", 404, browser, at), contentRec(ip, "GET", "/", 404, browser, at+time.Second))
		ip = fmt.Sprintf("203.0.%d.9", 113+i) // a login wall
		recs = append(recs, contentRec(ip, "GET", "/wp-content/uploads/a.pdf", 403, "Lynx/2.9", at))
	}
	for c := range 40 {
		recs = append(recs, contentRec(fmt.Sprintf("10.2.%d.%d", c/10, c), "GET", "/", 200, browser, time.Duration(c)*time.Minute))
	}
	rs := contentRules(t, recs)
	if len(rs) != 1 {
		t.Fatalf("got %d rules, want 1 on the prober's addresses: %v", len(rs), scopes(rs))
	}
	r := rs[0]
	m := r.Match[0]
	if m.Key != rules.KeyClientIP || !m.Shared || len(m.CIDR) != 5 {
		t.Fatalf("rule matches %+v: want client_ip in the 5 addresses, one shared bucket", r.Match)
	}
	for i, p := range m.CIDR {
		if !p.IsSingleIP() || !strings.HasPrefix(p.String(), "198.51.") {
			t.Errorf("address %d of the rule: %v, not one of the prober's", i, p)
		}
	}
	if r.Evidence["user_agent"] != fmt.Sprintf("%q", prober) || r.Evidence["client_errors"] != "10" || r.Mode != rules.Shadow {
		t.Errorf("rule %s: mode %v, evidence %v: want shadow with the user agent and 10 refused requests", r.ID, r.Mode, r.Evidence)
	}
	if r.Period != time.Hour || r.ExpiresAt.Sub(time.UnixMilli(r.Version)) < time.Hour {
		t.Errorf("rule period %v, TTL %v: want the hour window's", r.Period, r.ExpiresAt.Sub(time.UnixMilli(r.Version)))
	}
}

// Partials merge into what one partial of all the records gives, and
// survive MarshalBinary and DecodePartial.
func TestContentPartialMergeAndRoundTrip(t *testing.T) {
	c := must(NewContent(ContentOptions{}))[0]
	all, a, b := c.NewPartial(), c.NewPartial(), c.NewPartial()
	for i := range 40 {
		d := contentRec(fmt.Sprintf("192.0.2.%d", i%5), "GET", fmt.Sprintf("/.git/%d", i), uint32(200+200*(i%2)), "nikto", time.Duration(i)*time.Second)
		all.Observe(d)
		if i%2 == 0 {
			a.Observe(d)
		} else {
			b.Observe(d)
		}
	}
	bb, err := b.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	db, err := c.DecodePartial(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Merge(db); err != nil {
		t.Fatal(err)
	}
	x, _ := a.MarshalBinary()
	y, _ := all.MarshalBinary()
	if string(x) != string(y) {
		t.Errorf("merged partials differ from one partial of all records")
	}
	if _, err := c.DecodePartial(y[:len(y)-1]); err == nil {
		t.Error("a truncated partial decoded")
	}
}

// A window state in the first format (no format mark, no user agents, no
// n), as a consumer of the version before them checkpointed it, decodes;
// an unknown format is refused.
func TestContentReadsFirstFormat(t *testing.T) {
	c := must(NewContent(ContentOptions{}))[0]
	p := c.NewPartial().(*contentPartial)
	for i := range 4 {
		p.Observe(contentRec("192.0.2.1", "GET", fmt.Sprintf("/.git/%d", i), 404, "nikto", time.Duration(i)*time.Second))
	}
	cm, err := p.totals.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	b := binary.AppendUvarint(nil, uint64(p.k))
	b = stage.AppendBytes(b, cm)
	for _, m := range []map[string]*contentTally{p.clients, p.nets} {
		b = binary.AppendUvarint(b, uint64(len(m)))
		for k, tl := range m {
			b = stage.AppendString(b, k)
			b = appendTallyV1(b, tl)
		}
	}
	got, err := c.DecodePartial(b)
	if err != nil {
		t.Fatal(err)
	}
	q := got.(*contentPartial)
	if tl := q.clients["192.0.2.1"]; tl == nil || tl.n != 0 || tl.bad() != 4 || len(q.agents) != 0 {
		t.Errorf("first-format state decoded as %+v, agents %v: want the client's 4 hits and no user agents", tl, q.agents)
	}
	v4 := binary.AppendUvarint(binary.AppendUvarint(nil, 0), 4)
	if _, err := c.DecodePartial(append(v4, b...)); err == nil || !strings.Contains(err.Error(), "format 4") {
		t.Errorf("format 4 decoded: %v", err)
	}
}

// appendTallyV1 encodes a client or network tally as the first format did:
// no n, the five list categories, the three hash sets and the two example
// lists.
func appendTallyV1(b []byte, t *contentTally) []byte {
	for _, n := range t.hits[:catExploit] {
		b = binary.AppendUvarint(b, n)
	}
	b = binary.AppendUvarint(b, t.errors)
	b = binary.AppendUvarint(b, t.logins)
	b = binary.AppendUvarint(b, t.scanner)
	for _, set := range [][]uint64{t.hitPaths, t.errPaths, t.addrs} {
		b = binary.AppendUvarint(b, uint64(len(set)))
		for _, h := range set {
			b = binary.AppendUvarint(b, h)
		}
	}
	for _, set := range [][]string{t.examples, t.others} {
		b = binary.AppendUvarint(b, uint64(len(set)))
		for _, s := range set {
			b = stage.AppendString(b, s)
		}
	}
	return b
}

func FuzzContentPartial(f *testing.F) {
	fuzzPartial(f, must(NewContent(ContentOptions{K: 4}))[0], contentRec("192.0.2.1", "POST", "/wp-login.php?x=../", 401, "nikto", 0))
}

// Bad options and bad list files are refused with errors that name them
// (the file and line for a list).
func TestContentRefusesBadOptions(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		d := filepath.Join(dir, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range strings.Split(text, "|") {
			n, body, _ := strings.Cut(f, "=")
			if err := os.WriteFile(filepath.Join(d, n), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	for _, tc := range []struct {
		o    ContentOptions
		want string
	}{
		{ContentOptions{Windows: []time.Duration{time.Minute, 2 * time.Hour}}, "Window 2h0m0s"},
		{ContentOptions{ErrorShare: 1.5}, "ErrorShare 1.5"},
		{ContentOptions{MinHits: 100}, "MinHits 100"},
		{ContentOptions{IPv4Prefix: 40}, "IPv4Prefix 40"},
		{ContentOptions{AgentAddresses: 17}, "AgentAddresses 17"},
		{ContentOptions{AgentAddresses: -1}, "AgentAddresses -1"},
		{ContentOptions{Lists: filepath.Join(dir, "absent")}, "absent"},
		{ContentOptions{Lists: write("a", "sensitive.txt=# ok\n*/.env\n\n.git\n")}, "sensitive.txt:4"},
		{ContentOptions{Lists: write("b", "scanners.txt=*\n")}, "scanners.txt:1"},
		{ContentOptions{Lists: write("c", "senstive.txt=*/.env\n")}, "senstive.txt: not a list"},
		{ContentOptions{Lists: write("e", "ADMIN.TXT=*/admin\n")}, "ADMIN.TXT: not a list"},
		{ContentOptions{Lists: func() string {
			d := write("f", "README=lists\n")
			if err := os.Mkdir(filepath.Join(d, "admin.txt"), 0o755); err != nil {
				t.Fatal(err)
			}
			return d
		}()}, "admin.txt is a directory"},
	} {
		_, err := NewContent(tc.o)
		if !errors.Is(err, ErrBadOptions) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one naming %q", tc.o, err, tc.want)
		}
	}
	// A replaced list replaces the default of its category only.
	l, err := LoadContentLists(write("d", "scanners.txt=*mytool*\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !l.match(catScanner, "mytool/1.0") || l.match(catScanner, "sqlmap/1.7") || !l.match(catSensitive, "/.bash_history") {
		t.Error("scanners.txt did not replace the default scanner list alone")
	}
}

// The shipped defaults (the CRS through Signatures, and sluice's lists)
// against CrowdSec's lists (../shared/data/signatures, read at test time,
// not shipped): the share of CrowdSec's entries that the content signal
// counts as a probe (a path answered 404, a user agent on /), per file.
// CrowdSec's are long tails (580 user-agent tokens, 200 web-shell names),
// so a low share is expected there; the floors guard the common cases.
func TestContentDefaultListsAgainstCrowdSec(t *testing.T) {
	dir := filepath.Join("..", "..", "shared", "data", "signatures")
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("no CrowdSec signatures at %s (../shared/data): %v", dir, err)
	}
	c := must(NewContent(ContentOptions{}))[0]
	probe := func(path, ua string, status uint32) bool {
		p := c.NewPartial().(*contentPartial)
		p.Observe(contentRec("192.0.2.1", "GET", path, status, ua, 0))
		tl := p.clients["192.0.2.1"]
		return tl != nil && (tl.hitCount() > 0 || tl.scanner > 0)
	}
	anyPath := func(s string) bool { return probe(s, "Mozilla/5.0", 404) || probe(s+"/", "Mozilla/5.0", 404) }
	for _, tc := range []struct {
		file  string
		as    func(entry string) bool
		floor float64
	}{
		{"sensitive_data.txt", func(e string) bool { return anyPath("/x/backup"+e) || anyPath("/"+e) }, 0.4},
		{"admin_interfaces.txt", func(e string) bool { return anyPath(e) || anyPath(e+"/index.php") }, 0.3},
		{"backdoors.txt", func(e string) bool { return anyPath("/" + e) }, 0.02},
		{"bad_user_agents.txt", func(e string) bool {
			return probe("/", "Mozilla/5.0 ("+strings.ReplaceAll(e, `\ `, " ")+")", 200)
		}, 0.03},
		{"trendy_cves_uris.json", func(e string) bool {
			var v struct{ URI string }
			if json.Unmarshal([]byte(e), &v) != nil {
				return false
			}
			u := v.URI
			if !strings.HasPrefix(u, "/") {
				u = "/x" + u
			}
			return anyPath(u)
		}, 0.6},
	} {
		f, err := os.Open(filepath.Join(dir, tc.file))
		if err != nil {
			t.Errorf("%s: %v", tc.file, err)
			continue
		}
		n, hit := 0, 0
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			e := strings.TrimSpace(sc.Text())
			if e == "" || e[0] == '#' {
				continue
			}
			n++
			if tc.as(e) {
				hit++
			}
		}
		f.Close()
		share := float64(hit) / float64(max(n, 1))
		t.Logf("%s: our default matches %d of %d entries (%.0f%%)", tc.file, hit, n, 100*share)
		if share < tc.floor {
			t.Errorf("%s: %.0f%% matched, want at least %.0f%%", tc.file, 100*share, 100*tc.floor)
		}
	}
}
