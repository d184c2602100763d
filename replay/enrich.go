package replay

import (
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sluice-rl/sluice/detector/enrich"
	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/sketch"
)

// Enricher adds to a replayed request what access logs lack, deterministically:
//
//   - region: xxhash64 of the normalised client address, modulo the number
//     of regions, so one client always lands in one region;
//   - ASN: from the MaxMind GeoLite2-ASN test database, then the iptoasn
//     extract (Google and Cloudflare ranges), where they cover the address;
//     unknown otherwise;
//   - JA4: the request's own JA4 when it has one (injected traffic), absent
//     when that is not a valid JA4 (enrich.ValidJA4); otherwise a TLS client
//     fingerprint chosen by user-agent family from the FoxIO JA4+ mapping
//     (ja4-known-clients.tsv), absent for families the mapping lacks;
//   - client IP: canonical form, IPv4-mapped IPv6 as IPv4, IPv6 cut to /64;
//     a host name (the NASA log) is kept as it is;
//   - route: the path without its query string when the request names none.
//
// The zero value enriches region and client IP only.
type Enricher struct {
	Regions []string
	ASN     *enrich.ASNDB
	JA4     *enrich.JA4Table
}

// OpenEnricher loads the ASN databases and the JA4 table from dataDir (the
// shared data folder). Files that are missing are skipped; the returned note
// says what was loaded.
func OpenEnricher(dataDir string, regions []string) (*Enricher, string) {
	e := &Enricher{Regions: regions}
	if dataDir == "" {
		return e, "none (no data folder): region from the client hash only"
	}
	var notes []string
	if db, err := enrich.OpenASN(filepath.Join(dataDir, "asn", "GeoLite2-ASN-Test.mmdb"), filepath.Join(dataDir, "asn", "ip2asn-v4-extract.tsv")); err == nil {
		e.ASN = db
		notes = append(notes, "ASN from MaxMind GeoLite2-ASN test DB + iptoasn extract")
	} else {
		notes = append(notes, "no ASN ("+err.Error()+")")
	}
	if t, err := enrich.LoadJA4(filepath.Join(dataDir, "ja4", "ja4-known-clients.tsv")); err == nil {
		e.JA4 = t
		notes = append(notes, "JA4 by user-agent family from ja4-known-clients.tsv")
	} else {
		notes = append(notes, "no JA4 ("+err.Error()+")")
	}
	return e, strings.Join(notes, "; ")
}

// Region returns the index of the region a client address belongs to.
func (e *Enricher) Region(client string) int {
	return RegionOf(rules.NormalizeIP(client, 64), len(e.Regions))
}

// RegionOf hashes a normalised client address to one of n regions.
func RegionOf(client string, n int) int {
	return int(sketch.Hash64(client) % uint64(max(n, 1)))
}

// Request turns a replayed request into an enforcer request and its region.
func (e *Enricher) Request(domain string, id string, r *Request) (int, enforcer.Request) {
	ip := rules.NormalizeIP(r.Client, 64)
	q := enforcer.Request{Domain: domain, Now: r.Time, Cost: r.Cost, RequestID: id, UserAgent: r.UserAgent, Status: uint32(r.Status)}
	d := &q.Descriptors
	d[rules.KeyClientIP] = ip
	d[rules.KeyAPIKey], d[rules.KeyUser], d[rules.KeyTenant] = r.APIKey, r.User, r.Tenant
	d[rules.KeyMethod], d[rules.KeyPath] = r.Method, r.Path
	d[rules.KeyRoute] = r.Route
	if d[rules.KeyRoute] == "" {
		d[rules.KeyRoute], _, _ = strings.Cut(r.Path, "?")
	}
	if a, err := netip.ParseAddr(r.Client); err == nil && e.ASN != nil {
		if asn, _ := e.ASN.Lookup(a); asn != 0 {
			d[rules.KeyASN] = strconv.FormatUint(uint64(asn), 10)
		}
	}
	switch {
	case r.JA4 != "":
		if enrich.ValidJA4(r.JA4) {
			d[rules.KeyJA4] = r.JA4
		}
	case e.JA4 != nil && r.UserAgent != "":
		d[rules.KeyJA4], _ = e.JA4.ForUserAgent(r.UserAgent)
	}
	return RegionOf(ip, len(e.Regions)), q
}

// Close releases the ASN databases.
func (e *Enricher) Close() error {
	if e.ASN != nil {
		return e.ASN.Close()
	}
	return nil
}
