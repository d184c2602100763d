package enrich

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// FamilyUnknown is the family ForUserAgent returns when the user agent's
// family has no fingerprint in the table, and UAFamily returns for a user
// agent it does not recognise.
const FamilyUnknown = "unknown"

// JA4Table picks a JA4 TLS client fingerprint for a user agent, by the
// family of its TLS stack, deterministically: logs have no TLS data, so a
// replay gives each request the fingerprint its client would plausibly have
// sent. The fingerprints come from FoxIO's ja4plus-mapping (the
// ja4-known-clients.tsv extract).
//
// The zero value and a nil *JA4Table are empty: ForUserAgent returns "",
// FamilyUnknown. A JA4Table is immutable once loaded and safe for
// concurrent use. Create it with LoadJA4; most callers want ForUserAgent.
type JA4Table struct {
	// byFamily holds each family's candidate fingerprints in file order
	// without duplicates: those over TCP with SNI when the family has any,
	// all of them otherwise (see ForUserAgent).
	byFamily map[string][]string
	all      map[string][]string // every fingerprint per family, for Fingerprints
}

// LoadJA4 reads a table of known TLS clients: a tab-separated file whose
// lines starting with # are comments, whose first other line is a header
// naming at least the columns application, library and ja4 (device and os
// are read too; other columns are ignored), and whose rows each give one
// JA4. A row's family is its application, or else its library, device or
// os, the first that is not blank. Rows with an empty ja4 are skipped.
//
// It fails, naming the file and line, on a missing column, a row with a
// different number of fields from the header, a row with no family, a ja4
// that fails ValidJA4, or a file with no fingerprints.
func LoadJA4(path string) (*JA4Table, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("enrich: open JA4 table: %w", err)
	}
	defer f.Close()

	t := &JA4Table{byFamily: map[string][]string{}, all: map[string][]string{}}
	sc := bufio.NewScanner(f)
	var header []string
	col := map[string]int{}
	nameCols := []string{"application", "library", "device", "os"}
	line, rows := 0, 0
	for sc.Scan() {
		line++
		text := strings.TrimSuffix(sc.Text(), "\r")
		if strings.HasPrefix(text, "#") || strings.TrimSpace(text) == "" {
			continue
		}
		fields := strings.Split(text, "\t")
		if header == nil {
			header = fields
			for i, h := range fields {
				col[strings.TrimSpace(h)] = i
			}
			for _, need := range []string{"application", "library", "ja4"} {
				if _, ok := col[need]; !ok {
					return nil, fmt.Errorf("enrich: %s:%d: header has no %q column (want application library device os ja4)", path, line, need)
				}
			}
			continue
		}
		if len(fields) != len(header) {
			return nil, fmt.Errorf("enrich: %s:%d: %d tab-separated fields, header has %d", path, line, len(fields), len(header))
		}
		ja4 := strings.TrimSpace(fields[col["ja4"]])
		if ja4 == "" {
			continue
		}
		if !ValidJA4(ja4) {
			return nil, fmt.Errorf("enrich: %s:%d: ja4 %q is not a JA4 fingerprint (want e.g. t13d1516h2_8daaf6152771_b186095e22b6)", path, line, ja4)
		}
		family := ""
		for _, c := range nameCols {
			if i, ok := col[c]; ok && strings.TrimSpace(fields[i]) != "" {
				family = strings.TrimSpace(fields[i])
				break
			}
		}
		if family == "" {
			return nil, fmt.Errorf("enrich: %s:%d: row names no application, library, device or os", path, line)
		}
		if !slices.Contains(t.all[family], ja4) {
			t.all[family] = append(t.all[family], ja4)
		}
		rows++
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("enrich: read %s after line %d: %w", path, line, err)
	}
	if rows == 0 {
		return nil, fmt.Errorf("enrich: %s: no JA4 fingerprints in %d lines", path, line)
	}
	for family, fps := range t.all {
		var tcpSNI []string
		for _, fp := range fps {
			if fp[0] == 't' && fp[3] == 'd' {
				tcpSNI = append(tcpSNI, fp)
			}
		}
		if len(tcpSNI) == 0 {
			tcpSNI = fps
		}
		t.byFamily[family] = tcpSNI
	}
	return t, nil
}

// ForUserAgent returns a JA4 fingerprint for a request with user agent ua,
// and the family it was picked from (see UAFamily for the families). When
// the family has no fingerprint in the table it returns "", FamilyUnknown.
//
// Requests to an API go over TCP to a host name, so when the family has
// fingerprints over TCP with SNI ("t..d...") the choice is among those only;
// QUIC ("q") and no-SNI ("i") fingerprints are used only by families that
// have nothing else. Among several candidates it picks the one at
// xxhash64(ua) mod n, in file order, so one user agent always gets the same
// fingerprint from the same table, and different versions of a browser may
// get different ones. The returned fingerprint passes ValidJA4.
func (t *JA4Table) ForUserAgent(ua string) (ja4 string, family string) {
	if t == nil {
		return "", FamilyUnknown
	}
	family = UAFamily(ua)
	fps := t.byFamily[family]
	if len(fps) == 0 {
		return "", FamilyUnknown
	}
	return fps[xxhash.Sum64String(ua)%uint64(len(fps))], family
}

// Fingerprints returns a copy of every fingerprint the table holds for
// family, in file order, or nil.
func (t *JA4Table) Fingerprints(family string) []string {
	if t == nil {
		return nil
	}
	return slices.Clone(t.all[family])
}

// A uaRule maps user agents containing any of its lower-case patterns to a
// family; UAFamily applies the rules in order and the first match wins.
type uaRule struct {
	family   string
	patterns [][]byte
	// unless, when set, vetoes the rule for user agents containing it.
	unless []byte
	// words, when set, matches instead of patterns: it is given the user
	// agent in its original case (see isCrawlerUA).
	words func(ua string) bool
}

func rule(family string, patterns ...string) uaRule {
	r := uaRule{family: family}
	for _, p := range patterns {
		r.patterns = append(r.patterns, []byte(p))
	}
	return r
}

// uaRules is the classification table UAFamily documents. HTTP libraries
// come first (their TLS stack is what JA4 sees, whatever else the user
// agent claims), then crawlers (Googlebot's user agent also claims Chrome),
// then browsers, iOS before the rest because every iOS browser uses
// Apple's TLS stack.
var uaRules = []uaRule{
	rule("Python", "python-requests", "python-urllib", "python-httpx", "python/", "aiohttp", "httpx/", "urllib3", "scrapy"),
	rule("GoLang", "go-http-client", "go 1.1 package http"),
	rule("curl", "curl/"),
	rule("Wget", "wget/"),
	rule("Java", "java/", "apache-httpclient", "okhttp"),
	rule("Node.js", "node-fetch", "axios/", "undici", "node.js"),
	rule("Googlebot", "googlebot"),
	rule("Bingbot", "bingbot"),
	{family: "Crawler", words: isCrawlerUA},
	{family: "Safari", patterns: [][]byte{[]byte("iphone"), []byte("ipad"), []byte("ipod")}, unless: []byte("android")},
	rule("Chromium Browser", "chrome/", "chromium/", "crios/", "edg/", "edga/", "opr/", "headlesschrome", "samsungbrowser", "yabrowser", "vivaldi"),
	rule("Mozilla Firefox", "firefox/", "fxios/"),
	{family: "Safari", patterns: [][]byte{[]byte("safari/"), []byte("macintosh")}, unless: []byte("android")},
	rule("WinINET", "msie ", "trident/"),
}

// UAFamily classifies a user agent by the TLS stack its client most likely
// uses, matching ASCII case-insensitively, first rule wins:
//
//	Python            python-requests, python-urllib, python-httpx, Python/, aiohttp, httpx/, urllib3, Scrapy
//	GoLang            Go-http-client, "Go 1.1 package http"
//	curl              curl/
//	Wget              Wget/
//	Java              Java/, Apache-HttpClient, okhttp
//	Node.js           node-fetch, axios/, undici, node.js
//	Googlebot         Googlebot
//	Bingbot           bingbot
//	Crawler           a crawler word (uatoken.go): a word, a run of letters and digits, ending in
//	                  "bot" or "Bot" (AhrefsBot, bingbot; not CUBOT, fuboTV, Caboto), spider, crawler,
//	                  fetcher, preview, monitor, agent, ...; beginning with crawl, fetch, feed, probe,
//	                  ...; a listed tool or service (libwww-perl, PHP, pingdom, whatsapp, ...) or
//	                  http/https (a contact URL); or a user agent that is one bare name or has an
//	                  e-mail address
//	Safari            iPhone, iPad, iPod (any iOS browser: Apple's TLS stack), not Android
//	Chromium Browser  Chrome/, Chromium/, CriOS/, Edg/, EdgA/, OPR/, HeadlessChrome, SamsungBrowser, YaBrowser, Vivaldi
//	Mozilla Firefox   Firefox/, FxiOS/
//	Safari            Safari/ or Macintosh without Chrome (checked above), not Android
//	WinINET           MSIE, Trident/ (Internet Explorer's stack; approximate)
//	unknown           anything else, including "" and "-"
//
// The family names match ja4-known-clients.tsv where the table has the
// family (Python, GoLang, Chromium Browser, Mozilla Firefox, Safari,
// WinINET); the others have no fingerprint there.
func UAFamily(ua string) string {
	var buf [512]byte
	var lower []byte
	if len(ua) <= len(buf) {
		lower = buf[:len(ua)]
		for i := 0; i < len(ua); i++ {
			c := ua[i]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			lower[i] = c
		}
	} else {
		lower = bytes.ToLower([]byte(ua))
	}
	for _, r := range uaRules {
		if r.unless != nil && bytes.Contains(lower, r.unless) {
			continue
		}
		if r.words != nil {
			if r.words(ua) {
				return r.family
			}
			continue
		}
		for _, p := range r.patterns {
			if bytes.Contains(lower, p) {
				return r.family
			}
		}
	}
	return FamilyUnknown
}

// ValidJA4 reports whether s has the shape of a JA4 TLS client fingerprint
// (FoxIO JA4 specification, technical_details/JA4.md), 36 bytes:
//
//	t13d1516h2_8daaf6152771_b186095e22b6
//	│└┤│└┤└┤└┤ └──────────┘ └──────────┘
//	│ │ │ │ │ └ ALPN: first and last character of the first value, ASCII letters or digits ("00": none)
//	│ │ │ │ └ extension count, 2 decimal digits
//	│ │ │ └ cipher count, 2 decimal digits
//	│ │ └ d: SNI present, i: absent
//	│ └ TLS version: 13 12 11 10 s3 s2 d1 d2 d3, or 00 (unknown)
//	└ protocol: t TCP, q QUIC, d DTLS
//
// followed by two 12-character lower-case hex parts (truncated SHA-256 of
// the ciphers, and of the extensions and signature algorithms, or
// 000000000000 when empty), each after an underscore. It checks the format
// only, not that the counts agree with the hashes.
func ValidJA4(s string) bool {
	if len(s) != 36 || s[10] != '_' || s[23] != '_' {
		return false
	}
	switch s[0] {
	case 't', 'q', 'd':
	default:
		return false
	}
	switch s[1:3] {
	case "13", "12", "11", "10", "s3", "s2", "d1", "d2", "d3", "00":
	default:
		return false
	}
	if s[3] != 'd' && s[3] != 'i' {
		return false
	}
	for i := 4; i < 8; i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	for i := 8; i < 10; i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return false
		}
	}
	return lowerHex(s[11:23]) && lowerHex(s[24:36])
}

func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
