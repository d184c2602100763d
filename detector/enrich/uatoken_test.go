package enrich

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Letters are not tokens: "bot" inside a phone maker's name, a TV app's or
// a bank's is no crawler; "bot" ending a product name is.
func TestUAFamilyTokens(t *testing.T) {
	for _, tt := range []struct{ ua, want string }{
		{"Mozilla/5.0 (Linux; Android 6.0; CUBOT MAX) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/72.0.3626.121 Mobile Safari/537.36", "Chromium Browser"},
		{"Mozilla/5.0 (Linux; Android 8.0.0; CUBOT_P20) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/70.0.3538.110 Mobile Safari/537.36", "Chromium Browser"},
		{"fuboTV/4.75.0 (Linux;Android 9; AFTDCT31 Build/PS7664.3772N) FuboPlayer/v1.34.0", FamilyUnknown},
		{"Mozilla/5.0 (compatible; MSIE 9.0; Windows NT 6.1; WOW64; Trident/5.0; Banca Caboto s.p.a.)", "WinINET"},
		{"Opera/9.70 (Linux armv7l ; U; turbotabbee/TSV2.0/1.02Q; fr) Presto/2.2", FamilyUnknown},
		{"Mozilla/5.0 (Linux; Android 7.1.2; google Pixel 2) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/104.0.0.0 Mobile Safari/537.36", "Chromium Browser"},
		{"Mozilla/5.0 (compatible; AhrefsBot/7.0; +http://ahrefs.com/robot/)", "Crawler"},
		{"Mozilla/5.0 (compatible; MJ12bot/v1.4.8; http://mj12bot.com/)", "Crawler"},
		{"Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; GPTBot/1.2; +https://openai.com/gptbot)", "Crawler"},
		{"Mozilla/5.0 (compatible; Google-InspectionTool/1.0)", "Crawler"},
		{"Googlebot-Image/1.0", "Googlebot"},
		{"BOT/0.1 (BOT for JCE)", "Crawler"},
		{"Mozilla/5.0 (compatible; Ezooms/1.0; help@moz.com)", "Crawler"},
		{"Hexometer", "Crawler"}, // a bare name
	} {
		if got := UAFamily(tt.ua); got != tt.want {
			t.Errorf("UAFamily(%q) = %q, want %q", tt.ua, got, tt.want)
		}
	}
}

func TestHasToken(t *testing.T) {
	for _, tt := range []struct {
		ua, token string
		want      bool
	}{
		{"Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)", "googlebot", true},
		{"Googlebot-Image/1.0", "googlebot", true},
		{"Googlebot-Image/1.0", "googlebot-image", true},
		{"AdsBot-Google (+http://www.google.com/adsbot.html)", "adsbot-google", true},
		{"Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko); compatible; ChatGPT-User/1.0; +https://openai.com/bot", "chatgpt-user", true},
		{"NotGooglebot/1.0", "googlebot", false},
		{"Googlebots", "googlebot", false},
		{"googlebot", "googlebot", true},
		{"", "googlebot", false},
		{"googlebot", "", false},
	} {
		if got := HasToken(tt.ua, tt.token); got != tt.want {
			t.Errorf("HasToken(%q, %q) = %v, want %v", tt.ua, tt.token, got, tt.want)
		}
	}
}

// crawlerish reports whether UAFamily puts ua in a crawler family or an
// HTTP library's (isbot counts curl and python-requests as bots).
func crawlerish(ua string) (crawler, library bool) {
	switch UAFamily(ua) {
	case "Googlebot", "Bingbot", "Crawler":
		return true, false
	case "Python", "GoLang", "curl", "Wget", "Java", "Node.js":
		return false, true
	}
	return false, false
}

// TestCrawlerShares classifies the shared lists of real browsers' and
// crawlers' user agents. No browser may be called a crawler. Of the
// crawlers, the share in a crawler or library family is logged and held
// above a floor set just under what was measured; the misses are one-off
// product names ("Blogtrottr/2.0", "webcollage/1.182") and browsers' user
// agents with a monitoring vendor's marker ("... Chrome/56 GomezAgent 3.0"),
// which only a curated list of names would catch, and robots.txt tokens that
// are not user agents (ai-robots' "Google-Extended").
func TestCrawlerShares(t *testing.T) {
	for _, ua := range readFixtureUAs(t, "isbot-browsers.yml") {
		if c, _ := crawlerish(ua); c {
			t.Errorf("browser classed %s: %q", UAFamily(ua), ua)
		}
	}
	share := func(name string, uas []string, floor float64) {
		t.Helper()
		if len(uas) < 100 {
			t.Fatalf("%s: read only %d user agents", name, len(uas))
		}
		crawlers, libs := 0, 0
		var misses []string
		for _, ua := range uas {
			c, l := crawlerish(ua)
			switch {
			case c:
				crawlers++
			case l:
				libs++
			default:
				misses = append(misses, ua)
			}
		}
		got := float64(crawlers+libs) / float64(len(uas))
		t.Logf("%s: %d user agents, %.1f%% crawler (%d) or library (%d); first misses: %q", name, len(uas), 100*got, crawlers, libs, misses[:min(5, len(misses))])
		if got < floor {
			t.Errorf("%s: %.1f%% classed crawler or library, want at least %.0f%%", name, 100*got, 100*floor)
		}
	}
	share("isbot-crawlers.yml", readFixtureUAs(t, "isbot-crawlers.yml"), 0.75) // 77.5% when written (53% before tokens)

	dir := filepath.Join(sharedData(t), "bots")
	b, err := os.ReadFile(filepath.Join(dir, "crawler-user-agents.json"))
	if err != nil {
		t.Skipf("../shared/data/bots/crawler-user-agents.json absent: %v", err)
	}
	var list []struct{ Instances []string }
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatal(err)
	}
	var uas []string
	for _, x := range list {
		uas = append(uas, x.Instances...)
	}
	share("crawler-user-agents.json", uas, 0.90) // 91.4% when written

	b, err = os.ReadFile(filepath.Join(dir, "ai-robots.json"))
	if err != nil {
		t.Skipf("../shared/data/bots/ai-robots.json absent: %v", err)
	}
	var robots map[string]json.RawMessage
	if err := json.Unmarshal(b, &robots); err != nil {
		t.Fatal(err)
	}
	uas = uas[:0]
	for name := range robots {
		uas = append(uas, name) // product tokens, not whole user agents
	}
	share("ai-robots.json", uas, 0.60)
}

func TestDefaultCrawlerRanges(t *testing.T) {
	c := DefaultCrawlerRanges()
	if ops := c.Operators(); len(ops) != 0 {
		t.Errorf("default ranges have operators %v, want none", ops)
	}
	if c.Has("googlebot", netip.MustParseAddr("66.249.66.1")) {
		t.Error("default ranges claim googlebot")
	}
}

func TestParseCrawlerRanges(t *testing.T) {
	in := "# Google\n66.249.64.0/27\n66.249.64.32/27 # adjacent: merged\n\n2001:4860:4801:10::/64\n192.0.2.7\n::ffff:198.51.100.0/120\n10.0.0.0/8\n10.1.0.0/16\n"
	c, err := ParseCrawlerRanges("Googlebot", "googlebot-test.txt", strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		ip   string
		want bool
	}{
		{"66.249.64.0", true}, {"66.249.64.63", true}, {"66.249.64.64", false}, {"66.249.63.255", false},
		{"::ffff:66.249.64.5", true}, {"2001:4860:4801:10::1", true}, {"2001:4860:4801:11::1", false},
		{"192.0.2.7", true}, {"192.0.2.8", false}, {"198.51.100.200", true}, {"10.200.0.1", true}, {"11.0.0.0", false},
	} {
		if got := c.Contains("googlebot", netip.MustParseAddr(tt.ip)); got != tt.want {
			t.Errorf("Contains(%s) = %v, want %v", tt.ip, got, tt.want)
		}
	}
	if c.Contains("bingbot", netip.MustParseAddr("66.249.64.1")) || c.Has("bingbot", netip.MustParseAddr("66.249.64.1")) {
		t.Error("bingbot has Google's ranges")
	}
	if f := c.Files("googlebot", netip.MustParseAddr("66.249.64.1")); len(f) != 1 || f[0] != "googlebot-test.txt" {
		t.Errorf("Files = %v", f)
	}
	ip := netip.MustParseAddr("2001:4860:4801:10::1")
	if n := testing.AllocsPerRun(100, func() { c.Contains("googlebot", ip) }); n != 0 {
		t.Errorf("Contains allocates %v times", n)
	}
	if got := len(c.ops["googlebot"].v4); got != 4 {
		t.Errorf("%d merged IPv4 ranges, want 4", got)
	}

	for _, tt := range []struct{ in, want string }{
		{"66.249.64.0/27\n66.249.64.0/33\n", "bad.txt:2: \"66.249.64.0/33\" is not a CIDR"},
		{"googlebot\n", "bad.txt:1: \"googlebot\" is not a CIDR"},
		{"# ok\n\n  fe80::1%eth0/64 # zoned\n", "bad.txt:3: "},
		{"66.249.64.5/27\n", "bad.txt:1: \"66.249.64.5/27\" has host bits set (the network is 66.249.64.0/27)"},
		{"0.0.0.0/0\n", "bad.txt:1: \"0.0.0.0/0\" is broader than any crawler's range"},
		{"::/0\n", "bad.txt:1: \"::/0\" is broader"},
		{"::ffff:0.0.0.0/96\n", "bad.txt:1: \"::ffff:0.0.0.0/96\" is broader"},
	} {
		_, err := ParseCrawlerRanges("x", "bad.txt", strings.NewReader(tt.in))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseCrawlerRanges(%q) = %v, want an error with %q", tt.in, err, tt.want)
		}
	}
}

// The shared operators' lists load, and name their operators by file.
func TestLoadCrawlerRanges(t *testing.T) {
	dir := filepath.Join(sharedData(t), "crawler-ips")
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("../shared/data/crawler-ips absent: %v", err)
	}
	c, err := LoadCrawlerRanges(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.Operators(), " "); got != "bingbot googlebot openai" {
		t.Errorf("operators %q", got)
	}
	if !c.Contains("googlebot", netip.MustParseAddr("66.249.66.1")) || c.Contains("googlebot", netip.MustParseAddr("198.51.100.7")) {
		t.Error("googlebot ranges wrong")
	}
	if !c.Has("googlebot", netip.MustParseAddr("2001:4860:4801:10::1")) || c.Has("bingbot", netip.MustParseAddr("2001:db8::1")) {
		t.Error("Has by family wrong")
	}
	if _, err := LoadCrawlerRanges(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no <operator>-*.txt") {
		t.Errorf("empty dir: %v", err)
	}
	bad := t.TempDir()
	os.WriteFile(filepath.Join(bad, "googlebot-ipv4.txt"), []byte("66.249.64.0/27\nnot-a-cidr\n"), 0o644)
	if _, err := LoadCrawlerRanges(bad); err == nil || !strings.Contains(err.Error(), "googlebot-ipv4.txt:2:") {
		t.Errorf("bad file: %v", err)
	}
	noOp := t.TempDir()
	os.WriteFile(filepath.Join(noOp, "-ipv4.txt"), []byte("66.249.64.0/27\n"), 0o644)
	if _, err := LoadCrawlerRanges(noOp); err == nil || !strings.Contains(err.Error(), "names no operator") {
		t.Errorf("a file named -ipv4.txt: %v", err)
	}
	dirFile := t.TempDir()
	os.Mkdir(filepath.Join(dirFile, "googlebot-ipv4.txt"), 0o755)
	if _, err := LoadCrawlerRanges(dirFile); err == nil || !strings.Contains(err.Error(), "is a directory") {
		t.Errorf("a directory named googlebot-ipv4.txt: %v", err)
	}
}

func BenchmarkCrawlerRangesContains(b *testing.B) {
	var sb strings.Builder
	for i := 0; i < 4096; i++ {
		sb.WriteString(netip.AddrFrom4([4]byte{byte(i >> 8), byte(i), 0, 0}).String() + "/24\n")
	}
	c, err := ParseCrawlerRanges("op", "op-bench.txt", strings.NewReader(sb.String()))
	if err != nil {
		b.Fatal(err)
	}
	ips := []netip.Addr{netip.MustParseAddr("3.4.0.9"), netip.MustParseAddr("3.4.1.9"), netip.MustParseAddr("2001:db8::1")}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			c.Contains("op", ips[i%len(ips)])
			i++
		}
	})
}
