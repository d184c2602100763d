package enrich

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/oschwald/maxminddb-golang/v2"
)

// ASNDB maps an IP address to the autonomous system that announces it, from
// one or more sources tried in order. ASN 0 means unknown.
//
// The zero value and a nil *ASNDB hold no sources, so Lookup returns 0, "".
// Lookup is safe for concurrent use; Close must not run concurrently with it.
// Create one with OpenASN; most callers only need Lookup.
type ASNDB struct {
	sources []asnSource
}

type asnSource interface {
	lookup(ip netip.Addr) (asn uint32, org string)
	close() error
}

// OpenASN opens the ASN sources at paths, which Lookup tries in the order
// given. Each path is either
//   - a MaxMind DB (.mmdb, recognised by its metadata marker whatever its
//     name) whose database type names ASN or ISP data (GeoLite2-ASN,
//     GeoIP2-ISP, DBIP-ASN), read for the fields autonomous_system_number
//     and autonomous_system_organization; or
//   - an iptoasn TSV (ip2asn-v4.tsv, ip2asn-v6.tsv, ip2asn-combined.tsv,
//     optionally gzipped with a .gz name): tab-separated
//     "range_start range_end asn [country [description]]" with inclusive
//     ranges of one address family, which must not overlap. Rows with ASN 0
//     ("Not routed") are dropped; blank lines and lines starting with # are
//     skipped. The description becomes the organisation.
//
// It fails when paths is empty, and otherwise with an error naming the file
// (and, for a TSV, the line) that could not be opened or parsed; sources
// already opened are then closed.
func OpenASN(paths ...string) (*ASNDB, error) {
	if len(paths) == 0 {
		return nil, errors.New("enrich: OpenASN needs at least one .mmdb or iptoasn .tsv path")
	}
	db := &ASNDB{}
	for _, p := range paths {
		src, err := openASNSource(p)
		if err != nil {
			db.Close()
			return nil, err
		}
		db.sources = append(db.sources, src)
	}
	return db, nil
}

// Lookup returns the ASN of the first source that knows ip (an IPv4-mapped
// IPv6 address is looked up as IPv4, and an IPv6 zone is ignored), with
// that source's organisation name, which may be "". It returns 0, "" when
// no source knows ip, when ip is invalid, and for a nil or closed ASNDB. A
// MaxMind record without an ASN, or that fails to decode, counts as not
// found, so the next source is tried.
func (d *ASNDB) Lookup(ip netip.Addr) (asn uint32, org string) {
	if d == nil || !ip.IsValid() {
		return 0, ""
	}
	ip = ip.Unmap().WithZone("")
	for _, s := range d.sources {
		if asn, org = s.lookup(ip); asn != 0 {
			return asn, org
		}
	}
	return 0, ""
}

// Holds reports whether the data knows autonomous system asn's address
// space in ip's family (an iptoasn source lists ranges of it there) and
// whether ip lies in it (a source maps ip to asn). An iptoasn file lists
// every announced range, so an address outside asn's ranges is not asn's:
// a request claiming an operator's crawler from outside its ASNs' space is
// a false claim however unknown its own network (FakeCrawlerOptions.Holdings).
// An extract holds this only for the systems it lists whole. Nil-safe.
func (d *ASNDB) Holds(asn uint32, ip netip.Addr) (known, holds bool) {
	if d == nil || !ip.IsValid() {
		return false, false
	}
	ip = ip.Unmap().WithZone("")
	for _, s := range d.sources {
		if a, _ := s.lookup(ip); a == asn {
			holds = true
		}
		if t, ok := s.(*tsvSource); ok && t.families[asn]&family(ip) != 0 {
			known = true
		}
	}
	return known, holds
}

func family(ip netip.Addr) uint8 {
	if ip.Is4() {
		return 1
	}
	return 2
}

// Close releases the MaxMind databases (which are memory-mapped). Lookups
// afterwards return 0, "". Calling Close twice, or on a nil ASNDB, is safe.
func (d *ASNDB) Close() error {
	if d == nil {
		return nil
	}
	var errs []error
	for _, s := range d.sources {
		errs = append(errs, s.close())
	}
	d.sources = nil
	return errors.Join(errs...)
}

// mmdbMetadataMarker starts the metadata section of a MaxMind DB, which lies
// within the last 128 KiB of the file.
var mmdbMetadataMarker = []byte("\xab\xcd\xefMaxMind.com")

const mmdbMetadataMax = 128 << 10

func openASNSource(path string) (asnSource, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("enrich: open ASN source: %w", err)
	}
	defer f.Close()
	isMMDB, err := hasMMDBMarker(f)
	if err != nil {
		return nil, fmt.Errorf("enrich: read ASN source %s: %w", path, err)
	}
	if isMMDB {
		return openMMDB(path)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("enrich: read ASN source %s: %w", path, err)
	}
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("enrich: %s: not gzip data (name ends in .gz): %w", path, err)
		}
		defer zr.Close()
		r = zr
	}
	return loadIPToASN(path, r)
}

func hasMMDBMarker(f *os.File) (bool, error) {
	st, err := f.Stat()
	if err != nil {
		return false, err
	}
	off := max(st.Size()-mmdbMetadataMax, 0)
	buf := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil && err != io.EOF {
		return false, err
	}
	return bytes.Contains(buf, mmdbMetadataMarker), nil
}

type mmdbSource struct {
	r *maxminddb.Reader
}

func openMMDB(path string) (*mmdbSource, error) {
	r, err := maxminddb.Open(path)
	if err != nil {
		return nil, fmt.Errorf("enrich: open MaxMind DB %s: %w", path, err)
	}
	t := strings.ToUpper(r.Metadata.DatabaseType)
	if !strings.Contains(t, "ASN") && !strings.Contains(t, "ISP") {
		r.Close()
		return nil, fmt.Errorf("enrich: MaxMind DB %s has database type %q, which holds no ASNs (want GeoLite2-ASN or GeoIP2-ISP)",
			path, r.Metadata.DatabaseType)
	}
	return &mmdbSource{r: r}, nil
}

type mmdbASN struct {
	ASN uint32 `maxminddb:"autonomous_system_number"`
	Org string `maxminddb:"autonomous_system_organization"`
}

func (s *mmdbSource) lookup(ip netip.Addr) (uint32, string) {
	res := s.r.Lookup(ip)
	if !res.Found() {
		return 0, ""
	}
	var rec mmdbASN
	if err := res.Decode(&rec); err != nil {
		return 0, ""
	}
	return rec.ASN, rec.Org
}

func (s *mmdbSource) close() error { return s.r.Close() }

// ipRange is one row of an iptoasn table: lo..hi inclusive.
type ipRange struct {
	lo, hi netip.Addr
	asn    uint32
	org    string
	line   int // for overlap errors while loading
}

// tsvSource holds non-overlapping ranges sorted by lo. netip.Addr.Compare
// orders every IPv4 address before every IPv6 one, so one slice serves both.
type tsvSource struct {
	ranges []ipRange
	// families holds, per ASN, whether the source lists IPv4 (bit 0) and
	// IPv6 (bit 1) ranges of it: its address space is known there.
	families map[uint32]uint8
}

func loadIPToASN(name string, r io.Reader) (*tsvSource, error) {
	src := &tsvSource{}
	orgs := map[string]string{} // interned descriptions: many rows share one
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSuffix(sc.Text(), "\r")
		if strings.TrimSpace(text) == "" || strings.HasPrefix(text, "#") {
			continue
		}
		rg, err := parseIPToASNRow(text)
		if err != nil {
			return nil, fmt.Errorf("enrich: %s:%d: %w", name, line, err)
		}
		if rg.asn == 0 {
			continue
		}
		if o, ok := orgs[rg.org]; ok {
			rg.org = o
		} else {
			orgs[rg.org] = rg.org
		}
		rg.line = line
		src.ranges = append(src.ranges, rg)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("enrich: read %s after line %d: %w", name, line, err)
	}
	if len(src.ranges) == 0 {
		return nil, fmt.Errorf("enrich: %s: no ASN ranges in %d lines (want iptoasn TSV rows)", name, line)
	}
	slices.SortStableFunc(src.ranges, func(a, b ipRange) int { return a.lo.Compare(b.lo) })
	src.families = map[uint32]uint8{}
	for _, r := range src.ranges {
		src.families[r.asn] |= family(r.lo)
	}
	for i := 1; i < len(src.ranges); i++ {
		if prev, cur := src.ranges[i-1], src.ranges[i]; cur.lo.Compare(prev.hi) <= 0 {
			return nil, fmt.Errorf("enrich: %s:%d: range %v-%v overlaps %v-%v of line %d (iptoasn ranges must be disjoint)",
				name, cur.line, cur.lo, cur.hi, prev.lo, prev.hi, prev.line)
		}
	}
	return src, nil
}

func parseIPToASNRow(text string) (ipRange, error) {
	var rg ipRange
	f := strings.SplitN(text, "\t", 5)
	if len(f) < 3 {
		return rg, fmt.Errorf("%d tab-separated fields, want range_start range_end asn [country [description]]", len(f))
	}
	lo, err := netip.ParseAddr(f[0])
	if err != nil {
		return rg, fmt.Errorf("range_start: %w", err)
	}
	hi, err := netip.ParseAddr(f[1])
	if err != nil {
		return rg, fmt.Errorf("range_end: %w", err)
	}
	lo, hi = lo.Unmap().WithZone(""), hi.Unmap().WithZone("")
	if lo.Is4() != hi.Is4() {
		return rg, fmt.Errorf("range %v-%v mixes IPv4 and IPv6", lo, hi)
	}
	if lo.Compare(hi) > 0 {
		return rg, fmt.Errorf("range_start %v is after range_end %v", lo, hi)
	}
	asn, err := strconv.ParseUint(strings.TrimPrefix(f[2], "AS"), 10, 32)
	if err != nil {
		return rg, fmt.Errorf("asn %q is not a 32-bit number", f[2])
	}
	rg.lo, rg.hi, rg.asn = lo, hi, uint32(asn)
	if len(f) == 5 {
		rg.org = f[4]
	}
	return rg, nil
}

func (s *tsvSource) lookup(ip netip.Addr) (uint32, string) {
	// The last range starting at or before ip is the only one that can hold it.
	i, found := slices.BinarySearchFunc(s.ranges, ip, func(r ipRange, ip netip.Addr) int { return r.lo.Compare(ip) })
	if !found {
		i--
	}
	if i < 0 || ip.Compare(s.ranges[i].hi) > 0 {
		return 0, ""
	}
	return s.ranges[i].asn, s.ranges[i].org
}

func (s *tsvSource) close() error {
	s.ranges = nil
	return nil
}
