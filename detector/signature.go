package detector

import (
	"fmt"
	"io/fs"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	coreruleset "github.com/corazawaf/coraza-coreruleset/v4"
	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/sluice-rl/sluice/sketch"
)

// SigClass is what a request's attack signatures say about it.
type SigClass uint8

const (
	// SigNone: no signature matched, or the request needed no check.
	SigNone SigClass = iota
	// SigProbe: a request for a restricted file or extension (CRS 930130,
	// 920440: /.env, /.git/config, /db.sql, /web.config): a probe when the
	// site refuses it, the site's own content when it serves it.
	SigProbe
	// SigWeak: an exploit rule that also matches ordinary text in broken
	// links (see weakCRSRules): counted as a probe, never alone.
	SigWeak
	// SigExploit: an exploit payload (SQL injection, XSS, command or PHP
	// injection, path traversal, OS file access, remote file inclusion,
	// Java deserialisation or JNDI, protocol attacks): one request is
	// enough.
	SigExploit
)

// Verdict is one request's signature check: its class, the first CRS rule
// that made it (0 for none) and the attack family of that rule (its
// file's: "sqli", "xss", "rce", ...). Scanner reports a scanner's user
// agent (CRS 913100).
type Verdict struct {
	Class   SigClass
	Scanner bool
	Rule    uint32
}

// Family is the attack family of the verdict's rule, "" for none.
func (v Verdict) Family() string { return crsFamily(v.Rule) }

// crsFamily names a CRS rule's attack family by its file (the rule id's
// first three digits), as CRS's own tags do (attack-sqli, ...).
func crsFamily(id uint32) string {
	switch id / 1000 {
	case 0:
		return ""
	case 913:
		return "scanner"
	case 920:
		return "restricted-extension"
	case 921:
		return "protocol"
	case 930:
		if id == 930130 {
			return "restricted-file"
		}
		return "lfi"
	case 931:
		return "rfi"
	case 932:
		return "rce"
	case 933:
		return "php"
	case 934:
		return "generic"
	case 941:
		return "xss"
	case 942:
		return "sqli"
	case 943:
		return "session-fixation"
	case 944:
		return "java"
	}
	return "crs-" + strconv.FormatUint(uint64(id/1000), 10)
}

// weakCRSRules are paranoia-level-1 exploit rules that a crawler following
// a site's broken links trips (CRS's own FP reports list them among the
// noisiest): a shell expression `${...}`, a PHP variable `$x` or a word
// followed by a parenthesis in a URL are template text as often as
// payloads. On the Elastic log MJ12bot's 404s for
// `/scripts//"${WEBLOC}/view.php?file=${linkto}\"` (a page's unexpanded
// template) match 932130 and 933135, and an XRumer spam report in a path
// ("Result: ...; ReCaptcha ...; (JS);") matches 933160. They count as
// probe hits, never as one-request evidence.
var weakCRSRules = map[uint32]bool{
	932130: true, // Unix shell expression found
	933135: true, // PHP variable access found
	933160: true, // high-risk PHP function call found
}

// crsClass is the class of a matched CRS rule id, SigNone for a rule that
// is not an attack signature here: the initialisation and paranoia-level
// markers (xxx0xx), method and protocol enforcement (911, 920 but 920440,
// which judge the headers a decision record does not carry), scanner
// detection (913: Verdict.Scanner), the blocking evaluation (949) and the
// response rules.
func crsClass(id uint32) SigClass {
	switch {
	case id%1000 < 100:
		return SigNone
	case id == 920440 || id == 930130:
		return SigProbe
	case weakCRSRules[id]:
		return SigWeak
	case id/1000 == 921, id/1000 >= 930 && id/1000 <= 944:
		return SigExploit
	}
	return SigNone
}

// Signatures checks requests against the OWASP Core Rule Set (CRS): the
// rule files of github.com/corazawaf/coraza-coreruleset/v4 (Apache-2.0; the
// version go.mod names: bump it to update the rules), the request rules
// that read a request line and a user agent (crsFiles: scanner detection,
// protocol attacks, 930-942 and 944 application attacks) at paranoia
// level 1, run by a native evaluator (crs.go) that gives the verdicts the
// Coraza WAF engine gives on the same files (TestCRSNativeAgreesWithCoraza)
// at a tenth to a hundredth of the cost. The CRS is the corpus the ecosystem
// maintains for exactly this (ModSecurity, Coraza, cloud WAFs run it);
// sluice classifies its matches (SigClass) and keeps no copy of its
// patterns. Left out: what judges a request's headers, body or cookies,
// which a decision record does not carry (method and protocol enforcement,
// 911 and 920; multipart, 922; session fixation, 943), the exceptions for
// Apache's internal requests (905), the initialisation (901), the blocking
// evaluation and the response rules.
//
// Check runs the evaluator only on the requests that need it (NeedsCheck:
// a cheap scan of the target) and remembers the last verdicts (an LRU of
// CacheSize, by a hash of method, target and user agent). A verdict on a
// user agent alone (scanner detection) is cached per user agent.
//
// The zero value is not usable: build one with NewSignatures, or share
// DefaultSignatures. Safe for concurrent use.
type Signatures struct {
	crs    *crsEngine
	cache  *lru.Cache[uint64, Verdict]
	agents agentVerdicts
	// Counters: records offered to Check, those that needed a check,
	// and the checks run (cache misses).
	seen, needed, checks atomic.Uint64
}

// SignatureStats are a Signatures' counters since it was built.
type SignatureStats struct {
	// Seen counts the requests offered to Check; Needed those NeedsCheck
	// passed (the rest cost a byte scan); Checks the CRS evaluations run
	// (Needed less cache hits, plus one per new user agent).
	Seen, Needed, Checks uint64
}

// Stats returns the counters.
func (s *Signatures) Stats() SignatureStats {
	return SignatureStats{Seen: s.seen.Load(), Needed: s.needed.Load(), Checks: s.checks.Load()}
}

// DefaultCacheSize is how many verdicts a Signatures remembers.
const DefaultCacheSize = 1 << 16

// NewSignatures loads the CRS (crsFiles) from fsys, nil for the embedded
// coraza-coreruleset, and returns a Signatures remembering cacheSize
// verdicts (0: DefaultCacheSize). It errors when a rule does not load, or
// uses what the evaluator does not implement (errCRSUnsupported: a CRS
// version that needs more of it).
func NewSignatures(fsys fs.FS, cacheSize int) (*Signatures, error) {
	if fsys == nil {
		fsys = coreruleset.FS
	}
	if cacheSize <= 0 {
		cacheSize = DefaultCacheSize
	}
	crs, err := newCRSEngine(fsys)
	if err != nil {
		return nil, fmt.Errorf("detector: loading the Core Rule Set: %w", err)
	}
	cache, _ := lru.New[uint64, Verdict](cacheSize)
	s := &Signatures{crs: crs, cache: cache}
	s.agents.limit = int64(max(cacheSize/4, 256))
	return s, nil
}

var defaultSignatures = sync.OnceValues(func() (*Signatures, error) { return NewSignatures(nil, 0) })

// DefaultSignatures returns the process's shared Signatures over the
// embedded CRS, loading it on the first call (about 0.2 s of CPU and 14 MB,
// most of it the automaton's transitions).
func DefaultSignatures() (*Signatures, error) { return defaultSignatures() }

// CRSVersion is the version of the Core Rule Set module linked in, as
// go.mod names it ("v4.25.0"), or "" when the build carries no module
// information.
func CRSVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, m := range bi.Deps {
		if m.Path == "github.com/corazawaf/coraza-coreruleset/v4" {
			return m.Version
		}
	}
	return ""
}

// plainByte marks the bytes of a request target that no CRS request rule
// needs to see: letters, digits and / . _ - and, in a query, & = and ,.
// Everything an exploit needs (quotes, spaces and '+', '%', '<', '(',
// '$', ';', ':', '\', '[', '{', '|', '`', '~', '!', '*', '@') is not.
var plainByte = func() (t [256]bool) {
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for _, c := range "/._-?&=," {
		t[c] = true
	}
	return t
}()

// NeedsCheck reports whether a request target could carry what the
// content signal takes from the CRS: a byte outside plainByte (every
// exploit payload needs one) or a path segment that starts with a dot (a
// traversal, a restricted dotfile: /.env, /.git/config). A plain path
// (letters, digits, / . _ - and a plain query) is left to the content
// lists, which are cheap: the CRS's restricted names without a dot
// (/phpinfo.php, /db.sql) are probes only among others, and checking every
// refused plain path made a scraper's 404s cost a CRS evaluation each
// (60% of SecRepo 2018's requests). It does not look at the user agent,
// which Check judges once per distinct value, nor at the status.
func NeedsCheck(target string, _ uint32) bool {
	for i := 0; i < len(target); i++ {
		c := target[i]
		if !plainByte[c] || c == '.' && i > 0 && target[i-1] == '/' {
			return true
		}
	}
	return false
}

// assetExts are the file extensions of a page's subresources: images,
// styles, scripts, fonts and media, which a browser fetches by the dozen
// with every page it loads.
var assetExts = map[string]bool{
	"css": true, "js": true, "mjs": true, "map": true, "png": true, "jpg": true, "jpeg": true, "gif": true,
	"webp": true, "avif": true, "svg": true, "ico": true, "bmp": true, "woff": true, "woff2": true, "ttf": true,
	"otf": true, "eot": true, "mp4": true, "webm": true, "mp3": true, "ogg": true, "wav": true,
}

// IsAsset reports whether a request target (a path, with or without its
// query) names a page's subresource by its extension (assetExts, any case):
// /static/app.js, /img/logo.PNG?v=3.
func IsAsset(target string) bool {
	p, _, _ := strings.Cut(target, "?")
	slash := strings.LastIndexByte(p, '/')
	dot := strings.LastIndexByte(p, '.')
	if dot < 0 || dot < slash || len(p)-dot-1 > 5 || dot == len(p)-1 {
		return false
	}
	var buf [5]byte
	ext := buf[:len(p)-dot-1]
	for i := range ext {
		c := p[dot+1+i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		ext[i] = c
	}
	return assetExts[string(ext)]
}

// Check returns a request's verdict: method and target (the path with its
// query, as sent), user agent and the answer's status (0 when unknown). The
// target is checked only when NeedsCheck says so; the user agent once per
// distinct value (scanner detection and attacks in the header).
func (s *Signatures) Check(method, target, ua string, status uint32) Verdict {
	return s.check(method, target, ua, status, true)
}

// check is Check; with target false the target is not checked (a client
// over its budget, see ContentOptions.MaxChecks), only the user agent.
func (s *Signatures) check(method, target, ua string, status uint32, checkTarget bool) Verdict {
	s.seen.Add(1)
	var v Verdict
	if ua != "" {
		h := sketch.Hash64(ua)
		uv, ok := s.agents.get(h)
		if !ok {
			s.checks.Add(1)
			uv = s.eval("GET", "/", ua)
			s.agents.add(h, uv)
		}
		v = uv
	}
	if !checkTarget || !NeedsCheck(target, status) {
		return v
	}
	s.needed.Add(1)
	h := sketch.Hash64(method) ^ sketch.Hash64(target)*0x9e3779b97f4a7c15 ^ sketch.Hash64(ua)*0xc2b2ae3d27d4eb4f
	tv, ok := s.cache.Get(h)
	if !ok {
		s.checks.Add(1)
		// The user agent was judged on its own: the target is judged
		// with a browser's, so that a scanner's name does not hide an
		// exploit's class.
		tv = s.eval(method, target, "Mozilla/5.0")
		s.cache.Add(h, tv)
	}
	if tv.Class > v.Class {
		v.Class, v.Rule = tv.Class, tv.Rule
	}
	return v
}

// agentVerdicts remember the verdicts on user agents: read on every record
// by every partition, so a sync.Map (reads take no lock) that is dropped
// whole when it holds limit of them (a flood of random user agents makes
// it start over, not grow).
type agentVerdicts struct {
	m     sync.Map // uint64 -> Verdict
	n     atomic.Int64
	limit int64
}

func (a *agentVerdicts) get(h uint64) (Verdict, bool) {
	v, ok := a.m.Load(h)
	if !ok {
		return Verdict{}, false
	}
	return v.(Verdict), true
}

func (a *agentVerdicts) add(h uint64, v Verdict) {
	if a.n.Add(1) > a.limit {
		a.m.Clear()
		a.n.Store(1)
	}
	a.m.Store(h, v)
}

// eval runs the CRS on one request line and user agent and classifies its
// matches: the highest class wins, and among rules of that class the first
// to match names the verdict.
func (s *Signatures) eval(method, target, ua string) Verdict { return s.crs.eval(method, target, ua) }
