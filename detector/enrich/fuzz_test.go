package enrich

import (
	"net/netip"
	"strings"
	"testing"
)

// FuzzForUserAgent checks that any user agent gets a family, and a JA4 that
// is valid or "", the same way twice.
func FuzzForUserAgent(f *testing.F) {
	for _, ua := range []string{"", "-", "python-requests/2.31.0", "Go-http-client/1.1", "curl/8.0",
		"Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
		"Mozilla/5.0 (iPhone; CPU iPhone OS 17_1 like Mac OS X) AppleWebKit/605.1.15 CriOS/119.0 Safari/604.1",
		"Mozilla/5.0 (X11; Linux x86_64; rv:109.0) Gecko/20100101 Firefox/118.0", strings.Repeat("A", 600), "\xff\xfe"} {
		f.Add(ua)
	}
	tab := &JA4Table{byFamily: map[string][]string{
		"Python":           {"t13d181000_85036bcba153_d41ae481755e", "t13d4312h1_c7886603b240_b26ce05bbdd6"},
		"Chromium Browser": {"t13d1516h2_8daaf6152771_02713d6af862"},
	}}
	f.Fuzz(func(t *testing.T, ua string) {
		family := UAFamily(ua)
		if family == "" {
			t.Fatalf("UAFamily(%q) = \"\"", ua)
		}
		ja4, fam := tab.ForUserAgent(ua)
		if ja4 != "" && (!ValidJA4(ja4) || fam != family) || ja4 == "" && fam != FamilyUnknown {
			t.Fatalf("ForUserAgent(%q) = %q, %q (UAFamily %q)", ua, ja4, fam, family)
		}
		if j2, f2 := tab.ForUserAgent(ua); j2 != ja4 || f2 != fam {
			t.Fatalf("ForUserAgent(%q) not deterministic", ua)
		}
		_ = ValidJA4(ua) // any string: an answer, never a panic
	})
}

// FuzzLoadIPToASN checks that no input makes the iptoasn loader panic, and
// that a loaded table answers for both ends of each of its ranges.
func FuzzLoadIPToASN(f *testing.F) {
	f.Add("1.1.1.0\t1.1.1.0\t13335\tUS\tCLOUDFLARENET - Cloudflare, Inc.\n1.1.1.1\t1.1.1.1\t7497\tCN\tCSTNET\n")
	f.Add("# c\n\n2001:db8::\t2001:db8::ffff\t64502\tZZ\tTEST-6\r\n1.0.0.0\t1.0.0.255\t0\tNone\tNot routed\n")
	f.Add("1.0.0.0\t::1\t1\n")
	f.Add("::ffff:1.0.0.0\t1.0.0.9\tAS5\n")
	f.Fuzz(func(t *testing.T, in string) {
		src, err := loadIPToASN("fuzz.tsv", strings.NewReader(in))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "enrich: fuzz.tsv") && !strings.HasPrefix(err.Error(), "enrich: read fuzz.tsv") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		db := &ASNDB{sources: []asnSource{src}}
		for _, r := range src.ranges {
			for _, ip := range []netip.Addr{r.lo, r.hi} {
				if asn, _ := db.Lookup(ip); asn != r.asn {
					t.Fatalf("Lookup(%v) = %d, want %d", ip, asn, r.asn)
				}
			}
		}
	})
}
