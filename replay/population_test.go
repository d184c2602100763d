package replay

import (
	"bufio"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/detector/enrich"
)

// Every network Inject draws from maps to its ASN in the shared data, at
// its first and last host and at random ones, through the lookup the
// Enricher uses.
func TestInjectNetworksMapToTheirASN(t *testing.T) {
	data, err := enrich.FindData(".")
	if err != nil {
		t.Skipf("../shared/data absent (%v)", err)
	}
	en, note := OpenEnricher(data, nil)
	defer en.Close()
	if en.ASN == nil {
		t.Fatal(note)
	}
	nets := append([]asnNet{cgnatNet, stuffingNet, stuffingNetB, scanNet, scraperNet, uaFloodNet}, residentialNets...)
	asns := map[uint32]bool{}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range nets {
		if asns[n.asn] {
			t.Errorf("AS%d listed twice", n.asn)
		}
		asns[n.asn] = true
		first := n.prefix.Masked().Addr().Next()
		b := first.As4()
		v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) + uint32(n.capacity()) - 1
		last := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
		if !n.prefix.Contains(last) || !n.prefix.Contains(last.Next()) || n.prefix.Contains(last.Next().Next()) {
			t.Fatalf("%v: %v is not its last host", n.prefix, last)
		}
		check := []netip.Addr{first, last}
		for _, s := range addrs(rng, 200, []asnNet{n}, map[netip.Addr]bool{}) {
			a := netip.MustParseAddr(s)
			if !n.prefix.Contains(a) {
				t.Fatalf("%s drawn outside %v", s, n.prefix)
			}
			check = append(check, a)
		}
		for _, a := range check {
			if got, _ := en.ASN.Lookup(a); got != n.asn {
				t.Errorf("%v (%s, %v): ASN %d, want %d", a, n.org, n.prefix, got, n.asn)
			}
		}
	}
	if len(residentialNets) < 20 {
		t.Errorf("%d residential ASNs, want at least 20", len(residentialNets))
	}
}

// Every JA4 Inject sends is a valid JA4 found in the shared JA4 files.
func TestInjectJA4sAreReal(t *testing.T) {
	all := []string{JA4IcedID, JA4Go, JA4Python, JA4CobaltStrike}
	for _, fps := range browserJA4s {
		all = append(all, fps...)
	}
	for _, fp := range all {
		if !enrich.ValidJA4(fp) {
			t.Errorf("%q is not a valid JA4", fp)
		}
	}
	data, err := enrich.FindData(".")
	if err != nil {
		t.Skipf("../shared/data absent (%v)", err)
	}
	known := map[string]bool{}
	for _, name := range []string{"ja4-known-clients.tsv", "ja4-client-fingerprints.tsv"} {
		f, err := os.Open(filepath.Join(data, "ja4", name))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Split(sc.Text(), "\t")
			known[strings.TrimSpace(fields[len(fields)-1])] = true
		}
		f.Close()
	}
	for _, fp := range all {
		if !known[fp] {
			t.Errorf("%s is in neither JA4 file", fp)
		}
	}
	// No user agent family maps to the botnet's fingerprint.
	tbl, err := enrich.LoadJA4(filepath.Join(data, "ja4", "ja4-known-clients.tsv"))
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range []string{"Python", "GoLang", "Chromium Browser", "Mozilla Firefox", "Safari", "WinINET", "curl", "Java"} {
		for _, fp := range tbl.Fingerprints(fam) {
			if fp == JA4IcedID {
				t.Errorf("family %s can be given the botnet's JA4", fam)
			}
		}
	}
}
