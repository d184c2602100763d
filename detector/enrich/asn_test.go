package enrich

import (
	"compress/gzip"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// sharedData returns ../shared/data, skipping the test when it is absent.
func sharedData(t testing.TB) string {
	t.Helper()
	data, err := FindData(".")
	if err != nil {
		t.Skipf("../shared/data absent: %v", err)
	}
	return data
}

func asnFile(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join(sharedData(t), "asn", name)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("../shared/data absent: %v", err)
	}
	return p
}

// writeFile writes a hand-written fixture into a temporary directory.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

type asnCase struct {
	ip  string
	asn uint32
	org string
}

func checkLookups(t *testing.T, db *ASNDB, cases []asnCase) {
	t.Helper()
	for _, c := range cases {
		asn, org := db.Lookup(netip.MustParseAddr(c.ip))
		if asn != c.asn || org != c.org {
			t.Errorf("Lookup(%s) = %d, %q; want %d, %q", c.ip, asn, org, c.asn, c.org)
		}
	}
}

// TestASNMaxMind checks known answers of MaxMind's GeoLite2-ASN test
// database (from GeoLite2-ASN-Test.json beside it).
func TestASNMaxMind(t *testing.T) {
	db, err := OpenASN(asnFile(t, "GeoLite2-ASN-Test.mmdb"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	checkLookups(t, db, []asnCase{
		{"1.0.0.1", 15169, "Google Inc."},          // 1.0.0.0/24
		{"1.128.0.1", 1221, "Telstra Pty Ltd"},     // 1.128.0.0/11
		{"1.159.255.255", 1221, "Telstra Pty Ltd"}, // last address of 1.128.0.0/11
		{"12.81.96.5", 7018, ""},                   // 12.81.96.0/19 has no organisation
		{"2001:1700::1", 6730, "Sunrise Communications AG"},
		{"2600:7000::1", 6939, "Hurricane Electric, Inc."},
		{"::ffff:1.0.0.1", 15169, "Google Inc."}, // IPv4-mapped looks up as IPv4
		{"fe80::1%eth0", 0, ""},
		{"1.2.3.4", 0, ""},
		{"1.1.1.1", 0, ""},
	})
	if asn, org := db.Lookup(netip.Addr{}); asn != 0 || org != "" {
		t.Errorf("Lookup(invalid) = %d, %q", asn, org)
	}
}

// TestASNISP checks that a GeoIP2-ISP database works and that its records
// without an ASN count as not found.
func TestASNISP(t *testing.T) {
	db, err := OpenASN(asnFile(t, "GeoIP2-ISP-Test.mmdb"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	checkLookups(t, db, []asnCase{
		{"1.128.0.1", 1221, "Telstra Pty Ltd"},
		{"1.0.128.1", 0, ""}, // isp "TOT Public Company Limited", no ASN
		{"2001:1700::1", 6730, "Sunrise Communications AG"},
	})
}

func TestASNIPToASN(t *testing.T) {
	db, err := OpenASN(asnFile(t, "ip2asn-v4-extract.tsv"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const cf, google = "CLOUDFLARENET - Cloudflare, Inc.", "GOOGLE - Google LLC"
	checkLookups(t, db, []asnCase{
		{"1.1.1.0", 13335, cf},
		{"1.1.1.1", 7497, "CSTNET-AS-AP Computer Network Information Center"},
		{"1.1.1.2", 13335, cf},
		{"1.1.1.255", 13335, cf},
		{"8.8.8.8", 15169, google},
		{"66.249.66.1", 15169, google}, // Googlebot
		{"::ffff:1.1.1.1", 7497, "CSTNET-AS-AP Computer Network Information Center"},
		{"::ffff:8.8.4.4", 15169, google},
		{"0.0.0.0", 0, ""},
		{"9.9.9.9", 0, ""},
		{"255.255.255.255", 0, ""},
		{"2001:4860:4860::8888", 0, ""}, // Google, but the extract is IPv4 only
	})
}

// TestASNOrder checks that sources are tried in the order given, and that a
// source that does not know an address passes it on.
func TestASNOrder(t *testing.T) {
	mmdb := asnFile(t, "GeoLite2-ASN-Test.mmdb")
	isp := asnFile(t, "GeoIP2-ISP-Test.mmdb")
	tsv := writeFile(t, "test.tsv", "# hand-written\n1.0.0.0\t1.0.0.255\t64500\tZZ\tTEST-A\n1.0.128.0\t1.0.128.255\t64501\tZZ\tTEST-B\n"+
		"2001:db8::\t2001:db8::ffff\t64502\tZZ\tTEST-6\n")
	tests := []struct {
		name  string
		paths []string
		cases []asnCase
	}{
		{"mmdb first", []string{mmdb, tsv}, []asnCase{{"1.0.0.1", 15169, "Google Inc."}, {"1.0.128.1", 64501, "TEST-B"}, {"2001:db8::1", 64502, "TEST-6"}}},
		{"tsv first", []string{tsv, mmdb}, []asnCase{{"1.0.0.1", 64500, "TEST-A"}, {"1.128.0.1", 1221, "Telstra Pty Ltd"}}},
		{"ISP record without ASN falls through", []string{isp, tsv}, []asnCase{{"1.0.128.1", 64501, "TEST-B"}, {"1.128.0.1", 1221, "Telstra Pty Ltd"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db, err := OpenASN(tt.paths...)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			checkLookups(t, db, tt.cases)
		})
	}
}

func TestASNGzip(t *testing.T) {
	p := filepath.Join(t.TempDir(), "ip2asn-v4.tsv.gz")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	zw := gzip.NewWriter(f)
	zw.Write([]byte("1.0.0.0\t1.0.0.255\t13335\tUS\tCLOUDFLARENET\n2.0.0.0\t2.0.0.255\t0\tNone\tNot routed\n"))
	zw.Close()
	f.Close()
	db, err := OpenASN(p)
	if err != nil {
		t.Fatal(err)
	}
	checkLookups(t, db, []asnCase{{"1.0.0.9", 13335, "CLOUDFLARENET"}, {"2.0.0.1", 0, ""}})
}

func TestASNErrors(t *testing.T) {
	anon := asnFile(t, "GeoIP2-Anonymous-IP-Test.mmdb")
	tests := []struct {
		name    string
		content string // written to bad.tsv unless path is set
		path    string
		want    []string // substrings of the error
	}{
		{name: "missing file", path: "/nonexistent/asn.mmdb", want: []string{"/nonexistent/asn.mmdb", "no such file"}},
		{name: "not an ASN database", path: anon, want: []string{anon, "GeoIP2-Anonymous-IP", "holds no ASNs"}},
		{name: "empty", content: "# nothing\n\n", want: []string{"bad.tsv", "no ASN ranges"}},
		{name: "too few fields", content: "1.0.0.0\t1.0.0.255\n", want: []string{"bad.tsv:1", "2 tab-separated fields"}},
		{name: "space-separated", content: "1.0.0.0 1.0.0.255 13335 US X\n", want: []string{"bad.tsv:1", "1 tab-separated fields"}},
		{name: "bad start", content: "# c\n1.0.0\t1.0.0.255\t13335\tUS\tX\n", want: []string{"bad.tsv:2", "range_start"}},
		{name: "bad end", content: "1.0.0.0\tx\t13335\tUS\tX\n", want: []string{"bad.tsv:1", "range_end"}},
		{name: "mixed families", content: "1.0.0.0\t::1\t13335\tUS\tX\n", want: []string{"bad.tsv:1", "mixes IPv4 and IPv6"}},
		{name: "reversed", content: "1.0.0.9\t1.0.0.1\t13335\tUS\tX\n", want: []string{"bad.tsv:1", "after range_end"}},
		{name: "bad asn", content: "1.0.0.0\t1.0.0.255\t4294967296\tUS\tX\n", want: []string{"bad.tsv:1", "not a 32-bit number"}},
		{name: "overlap", content: "1.0.0.0\t1.0.0.255\t1\tUS\tX\n1.0.1.0\t1.0.1.255\t2\tUS\tY\n1.0.0.128\t1.0.1.0\t3\tUS\tZ\n",
			want: []string{"bad.tsv:3", "overlaps 1.0.0.0-1.0.0.255 of line 1"}},
		{name: "gz name, not gzip", content: "1.0.0.0\t1.0.0.255\t1\tUS\tX\n", path: "bad.tsv.gz", want: []string{"bad.tsv.gz", "not gzip"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := tt.path
			if tt.content != "" || p == "" || strings.HasSuffix(p, ".gz") {
				name := "bad.tsv"
				if p != "" {
					name = p
				}
				p = writeFile(t, name, tt.content)
			}
			db, err := OpenASN(p)
			if err == nil {
				db.Close()
				t.Fatal("OpenASN succeeded, want an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
	if _, err := OpenASN(); err == nil {
		t.Error("OpenASN() with no paths succeeded")
	}
}

func TestASNNilAndClosed(t *testing.T) {
	var nilDB *ASNDB
	if asn, org := nilDB.Lookup(netip.MustParseAddr("1.1.1.1")); asn != 0 || org != "" {
		t.Errorf("nil Lookup = %d, %q", asn, org)
	}
	if err := nilDB.Close(); err != nil {
		t.Errorf("nil Close = %v", err)
	}
	var zero ASNDB
	if asn, _ := zero.Lookup(netip.MustParseAddr("1.1.1.1")); asn != 0 {
		t.Errorf("zero Lookup = %d", asn)
	}

	db, err := OpenASN(asnFile(t, "GeoLite2-ASN-Test.mmdb"), asnFile(t, "ip2asn-v4-extract.tsv"))
	if err != nil {
		t.Fatal(err)
	}
	if asn, _ := db.Lookup(netip.MustParseAddr("1.1.1.1")); asn != 7497 {
		t.Fatalf("Lookup before Close = %d", asn)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	for _, ip := range []string{"1.1.1.1", "1.0.0.1"} {
		if asn, org := db.Lookup(netip.MustParseAddr(ip)); asn != 0 || org != "" {
			t.Errorf("Lookup(%s) after Close = %d, %q", ip, asn, org)
		}
	}
}

func TestASNConcurrentLookup(t *testing.T) {
	db, err := OpenASN(asnFile(t, "GeoLite2-ASN-Test.mmdb"), asnFile(t, "ip2asn-v4-extract.tsv"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				if asn, _ := db.Lookup(netip.MustParseAddr("1.1.1.1")); asn != 7497 {
					t.Errorf("Lookup = %d", asn)
					return
				}
				if asn, _ := db.Lookup(netip.MustParseAddr("1.0.0.1")); asn != 15169 {
					t.Errorf("Lookup = %d", asn)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func BenchmarkASNLookup(b *testing.B) {
	for _, src := range []string{"GeoLite2-ASN-Test.mmdb", "ip2asn-v4-extract.tsv"} {
		b.Run(src, func(b *testing.B) {
			db, err := OpenASN(asnFile(b, src))
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			ips := []netip.Addr{netip.MustParseAddr("1.0.0.1"), netip.MustParseAddr("66.249.66.1"), netip.MustParseAddr("1.128.0.1"), netip.MustParseAddr("203.0.113.9")}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					db.Lookup(ips[i%len(ips)])
					i++
				}
			})
		})
	}
}
