package enrich

import (
	"bufio"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func ja4File(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join(sharedData(t), "ja4", name)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("../shared/data absent: %v", err)
	}
	return p
}

func loadKnownClients(t testing.TB) *JA4Table {
	t.Helper()
	tab, err := LoadJA4(ja4File(t, "ja4-known-clients.tsv"))
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

func TestValidJA4(t *testing.T) {
	tests := []struct {
		s    string
		want bool
	}{
		{"t13d1516h2_8daaf6152771_b186095e22b6", true}, // the spec's example
		{"t13d1516h2_8daaf6152771_e5627efa2ab1", true},
		{"q13d0312h3_55b375c5d22e_06cda9e17597", true}, // QUIC
		{"d12i0000ad_000000000000_000000000000", true}, // DTLS, no ciphers or extensions, hex ALPN
		{"t10d230100_6a57a6f57151_000000000000", true}, // no ALPN
		{"ts3i990000_000000000000_000000000000", true}, // SSL 3.0
		{"td2d0101AZ_000000000000_000000000000", true}, // upper-case ALPN characters are allowed
		{"", false},
		{"t13d1516h2_8daaf6152771_b186095e22b", false},   // 35 bytes
		{"t13d1516h2_8daaf6152771_b186095e22b66", false}, // 37 bytes
		{"x13d1516h2_8daaf6152771_b186095e22b6", false},  // protocol
		{"T13d1516h2_8daaf6152771_b186095e22b6", false},  // protocol case
		{"t14d1516h2_8daaf6152771_b186095e22b6", false},  // version
		{"t31d1516h2_8daaf6152771_b186095e22b6", false},  // version
		{"t13x1516h2_8daaf6152771_b186095e22b6", false},  // SNI
		{"t13d1a16h2_8daaf6152771_b186095e22b6", false},  // cipher count
		{"t13d15-6h2_8daaf6152771_b186095e22b6", false},  // extension count
		{"t13d1516h-_8daaf6152771_b186095e22b6", false},  // ALPN
		{"t13d1516h2-8daaf6152771_b186095e22b6", false},  // separator
		{"t13d1516h2_8daaf6152771-b186095e22b6", false},  // separator
		{"t13d1516h2_8DAAF6152771_b186095e22b6", false},  // upper-case hash
		{"t13d1516h2_8daaf615277g_b186095e22b6", false},  // not hex
		{"t13d1516h2_8daaf6152771_b186095e22bé", false},  // non-ASCII (37 bytes)
		{"t13d1516h2_8daaf6152771_b186095e22\xff\xff", false},
	}
	for _, tt := range tests {
		if got := ValidJA4(tt.s); got != tt.want {
			t.Errorf("ValidJA4(%q) = %v, want %v", tt.s, got, tt.want)
		}
	}
}

// TestValidJA4RealFingerprints checks ValidJA4 against every fingerprint in
// the two JA4 files of ../shared/data/ja4.
func TestValidJA4RealFingerprints(t *testing.T) {
	for _, name := range []string{"ja4-known-clients.tsv", "ja4-client-fingerprints.tsv"} {
		f, err := os.Open(ja4File(t, name))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		n := 0
		header := true
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "#") {
				continue
			}
			if header {
				header = false
				continue
			}
			fields := strings.Split(line, "\t")
			fp := fields[len(fields)-1]
			if !ValidJA4(fp) {
				t.Errorf("%s: ValidJA4(%q) = false", name, fp)
			}
			n++
		}
		f.Close()
		if n < 30 {
			t.Errorf("%s: only %d fingerprints read", name, n)
		}
	}
}

func TestLoadJA4(t *testing.T) {
	tab := loadKnownClients(t)
	want := map[string][]string{
		"Python": {"t13i181000_85036bcba153_d41ae481755e", "t13d181000_85036bcba153_d41ae481755e", "t13d4312h1_c7886603b240_b26ce05bbdd6"},
		"Safari": {"t13d2014h2_a09f3c656075_14788d8d241b", "t13i2013h2_a09f3c656075_14788d8d241b"},
		"IcedID": {"t13d201100_2b729b4bf6f3_9e7b989ebec8"}, // "IcedID " trimmed
		"Nest":   {"t12d8008h1_9cedc1f1428b_046e095b7c4a"}, // device column
		"curl":   nil,
	}
	for family, fps := range want {
		if got := tab.Fingerprints(family); !slices.Equal(got, fps) {
			t.Errorf("Fingerprints(%q) = %q, want %q", family, got, fps)
		}
	}
	// Every fingerprint the table can return is valid.
	for family, fps := range tab.byFamily {
		for _, fp := range fps {
			if !ValidJA4(fp) {
				t.Errorf("family %q: invalid %q", family, fp)
			}
		}
		if len(fps) == 0 {
			t.Errorf("family %q has no candidates", family)
		}
	}
	if got := tab.byFamily["Python"]; !slices.Equal(got, []string{"t13d181000_85036bcba153_d41ae481755e", "t13d4312h1_c7886603b240_b26ce05bbdd6"}) {
		t.Errorf("Python candidates = %q, want the TCP+SNI ones", got)
	}
	if got := tab.byFamily["GoLang"]; len(got) != 4 {
		t.Errorf("GoLang candidates = %q, want 4 (d variants, duplicates dropped)", got)
	}
}

func TestLoadJA4Errors(t *testing.T) {
	const header = "application\tlibrary\tdevice\tos\tja4\n"
	tests := []struct {
		name, content string
		want          []string
	}{
		{"no header column", "# c\napplication\tos\tja4\n", []string{"bad.tsv:2", `no "library" column`}},
		{"field count", header + "Python\t\t\tt13d181000_85036bcba153_d41ae481755e\n", []string{"bad.tsv:2", "4 tab-separated fields, header has 5"}},
		{"bad ja4", header + "\tPython\t\t\tt13d181000_85036bcba153\n", []string{"bad.tsv:2", `"t13d181000_85036bcba153" is not a JA4`}},
		{"no family", header + "\t \t\t\tt13d181000_85036bcba153_d41ae481755e\n", []string{"bad.tsv:2", "names no application"}},
		{"no rows", header + "Python\t\t\t\t\n", []string{"bad.tsv", "no JA4 fingerprints"}},
		{"empty", "", []string{"bad.tsv", "no JA4 fingerprints"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadJA4(writeFile(t, "bad.tsv", tt.content))
			if err == nil {
				t.Fatal("LoadJA4 succeeded, want an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
	if _, err := LoadJA4("/nonexistent/ja4.tsv"); err == nil || !strings.Contains(err.Error(), "/nonexistent/ja4.tsv") {
		t.Errorf("missing file error = %v", err)
	}
}

func TestUAFamily(t *testing.T) {
	tests := []struct{ ua, want string }{
		{"python-requests/2.20.1", "Python"},
		{"Python-urllib/3.7", "Python"},
		{"Python/3.11 aiohttp/3.9.1", "Python"},
		{"Scrapy/2.11.0 (+https://scrapy.org)", "Python"},
		{"Go-http-client/1.1", "GoLang"},
		{"Go-http-client/2.0", "GoLang"},
		{"curl/7.68.0", "curl"},
		{"Wget/1.20.3 (linux-gnu)", "Wget"},
		{"Java/1.8.0_151", "Java"},
		{"okhttp/4.9.0", "Java"},
		{"axios/1.6.0", "Node.js"},
		{"Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)", "Googlebot"},
		{"Mozilla/5.0 (Linux; Android 6.0.1; Nexus 5X Build/MMB29P) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.6099.71 Mobile Safari/537.36 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)", "Googlebot"},
		{"Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)", "Bingbot"},
		{"Mozilla/5.0 (compatible; SemrushBot/7~bl; +http://www.semrush.com/bot.html)", "Crawler"},
		{"Baiduspider+(+http://www.baidu.com/search/spider.htm)", "Crawler"},
		{"Mozilla/5.0 (compatible; Yahoo! Slurp; http://help.yahoo.com/help/us/ysearch/slurp)", "Crawler"},
		{"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/107.0.0.0 Safari/537.36", "Chromium Browser"},
		{"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Safari/537.36 Edg/120.0.0.0", "Chromium Browser"},
		{"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Safari/537.36 OPR/106.0.0.0", "Chromium Browser"},
		{"Mozilla/5.0 (Linux; Android 13; SM-S918B) AppleWebKit/537.36 (KHTML, like Gecko) SamsungBrowser/23.0 Chrome/115.0.0.0 Mobile Safari/537.36", "Chromium Browser"},
		{"Mozilla/5.0 (X11; Ubuntu; Linux x86_64; rv:109.0) Gecko/20100101 Firefox/118.0", "Mozilla Firefox"},
		{"Mozilla/5.0 (Macintosh; Intel Mac OS X 10.15; rv:109.0) Gecko/20100101 Firefox/118.0", "Mozilla Firefox"},
		{"Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.1 Safari/605.1.15", "Safari"},
		{"Mozilla/5.0 (iPhone; CPU iPhone OS 17_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) CriOS/119.0.6045.169 Mobile/15E148 Safari/604.1", "Safari"},
		{"Mozilla/5.0 (iPad; CPU OS 17_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) FxiOS/119.0 Mobile/15E148 Safari/605.1.15", "Safari"},
		{"Mozilla/5.0 (Linux; U; Android 4.0.3; ko-kr; LG-L160L Build/IML74K) AppleWebKit/534.30 (KHTML, like Gecko) Version/4.0 Mobile Safari/534.30", FamilyUnknown},
		{"Mozilla/5.0 (Windows NT 10.0; Trident/7.0; rv:11.0) like Gecko", "WinINET"},
		{"Mozilla/4.0 (compatible; MSIE 8.0; Windows NT 6.1)", "WinINET"},
		{"PYTHON-REQUESTS/2.0", "Python"},
		{"", FamilyUnknown},
		{"-", FamilyUnknown},
		{"portscout/0.8.1", FamilyUnknown},
		{strings.Repeat("x", 600) + "Firefox/1.0", "Mozilla Firefox"}, // longer than the stack buffer
	}
	for _, tt := range tests {
		if got := UAFamily(tt.ua); got != tt.want {
			t.Errorf("UAFamily(%q) = %q, want %q", tt.ua, got, tt.want)
		}
	}
}

func TestForUserAgent(t *testing.T) {
	tab := loadKnownClients(t)
	again := loadKnownClients(t)
	python := tab.Fingerprints("Python")

	const pyUA = "python-requests/2.20.1"
	ja4, family := tab.ForUserAgent(pyUA)
	if family != "Python" || !slices.Contains(python, ja4) {
		t.Fatalf("ForUserAgent(%q) = %q, %q; want a Python JA4 from %q", pyUA, ja4, family, python)
	}
	for i := 0; i < 10; i++ {
		if j, f := again.ForUserAgent(pyUA); j != ja4 || f != family {
			t.Fatalf("ForUserAgent not deterministic: %q, %q then %q, %q", ja4, family, j, f)
		}
	}

	// Pinned choices (the package doc quotes the first): a change here
	// changes every replay's fingerprints.
	for ua, want := range map[string]string{
		"python-requests/2.31.0": "t13d181000_85036bcba153_d41ae481755e",
		"python-requests/2.20.1": "t13d4312h1_c7886603b240_b26ce05bbdd6",
	} {
		if got, _ := tab.ForUserAgent(ua); got != want {
			t.Errorf("ForUserAgent(%q) = %q, want %q", ua, got, want)
		}
	}

	tests := []struct {
		ua, family string
		wantJA4    bool
	}{
		{"Go-http-client/1.1", "GoLang", true},
		{"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/69.0.3497.100 Safari/537.36", "Chromium Browser", true},
		{"Mozilla/5.0 (X11; Ubuntu; Linux x86_64; rv:109.0) Gecko/20100101 Firefox/118.0", "Mozilla Firefox", true},
		{"Mozilla/5.0 (Windows NT 10.0; Trident/7.0; rv:11.0) like Gecko", "WinINET", true},
		{"curl/7.68.0", FamilyUnknown, false}, // no curl row in the table
		{"Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)", FamilyUnknown, false}, // no crawler rows
		{"portscout/0.8.1", FamilyUnknown, false},
		{"", FamilyUnknown, false},
	}
	for _, tt := range tests {
		ja4, family := tab.ForUserAgent(tt.ua)
		if family != tt.family || (ja4 != "") != tt.wantJA4 {
			t.Errorf("ForUserAgent(%q) = %q, %q; want family %q, JA4 %v", tt.ua, ja4, family, tt.family, tt.wantJA4)
		}
		if ja4 != "" && (!ValidJA4(ja4) || !slices.Contains(tab.Fingerprints(family), ja4) || ja4[0] != 't' || ja4[3] != 'd') {
			t.Errorf("ForUserAgent(%q) = %q: not a TCP+SNI fingerprint of %q", tt.ua, ja4, family)
		}
	}

	// Different Chrome versions spread over the family's fingerprints.
	seen := map[string]bool{}
	for v := 60; v < 130; v++ {
		ua := "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/" + strconv.Itoa(v) + ".0.0.0 Safari/537.36"
		ja4, _ := tab.ForUserAgent(ua)
		seen[ja4] = true
	}
	if len(seen) != len(tab.byFamily["Chromium Browser"]) {
		t.Errorf("70 Chrome versions got %d distinct JA4s, want all %d candidates", len(seen), len(tab.byFamily["Chromium Browser"]))
	}

	var nilTab *JA4Table
	if ja4, family := nilTab.ForUserAgent(pyUA); ja4 != "" || family != FamilyUnknown {
		t.Errorf("nil table = %q, %q", ja4, family)
	}
	if ja4, family := new(JA4Table).ForUserAgent(pyUA); ja4 != "" || family != FamilyUnknown {
		t.Errorf("zero table = %q, %q", ja4, family)
	}
}

// readFixtureUAs reads the user agents of an isbot fixture: YAML lists of
// strings under a key, one "  - ua" per line.
func readFixtureUAs(t *testing.T, name string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(sharedData(t), "bots", name))
	if err != nil {
		t.Skipf("../shared/data absent: %v", err)
	}
	var uas []string
	for _, line := range strings.Split(string(data), "\n") {
		if ua, ok := strings.CutPrefix(line, "  - "); ok {
			if len(ua) >= 2 && (ua[0] == '"' || ua[0] == '\'') && ua[len(ua)-1] == ua[0] {
				ua = ua[1 : len(ua)-1]
			}
			uas = append(uas, ua)
		}
	}
	return uas
}

// TestFamiliesOnFixtures classifies isbot's labelled crawler and browser
// user agents. UAFamily is a TLS-stack classifier, not a bot detector, so
// the bounds only guard against regressions: at least half the crawlers land
// in a crawler or HTTP-library family, at most 3% of browsers in a crawler
// family. Every JA4 given must be valid.
func TestFamiliesOnFixtures(t *testing.T) {
	tab := loadKnownClients(t)
	crawlerFamily := map[string]bool{"Googlebot": true, "Bingbot": true, "Crawler": true}
	nonBrowser := map[string]bool{"Python": true, "GoLang": true, "curl": true, "Wget": true, "Java": true, "Node.js": true}
	for _, tc := range []struct {
		file          string
		minCrawler    float64 // lower bound on the share in crawler or library families
		maxCrawler    float64 // upper bound on the share in crawler families
		countLibAsBot bool
	}{
		{"isbot-crawlers.yml", 0.50, 1, true}, // 53% when written, 77.5% with crawler words (TestCrawlerShares)
		{"isbot-browsers.yml", 0, 0, false},   // 1.8% before crawler words (CUBOT phones, "turbotabbee", ...), now none
	} {
		uas := readFixtureUAs(t, tc.file)
		if len(uas) < 500 {
			t.Fatalf("%s: read only %d user agents", tc.file, len(uas))
		}
		counts := map[string]int{}
		bots := 0
		for _, ua := range uas {
			f := UAFamily(ua)
			counts[f]++
			if crawlerFamily[f] || tc.countLibAsBot && nonBrowser[f] {
				bots++
			}
			if ja4, _ := tab.ForUserAgent(ua); ja4 != "" && !ValidJA4(ja4) {
				t.Errorf("ForUserAgent(%q) = invalid %q", ua, ja4)
			}
		}
		share := float64(bots) / float64(len(uas))
		t.Logf("%s: %d user agents, %.1f%% crawler-like, families %v", tc.file, len(uas), 100*share, counts)
		if share < tc.minCrawler || share > tc.maxCrawler {
			t.Errorf("%s: %.1f%% classified as crawlers, want %.0f%%-%.0f%%", tc.file, 100*share, 100*tc.minCrawler, 100*tc.maxCrawler)
		}
	}
}

func BenchmarkForUserAgent(b *testing.B) {
	tab := loadKnownClients(b)
	ua := "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/107.0.0.0 Safari/537.36"
	if ja4, _ := tab.ForUserAgent(ua); ja4 == "" {
		b.Fatal("no JA4 for a Chrome user agent")
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			tab.ForUserAgent(ua)
		}
	})
}
