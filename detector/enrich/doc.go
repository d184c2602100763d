// Package enrich adds to replayed log entries what access logs lack, the
// same way on every run: the client's autonomous system (ASNDB, from
// MaxMind .mmdb files or iptoasn TSV tables) and a plausible JA4 TLS client
// fingerprint for its user agent (JA4Table, from FoxIO's mapping of known
// clients).
//
// Nothing here is random: an IP address always maps to the same ASN for the
// same sources, and a user agent string to the same JA4 for the same table
// (an xxhash of the user agent picks among the family's fingerprints).
// UAFamily documents how user agents map to TLS client families.
//
// # Usage
//
//	asns, err := enrich.OpenASN("GeoLite2-ASN.mmdb", "ip2asn-v4.tsv")
//	if err != nil {
//		return err
//	}
//	defer asns.Close()
//	ja4s, err := enrich.LoadJA4("ja4-known-clients.tsv")
//	if err != nil {
//		return err
//	}
//
//	addr, _ := netip.ParseAddr(entry.Client) // hostnames stay ASN 0
//	asn, org := asns.Lookup(addr)            // 0, "" when no source knows addr
//	ja4, family := ja4s.ForUserAgent(entry.UserAgent)
//	// "python-requests/2.31.0" gives "t13d181000_85036bcba153_d41ae481755e", "Python";
//	// "curl/8.0" gives "", "unknown": the table has no curl fingerprint.
package enrich
