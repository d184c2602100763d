package detector

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/cespare/xxhash/v2"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/detector/enrich"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/sketch"
)

// Crawler is a crawler operator's crawler: the user-agent tokens it
// announces, the name of its operator's published ranges, and the
// autonomous systems its verified addresses come from.
type Crawler struct {
	Name  string // e.g. "Googlebot"
	Token string // matched case-insensitively as a token (enrich.HasToken)
	// Tokens are more user-agent tokens of the same operator's crawlers
	// ("adsbot-google"), matched like Token.
	Tokens []string
	// Operator names the operator's ranges in FakeCrawlerOptions.Ranges
	// (files <operator>-*.txt): "googlebot". Optional.
	Operator string
	ASNs     []uint32 // the operator's networks; optional with an Operator
}

// DefaultCrawlers are the major search and AI crawlers, with the names of
// their operators' published ranges (googlebot.json, bingbot.json,
// gptbot.json, ...) and the ASNs those ranges lie in (Google: AS15169; Bing:
// Microsoft's AS8075; Applebot: AS714; Yandex: AS13238; Baidu: AS55967 and
// AS38365; DuckDuckGo: Microsoft's AS8075). OpenAI's crawlers run in
// several clouds, so they are judged only against loaded ranges.
var DefaultCrawlers = []Crawler{
	{Name: "Googlebot", Token: "googlebot", Tokens: []string{"adsbot-google", "mediapartners-google", "google-inspectiontool"},
		Operator: "googlebot", ASNs: []uint32{15169}},
	{Name: "bingbot", Token: "bingbot", Tokens: []string{"bingpreview", "adidxbot"}, Operator: "bingbot", ASNs: []uint32{8075}},
	{Name: "Applebot", Token: "applebot", Operator: "applebot", ASNs: []uint32{714}},
	{Name: "YandexBot", Token: "yandexbot", Operator: "yandex", ASNs: []uint32{13238}},
	{Name: "Baiduspider", Token: "baiduspider", Operator: "baidu", ASNs: []uint32{55967, 38365}},
	{Name: "DuckDuckBot", Token: "duckduckbot", Operator: "duckduckbot", ASNs: []uint32{8075}},
	{Name: "GPTBot", Token: "gptbot", Tokens: []string{"oai-searchbot", "chatgpt-user"}, Operator: "openai"},
}

// FakeCrawlerOptions configure the fake-crawler signal.
type FakeCrawlerOptions struct {
	// Window is the event-time window. Default 1 min.
	Window time.Duration
	// Crawlers to check; default DefaultCrawlers.
	Crawlers []Crawler
	// MinRequests from one address claiming a crawler outside its
	// operator's networks make a rule. Default 3.
	MinRequests uint64
	// Ranges are the operators' published crawler ranges (see
	// enrich.LoadCrawlerRanges); nil: none, judge by ASN only. An address
	// inside its claimed operator's ranges is a verified crawler and never
	// judged; one outside them is judged without needing an ASN.
	Ranges *enrich.CrawlerRanges
	// MinRangeRequests from one address outside its claimed operator's
	// ranges make a rule. Default 2: a lone spoofed request is noise, two
	// in a window are a repeated false claim (docs/detector.md).
	MinRangeRequests uint64
	// Holdings, when set, knows the address space of each crawler's
	// ASNs (an iptoasn file: enrich.ASNDB); a claim from outside every
	// one of its operator's ASNs' ranges is false however unknown the
	// client's own network (basis "h"). Published ranges, when loaded for
	// the address, come first. ASN holdings change far more slowly than
	// the operators' published crawler lists, which a log years old may
	// not match (docs/detector.md).
	Holdings ASNHoldings
	// MinHoldingRequests from one address outside its claimed operator's
	// ASNs' space make a rule. Default 1: the claim is refuted by the
	// operator's own address space, as one exploit payload is enough.
	MinHoldingRequests uint64
	// TTL of an emitted rule (and its cool-down, half of it). Default 1 h.
	TTL time.Duration
	// Limit of an emitted rule, requests per Window. Default 1.
	Limit int64
	// Enforce emits rules in enforce mode; default shadow.
	Enforce bool
}

// ASNHoldings says whether an autonomous system's address space is known
// for an address's family and holds it (*enrich.ASNDB).
type ASNHoldings interface {
	Holds(asn uint32, ip netip.Addr) (known, holds bool)
}

// FakeCrawlers flags addresses whose user agent claims a known crawler
// while the address is not its operator's: a scraper hiding behind a name
// sites let through. When Ranges has the operator's ranges for the
// address's family, the address is judged by them (inside: verified, never
// judged); otherwise by ASN, and a record with an unknown ASN (0) is not
// judged. Per window it counts (crawler, basis, ASN, address) tuples with a
// Space-Saving top-k of 256.
//
// FakeCrawlers is a stage.Stage and Checkpointer, not safe for concurrent
// use. Build it with NewFakeCrawlers.
type FakeCrawlers struct {
	o      FakeCrawlerOptions
	tokens [][]string // lower-case, per crawler
	ok     []map[uint32]bool
	active coolDown
}

// NewFakeCrawlers returns the signal with o's zero fields defaulted, or an
// error wrapping ErrBadOptions (a crawler without a name, a token, or an
// ASN or operator among them).
func NewFakeCrawlers(o FakeCrawlerOptions) (*FakeCrawlers, error) {
	orDefault(&o.Window, time.Minute)
	if o.Crawlers == nil {
		o.Crawlers = DefaultCrawlers
	}
	orDefault(&o.MinRequests, 3)
	orDefault(&o.MinRangeRequests, 2)
	orDefault(&o.MinHoldingRequests, 1)
	orDefault(&o.TTL, time.Hour)
	orDefault(&o.Limit, 1)
	c := optCheck{signal: "fake crawlers"}
	c.window(o.Window)
	c.ttl(o.TTL, o.Window)
	c.limit("Limit", o.Limit)
	named := map[string]bool{}
	for i, cr := range o.Crawlers {
		if strings.TrimSpace(cr.Name) == "" || strings.TrimSpace(cr.Token) == "" || len(cr.ASNs) == 0 && cr.Operator == "" {
			c.fail("crawler %d (%q): want a name, a token and at least one ASN or an operator", i, cr.Name)
		}
		if cr.Operator != "" {
			named[strings.ToLower(cr.Operator)] = true
		}
	}
	// Ranges no crawler names verify nothing: a misspelt file name
	// (googelbot-ipv4.txt) would leave the claims it meant unverified.
	for _, op := range o.Ranges.Operators() {
		if !named[op] {
			c.fail("Ranges of operator %q, which no crawler names (want one of %v: the file name's part before the first '-')", op, slices.Sorted(maps.Keys(named)))
		}
	}
	if err := c.err(); err != nil {
		return nil, err
	}
	f := &FakeCrawlers{o: o, active: coolDown{}}
	for _, c := range o.Crawlers {
		toks := []string{strings.ToLower(c.Token)}
		for _, t := range c.Tokens {
			toks = append(toks, strings.ToLower(t))
		}
		f.tokens = append(f.tokens, toks)
		ok := map[uint32]bool{}
		for _, a := range c.ASNs {
			ok[a] = true
		}
		f.ok = append(f.ok, ok)
	}
	return f, nil
}

// Name is the stage's name in the pipeline.
func (f *FakeCrawlers) Name() string { return "fake-crawlers" }

// Window is the event-time window the signal counts in.
func (f *FakeCrawlers) Window() time.Duration { return f.o.Window }

type crawlerPartial struct {
	f   *FakeCrawlers
	top *sketch.TopK
	buf []byte
}

// NewPartial returns an empty window state.
func (f *FakeCrawlers) NewPartial() stage.Partial {
	return &crawlerPartial{f: f, top: sketch.NewTopK(256)}
}

// Observe counts a record whose user agent claims a crawler from an
// address outside its operator's ranges, or, without ranges for the
// address, from a known ASN not the operator's.
func (p *crawlerPartial) Observe(d *decisionpb.Decision) {
	x := d.GetDescriptors()
	asn, ip := x.GetAsn(), x.GetClientIp()
	ua := d.GetUserAgent()
	if ip == "" || ua == "" {
		return
	}
	f := p.f
	for i := range f.tokens {
		if !claims(ua, f.tokens[i]) {
			continue
		}
		c := &f.o.Crawlers[i]
		basis := byte('a')
		addr, err := netip.ParseAddr(ip)
		switch {
		case err == nil && c.Operator != "" && f.o.Ranges.Has(c.Operator, addr):
			if f.o.Ranges.Contains(c.Operator, addr) {
				return // verified
			}
			basis = 'r'
		case len(c.ASNs) == 0 || f.ok[i][asn]:
			return
		case err == nil && f.o.Holdings != nil && f.holdings(c, addr) != 0:
			if f.holdings(c, addr) > 0 {
				return // in its operator's space
			}
			basis = 'h'
		case asn == 0:
			return
		}
		p.buf = append(append(p.buf[:0], c.Name...), 0, basis, 0)
		p.buf = strconv.AppendUint(p.buf, uint64(asn), 10)
		p.buf = append(append(p.buf, 0), ip...)
		p.top.AddHash(xxhash.Sum64(p.buf), unsafe.String(unsafe.SliceData(p.buf), len(p.buf)), 1)
		return
	}
}

// sharedSpace is RFC 6598's shared address space of carrier-grade NATs.
var sharedSpace = netip.MustParsePrefix("100.64.0.0/10")

// holdings is 1 when one of c's ASNs holds addr, -1 when the holdings
// know the space of every one of them in addr's family and none holds it,
// 0 when they cannot tell.
func (f *FakeCrawlers) holdings(c *Crawler, addr netip.Addr) int {
	if addr = addr.Unmap(); !addr.IsGlobalUnicast() || addr.IsPrivate() || sharedSpace.Contains(addr) {
		// A private, shared (carrier-grade NAT) or local address is no
		// autonomous system's: behind a proxy, the client is unknown.
		return 0
	}
	all := true
	for _, a := range c.ASNs {
		known, holds := f.o.Holdings.Holds(a, addr)
		if holds {
			return 1
		}
		all = all && known
	}
	if all {
		return -1
	}
	return 0
}

// Verified reports whether d's user agent claims a crawler whose
// operator's loaded ranges hold d's client address: a verified crawler,
// which the heavy-hitter and entropy signals leave out (Signals wires it)
// so that it never draws a rule at its normal rates. False without ranges.
func (f *FakeCrawlers) Verified(d *decisionpb.Decision) bool {
	if f.o.Ranges == nil {
		return false
	}
	ua := d.GetUserAgent()
	if ua == "" {
		return false
	}
	for i := range f.tokens {
		if !claims(ua, f.tokens[i]) {
			continue
		}
		c := &f.o.Crawlers[i]
		addr, err := netip.ParseAddr(d.GetDescriptors().GetClientIp())
		return err == nil && c.Operator != "" && f.o.Ranges.Contains(c.Operator, addr)
	}
	return false
}

// claims reports whether ua has any of tokens as a token.
func claims(ua string, tokens []string) bool {
	for _, t := range tokens {
		if enrich.HasToken(ua, t) {
			return true
		}
	}
	return false
}

// Merge folds in another partition's counts.
func (p *crawlerPartial) Merge(o stage.Partial) error {
	x, ok := o.(*crawlerPartial)
	if !ok {
		return fmt.Errorf("detector: fake crawlers cannot merge a %T", o)
	}
	p.top.Merge(x.top)
	return nil
}

// MarshalBinary encodes the top-k.
func (p *crawlerPartial) MarshalBinary() ([]byte, error) { return p.top.MarshalBinary() }

// DecodePartial decodes what a partial's MarshalBinary wrote.
func (f *FakeCrawlers) DecodePartial(b []byte) (stage.Partial, error) {
	p := &crawlerPartial{f: f, top: new(sketch.TopK)}
	if err := p.top.UnmarshalBinary(b); err != nil {
		return nil, fmt.Errorf("detector: fake-crawler window state: %w", err)
	}
	return p, nil
}

// Finish returns a rule for each address that claimed a crawler from
// outside its operator's ranges at least MinRangeRequests times, or from
// outside its operator's networks at least MinRequests times.
func (f *FakeCrawlers) Finish(w stage.Window, merged stage.Partial) stage.Output {
	p, ok := merged.(*crawlerPartial)
	if !ok {
		return stage.Output{}
	}
	floor := min(f.o.MinRequests, f.o.MinRangeRequests, f.o.MinHoldingRequests)
	var out stage.Output
	for _, it := range p.top.List() {
		n := it.Count - it.Err
		if n < floor {
			break // sorted by count
		}
		parts := strings.Split(it.Key, "\x00")
		if len(parts) == 3 { // a checkpoint from before ranges: name, ASN, address
			parts = []string{parts[0], "a", parts[1], parts[2]}
		}
		if len(parts) != 4 {
			continue
		}
		name, basis, asn, ip := parts[0], parts[1], parts[2], parts[3]
		if basis == "a" && n < f.o.MinRequests || basis == "r" && n < f.o.MinRangeRequests || basis == "h" && n < f.o.MinHoldingRequests {
			continue
		}
		if f.active.fresh(ip, w.End, f.o.TTL) {
			continue
		}
		ev := map[string]string{
			"signal":      "fake-crawler",
			"crawler":     name,
			"client_ip":   ip,
			"count":       strconv.FormatUint(it.Count, 10),
			"count_error": strconv.FormatUint(it.Err, 10),
		}
		if asn != "0" {
			ev["asn"] = asn
		}
		var why string
		if basis == "r" {
			op := f.operator(name)
			addr, _ := netip.ParseAddr(ip)
			files := strings.Join(f.o.Ranges.Files(op, addr), ",")
			ev["operator"], ev["ranges_file"], ev["in_ranges"] = op, files, "false"
			why = fmt.Sprintf("which is outside %s's published ranges (%s)", op, files)
		} else if basis == "h" {
			c := f.crawler(name)
			ev["operator_asns"], ev["in_asn_space"] = asnList(c.ASNs), "false"
			why = fmt.Sprintf("which is outside the address space of %s's autonomous systems (%s)", name, asnList(c.ASNs))
		} else {
			why = fmt.Sprintf("from AS%s, which is not %s's", asn, name)
		}
		r := dynamicRule(w, f.o.TTL, f.o.Enforce, rules.Rule{
			ID:       "dyn-fc-" + strconv.FormatUint(sketch.Hash64(ip), 16),
			Match:    []rules.Match{{Key: rules.KeyClientIP, Value: ip}},
			Limit:    f.o.Limit,
			Period:   f.o.Window,
			Origin:   "detector/fake-crawler",
			Reason:   fmt.Sprintf("client_ip %s claimed to be %s %d times in the %s window from %s, %s", ip, name, it.Count, f.o.Window, w.Start.UTC().Format(time.RFC3339), why),
			Evidence: ev,
		})
		f.active[ip] = r.ExpiresAt
		out.Rules = append(out.Rules, r)
	}
	f.active.expire(w.End)
	return out
}

// operator returns the Operator of the crawler called name.
func (f *FakeCrawlers) operator(name string) string { return f.crawler(name).Operator }

// crawler returns the crawler called name (the zero Crawler for none).
func (f *FakeCrawlers) crawler(name string) Crawler {
	for _, c := range f.o.Crawlers {
		if c.Name == name {
			return c
		}
	}
	return Crawler{}
}

// asnList writes ASNs as AS15169,AS8075.
func asnList(asns []uint32) string {
	var b []string
	for _, a := range asns {
		b = append(b, "AS"+strconv.FormatUint(uint64(a), 10))
	}
	return strings.Join(b, ",")
}

// MarshalState encodes the addresses whose rules are fresh.
func (f *FakeCrawlers) MarshalState() ([]byte, error) { return f.active.appendTo(nil), nil }

// UnmarshalState restores what MarshalState wrote.
func (f *FakeCrawlers) UnmarshalState(b []byte) error {
	c, err := decodeCoolDown(b, "fake-crawler")
	if err != nil {
		return err
	}
	f.active = c
	return nil
}
