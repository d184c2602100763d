package detector

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/cespare/xxhash/v2"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/sketch"
)

// Crawler is a search engine's crawler: the user-agent token it announces
// and the autonomous systems its verified addresses come from.
type Crawler struct {
	Name  string   // e.g. "Googlebot"
	Token string   // matched case-insensitively in the user agent
	ASNs  []uint32 // the operator's networks
}

// DefaultCrawlers are the major search engines' crawlers with the ASNs
// their operators publish their crawler ranges in (Google: AS15169; Bing:
// Microsoft's AS8075; Applebot: AS714; Yandex: AS13238; Baidu: AS55967 and
// AS38365; DuckDuckGo crawls from Microsoft's AS8075).
var DefaultCrawlers = []Crawler{
	{Name: "Googlebot", Token: "googlebot", ASNs: []uint32{15169}},
	{Name: "bingbot", Token: "bingbot", ASNs: []uint32{8075}},
	{Name: "Applebot", Token: "applebot", ASNs: []uint32{714}},
	{Name: "YandexBot", Token: "yandexbot", ASNs: []uint32{13238}},
	{Name: "Baiduspider", Token: "baiduspider", ASNs: []uint32{55967, 38365}},
	{Name: "DuckDuckBot", Token: "duckduckbot", ASNs: []uint32{8075}},
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
	// TTL of an emitted rule (and its cool-down, half of it). Default 1 h.
	TTL time.Duration
	// Limit of an emitted rule, requests per Window. Default 1.
	Limit int64
	// Enforce emits rules in enforce mode; default shadow.
	Enforce bool
}

// FakeCrawlers flags addresses whose user agent claims a search engine's
// crawler while their ASN is not that operator's: a scraper hiding behind a
// name sites let through. A record with an unknown ASN (0) is not judged.
// Per window it counts (crawler, ASN, address) triples with a Space-Saving
// top-k of 256.
//
// FakeCrawlers is a stage.Stage and Checkpointer, not safe for concurrent
// use. Build it with NewFakeCrawlers.
type FakeCrawlers struct {
	o      FakeCrawlerOptions
	tokens []string // lower-case, per crawler
	ok     []map[uint32]bool
	active coolDown
}

// NewFakeCrawlers returns the signal with o's zero fields defaulted, or an
// error wrapping ErrBadOptions (a crawler without a name, token or ASN among
// them).
func NewFakeCrawlers(o FakeCrawlerOptions) (*FakeCrawlers, error) {
	orDefault(&o.Window, time.Minute)
	if o.Crawlers == nil {
		o.Crawlers = DefaultCrawlers
	}
	orDefault(&o.MinRequests, 3)
	orDefault(&o.TTL, time.Hour)
	orDefault(&o.Limit, 1)
	c := optCheck{signal: "fake crawlers"}
	c.window(o.Window)
	c.ttl(o.TTL, o.Window)
	c.limit("Limit", o.Limit)
	for i, cr := range o.Crawlers {
		if strings.TrimSpace(cr.Name) == "" || strings.TrimSpace(cr.Token) == "" || len(cr.ASNs) == 0 {
			c.fail("crawler %d (%q): want a name, a token and at least one ASN", i, cr.Name)
		}
	}
	if err := c.err(); err != nil {
		return nil, err
	}
	f := &FakeCrawlers{o: o, active: coolDown{}}
	for _, c := range o.Crawlers {
		f.tokens = append(f.tokens, strings.ToLower(c.Token))
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
	f    *FakeCrawlers
	top  *sketch.TopK
	buf  []byte
	ualc []byte
}

// NewPartial returns an empty window state.
func (f *FakeCrawlers) NewPartial() stage.Partial {
	return &crawlerPartial{f: f, top: sketch.NewTopK(256)}
}

// Observe counts a record whose user agent claims a crawler and whose ASN
// is known and not the crawler's operator's.
func (p *crawlerPartial) Observe(d *decisionpb.Decision) {
	x := d.GetDescriptors()
	asn, ip := x.GetAsn(), x.GetClientIp()
	ua := d.GetUserAgent()
	if asn == 0 || ip == "" || ua == "" {
		return
	}
	p.ualc = append(p.ualc[:0], ua...)
	for i, c := range p.ualc {
		if 'A' <= c && c <= 'Z' {
			p.ualc[i] = c + 'a' - 'A'
		}
	}
	lc := unsafe.String(unsafe.SliceData(p.ualc), len(p.ualc))
	for i, tok := range p.f.tokens {
		if !strings.Contains(lc, tok) || p.f.ok[i][asn] {
			continue
		}
		p.buf = strconv.AppendUint(append(append(p.buf[:0], p.f.o.Crawlers[i].Name...), 0), uint64(asn), 10)
		p.buf = append(append(p.buf, 0), ip...)
		p.top.AddHash(xxhash.Sum64(p.buf), unsafe.String(unsafe.SliceData(p.buf), len(p.buf)), 1)
		return
	}
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
// outside its operator's networks at least MinRequests times.
func (f *FakeCrawlers) Finish(w stage.Window, merged stage.Partial) stage.Output {
	p, ok := merged.(*crawlerPartial)
	if !ok {
		return stage.Output{}
	}
	var out stage.Output
	for _, it := range p.top.List() {
		if it.Count-it.Err < f.o.MinRequests {
			break // sorted by count
		}
		parts := strings.SplitN(it.Key, "\x00", 3)
		if len(parts) != 3 {
			continue
		}
		name, asn, ip := parts[0], parts[1], parts[2]
		if f.active.fresh(ip, w.End, f.o.TTL) {
			continue
		}
		r := dynamicRule(w, f.o.TTL, f.o.Enforce, rules.Rule{
			ID:     "dyn-fc-" + strconv.FormatUint(sketch.Hash64(ip), 16),
			Match:  []rules.Match{{Key: rules.KeyClientIP, Value: ip}},
			Limit:  f.o.Limit,
			Period: f.o.Window,
			Origin: "detector/fake-crawler",
			Reason: fmt.Sprintf("client_ip %s claimed to be %s %d times in the %s window from %s, from AS%s, which is not %s's",
				ip, name, it.Count, f.o.Window, w.Start.UTC().Format(time.RFC3339), asn, name),
			Evidence: map[string]string{
				"signal":      "fake-crawler",
				"crawler":     name,
				"asn":         asn,
				"count":       strconv.FormatUint(it.Count, 10),
				"count_error": strconv.FormatUint(it.Err, 10),
			},
		})
		f.active[ip] = r.ExpiresAt
		out.Rules = append(out.Rules, r)
	}
	f.active.expire(w.End)
	return out
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
