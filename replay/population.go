package replay

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
)

// The address space and TLS fingerprints Inject draws from. Every address
// lies in a network that the shared ASN data maps to the ASN named beside
// it, so that the Enricher finds the intended ASN by its ordinary lookup:
// networks from GeoLite2-ASN-Test.mmdb (MaxMind's test database; known
// answers, not today's routing table) unless marked iptoasn, which come from
// ip2asn-v4-extract.tsv. The tests check each against the data.
type asnNet struct {
	asn    uint32
	prefix netip.Prefix
	org    string
}

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// residentialNets are 24 eyeball networks (cable, DSL, fibre and mobile
// carriers): the botnet's and the flash crowd's addresses. AS23693, also an
// eyeball network, is kept for the carrier-grade NAT so that its one address
// is the only traffic from that ASN.
var residentialNets = []asnNet{
	{7922, mustPrefix("73.0.0.0/8"), "Comcast Cable Communications"},
	{17676, mustPrefix("126.0.0.0/8"), "Softbank BB"},
	{6167, mustPrefix("97.128.0.0/9"), "Verizon Wireless"},
	{3320, mustPrefix("79.192.0.0/10"), "Deutsche Telekom"},
	{9808, mustPrefix("111.0.0.0/10"), "Guangdong Mobile"},
	{7018, mustPrefix("70.224.0.0/11"), "AT&T Services"},
	{701, mustPrefix("208.192.0.0/10"), "Verizon Business"},
	{4134, mustPrefix("183.0.0.0/10"), "Chinanet"},
	{4837, mustPrefix("27.192.0.0/11"), "China169 Backbone"},
	{12576, mustPrefix("31.64.0.0/10"), "Orange Personal Communications Services"},
	{22773, mustPrefix("70.160.0.0/11"), "Cox Communications"},
	{6389, mustPrefix("74.160.0.0/11"), "BellSouth.net"},
	{12322, mustPrefix("78.192.0.0/10"), "Free SAS"},
	{12844, mustPrefix("176.128.0.0/10"), "Bouygues Telecom"},
	{4713, mustPrefix("180.0.0.0/10"), "NTT Communications"},
	{209, mustPrefix("65.128.0.0/11"), "Qwest Communications"},
	{1221, mustPrefix("1.128.0.0/11"), "Telstra"},
	{9394, mustPrefix("36.192.0.0/11"), "China TieTong Telecommunications"},
	{45595, mustPrefix("39.32.0.0/11"), "Pakistan Telecom"},
	{4766, mustPrefix("59.0.0.0/11"), "Korea Telecom"},
	{15557, mustPrefix("77.128.0.0/11"), "SFR"},
	{2856, mustPrefix("81.128.0.0/11"), "BTnet UK Regional network"},
	{5410, mustPrefix("89.80.0.0/13"), "Bouygues Telecom ISP"},
	{7132, mustPrefix("71.136.0.0/15"), "AT&T Services (SBC)"},
}

var (
	// cgnatNet: a mobile carrier, whose subscribers share addresses.
	cgnatNet = asnNet{23693, mustPrefix("39.192.0.0/10"), "PT. Telekomunikasi Selular (Telkomsel)"}
	// stuffingNet: a data-centre host, where credential stuffers rent
	// servers; a /20, so at most 4 094 addresses.
	stuffingNet = asnNet{7381, mustPrefix("216.83.176.0/20"), "SunGard Availability Services"}
	// stuffingNetB: an ISP's business and hosting range, for a second
	// credential-stuffing scenario whose ASN no default scenario uses.
	stuffingNetB = asnNet{29518, mustPrefix("89.160.64.0/18"), "Bredband2 AB"}
	// scanNet: a transit and hosting network.
	scanNet = asnNet{174, mustPrefix("38.128.0.0/9"), "Cogent Communications"}
	// scraperNet: Google Cloud (iptoasn: 34.64.0.0-34.67.255.255).
	scraperNet = asnNet{15169, mustPrefix("34.64.0.0/14"), "Google LLC"}
	// uaFloodNet: Cloudflare's WARP egress (iptoasn: 104.29.0.0-104.30.255.255).
	uaFloodNet = asnNet{13335, mustPrefix("104.29.0.0/16"), "Cloudflare"}
)

// capacity is how many host addresses addrs can draw from n.
func (n asnNet) capacity() int {
	return 1<<(32-n.prefix.Bits()) - 2
}

// addrs draws k distinct IPv4 addresses from the networks, round robin, none
// ending in .0 or .255, none in taken (which it extends).
func addrs(rng *rand.Rand, k int, nets []asnNet, taken map[netip.Addr]bool) []string {
	out := make([]string, 0, k)
	for i := 0; len(out) < k; i++ {
		n := nets[i%len(nets)]
		base := n.prefix.Masked().Addr().As4()
		b := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
		size := uint32(1) << (32 - n.prefix.Bits())
		for {
			v := b + rng.Uint32N(size)
			if v&0xff == 0 || v&0xff == 0xff {
				continue
			}
			a := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
			if taken[a] {
				continue
			}
			taken[a] = true
			out = append(out, a.String())
			break
		}
	}
	return out
}

// JA4 TLS client fingerprints (FoxIO JA4, BSD-3-Clause): from
// ja4-known-clients.tsv (FoxIO's ja4plus-mapping) and
// ja4-client-fingerprints.tsv (the JA4 reference captures) in the shared
// data. All pass enrich.ValidJA4; the tests check that too.
const (
	// JA4IcedID is the IcedID malware loader's fingerprint
	// (ja4-known-clients.tsv): the default Botnet's. No user agent maps to
	// it, so no background request shares it.
	JA4IcedID = "t13d201100_2b729b4bf6f3_9e7b989ebec8"
	// JA4Go is Go's crypto/tls (ja4-known-clients.tsv, GoLang): the URI
	// scanner's, a Go tool.
	JA4Go = "t13d190900_9dc949149365_97f8aa674fd9"
	// JA4Python is a Python TLS stack (ja4-known-clients.tsv, Python): the
	// UA-switching flood's, a script rotating user agents.
	JA4Python = "t13d4312h1_c7886603b240_b26ce05bbdd6"
	// JA4CobaltStrike is a Cobalt Strike 4.9.1 beacon's on Windows 10
	// (ja4-known-clients.tsv): the low-and-slow botnet's in the eval. No
	// user agent maps to it.
	JA4CobaltStrike = "t12d210800_76e208dd3e22_16bbda4055b2"
)

// browserJA4s are the fingerprints of real browsers over TCP or QUIC with
// SNI, by the family the user agent claims: the CGNAT's and the flash
// crowd's users send the one that matches their browser.
var browserJA4s = map[string][]string{
	"chrome": {
		"t13d1516h2_8daaf6152771_02713d6af862", // known-clients: Chromium Browser
		"t13d1517h2_8daaf6152771_b0da82dd1658", // known-clients: Chromium Browser
		"t13d1517h2_8daaf6152771_b1ff8ab2d16f", // known-clients: Chromium Browser
		"q13d0312h3_55b375c5d22e_06cda9e17597", // known-clients: Chromium Browser over QUIC
		"t13d1516h2_8daaf6152771_e5627efa2ab1", // captures: Chrome and Edge (tls-handshake, browsers-x509)
		"t13d1516h2_8daaf6152771_9b887d9acb53", // captures: latest.pcapng (app.slack.com)
		"t13d1515h2_8daaf6152771_f37e75b10bcc", // captures: tls-handshake (js.monitor.azure.com)
		"t13d1516h1_8daaf6152771_e5627efa2ab1", // captures: tls-handshake, HTTP/1.1 ALPN
		"t13d1517h1_8daaf6152771_6cdcb247c39b", // captures: tls-handshake, HTTP/1.1 ALPN
	},
	"firefox": {
		"t13d1715h2_5b57614c22b0_7121afd63204", // known-clients: Mozilla Firefox
		"t13d1715h2_5b57614c22b0_3d5424432f57", // captures
	},
	"safari": {
		"t13d2014h2_a09f3c656075_14788d8d241b", // known-clients: Safari
	},
}

// browserUA returns the user agent of a browser, drawn from a space of
// millions (browser, version, build, platform), and its family, a key of
// browserJA4s.
func browserUA(rng *rand.Rand) (ua, family string) {
	chrome := func() string {
		return fmt.Sprintf("Chrome/%d.0.%d.%d", 109+rng.IntN(23), 5000+rng.IntN(2000), rng.IntN(200))
	}
	switch p := rng.IntN(100); {
	case p < 22:
		return "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) " + chrome() + " Safari/537.36", "chrome"
	case p < 30:
		return fmt.Sprintf("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) %s Safari/537.36 Edg/%d.0.%d.%d",
			chrome(), 109+rng.IntN(23), 1500+rng.IntN(1000), rng.IntN(100)), "chrome"
	case p < 37:
		return "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) " + chrome() + " Safari/537.36", "chrome"
	case p < 40:
		return "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) " + chrome() + " Safari/537.36", "chrome"
	case p < 62:
		return fmt.Sprintf("Mozilla/5.0 (Linux; Android %d; %s) AppleWebKit/537.36 (KHTML, like Gecko) %s Mobile Safari/537.36",
			10+rng.IntN(5), androidModels[rng.IntN(len(androidModels))], chrome()), "chrome"
	case p < 72:
		v := 102 + rng.IntN(30)
		return fmt.Sprintf("Mozilla/5.0 (%s; rv:%d.0) Gecko/20100101 Firefox/%d.0", firefoxPlatforms[rng.IntN(len(firefoxPlatforms))], v, v), "firefox"
	case p < 76:
		v := 102 + rng.IntN(30)
		return fmt.Sprintf("Mozilla/5.0 (Android %d; Mobile; rv:%d.0) Gecko/%d.0 Firefox/%d.0", 10+rng.IntN(5), v, v, v), "firefox"
	case p < 94:
		major, minor := 15+rng.IntN(4), rng.IntN(7)
		return fmt.Sprintf("Mozilla/5.0 (iPhone; CPU iPhone OS %d_%d like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/%d.%d Mobile/15E148 Safari/604.1",
			major, minor, major, minor), "safari"
	default:
		return fmt.Sprintf("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/%d.%d Safari/605.1.15",
			15+rng.IntN(4), rng.IntN(7)), "safari"
	}
}

var (
	androidModels    = []string{"SM-G991B", "SM-A515F", "Pixel 7", "Pixel 6a", "M2101K6G", "CPH2219", "moto g(30)", "SM-S918B", "RMX3085", "V2111"}
	firefoxPlatforms = []string{"Windows NT 10.0; Win64; x64", "Macintosh; Intel Mac OS X 10.15", "X11; Linux x86_64", "X11; Ubuntu; Linux x86_64"}
)

// browser returns a browser user agent and a JA4 of its family.
func browser(rng *rand.Rand) (ua, ja4 string) {
	ua, family := browserUA(rng)
	fps := browserJA4s[family]
	return ua, fps[rng.IntN(len(fps))]
}

// sitePaths gives the paths of ordinary browsing: pages, search and assets.
func sitePath(rng *rand.Rand) string {
	switch p := rng.IntN(20); {
	case p < 4:
		return "/"
	case p < 6:
		return "/about"
	case p < 9:
		return fmt.Sprintf("/blog/%d", 1+rng.IntN(300))
	case p < 12:
		return fmt.Sprintf("/products/%d", 1+rng.IntN(2000))
	case p < 13:
		return fmt.Sprintf("/search?q=%s", searchWords[rng.IntN(len(searchWords))])
	case p < 15:
		return "/static/app.js"
	case p < 17:
		return "/static/style.css"
	case p < 18:
		return "/favicon.ico"
	default:
		return fmt.Sprintf("/images/%d.jpg", 1+rng.IntN(500))
	}
}

var searchWords = []string{"shoes", "laptop", "rate+limit", "kafka", "redis", "coffee", "gift", "sale", "news", "weather"}

// browseStatus is the status of an ordinary page view.
func browseStatus(rng *rand.Rand) int {
	switch p := rng.IntN(100); {
	case p < 85:
		return 200
	case p < 97:
		return 304
	default:
		return 404
	}
}
