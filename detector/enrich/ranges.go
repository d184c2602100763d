package enrich

import (
	"bufio"
	_ "embed"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// CrawlerRanges holds the address ranges crawler operators publish for
// verifying their crawlers (Google's googlebot.json, Bing's bingbot.json,
// OpenAI's gptbot.json, ...), as CIDR lists per operator, IPv4 and IPv6.
//
// The zero value and a nil *CrawlerRanges hold no operator: Has reports
// false and Contains reports not-covered. A CrawlerRanges is immutable once
// loaded and safe for concurrent use. Load it with LoadCrawlerRanges; most
// callers want Has and Contains.
type CrawlerRanges struct {
	ops map[string]*operatorRanges
}

type operatorRanges struct {
	v4, v6        []cidrRange // sorted by lo, merged: no overlaps
	files4, file6 []string    // the files that gave v4 and v6 ranges, sorted
}

// cidrRange is an inclusive range of addresses as two 128-bit halves (IPv4 as
// IPv4-mapped IPv6, so one comparison serves both).
type cidrRange struct{ lo, hi crawlerAddr }

type crawlerAddr struct{ hi, lo uint64 }

func (a crawlerAddr) less(b crawlerAddr) bool { return a.hi < b.hi || a.hi == b.hi && a.lo < b.lo }

func toCrawlerAddr(a netip.Addr) crawlerAddr {
	b := a.As16()
	var x crawlerAddr
	for i := 0; i < 8; i++ {
		x.hi = x.hi<<8 | uint64(b[i])
		x.lo = x.lo<<8 | uint64(b[8+i])
	}
	return x
}

//go:embed crawler-ranges.txt
var defaultRanges string

// DefaultCrawlerRanges returns the ranges sluice ships: none. The embedded
// crawler-ranges.txt documents the format only; operators' lists change
// weekly and are theirs, so load current ones with LoadCrawlerRanges.
func DefaultCrawlerRanges() *CrawlerRanges {
	c := &CrawlerRanges{ops: map[string]*operatorRanges{}}
	if err := c.add("example", "crawler-ranges.txt", strings.NewReader(defaultRanges)); err != nil {
		panic(err) // TestDefaultCrawlerRanges parses it
	}
	if o := c.ops["example"]; len(o.v4)+len(o.v6) == 0 {
		delete(c.ops, "example")
	}
	return c
}

// MinCrawlerPrefix4 and MinCrawlerPrefix6 are the broadest ranges a
// crawler list may hold: Google's and Bing's are /19 to /28 (IPv4) and /48 to
// /64 (IPv6); a /0 would verify every claim, exempting any client that says
// Googlebot from the volume, shape and content signals.
const (
	MinCrawlerPrefix4 = 8
	MinCrawlerPrefix6 = 16
)

// LoadCrawlerRanges reads every file named <operator>-*.txt in dir
// (googlebot-ipv4.txt, googlebot-ipv6.txt, bingbot-ipv4.txt,
// openai-ipv4.txt: operator googlebot, bingbot, openai) into one
// CrawlerRanges. Each file holds one CIDR a line (192.0.2.0/24,
// 2001:db8::/32; a bare address is a /32 or /128); '#' starts a comment, and
// blank lines are skipped. Other files in dir are ignored.
//
// It fails naming the file and line on a line that is not a CIDR, has host
// bits set or is broader than MinCrawlerPrefix4 or MinCrawlerPrefix6; on a
// file named with no operator or that is a directory; when dir is missing or
// not a folder, and when it has no such file.
func LoadCrawlerRanges(dir string) (*CrawlerRanges, error) {
	if st, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("enrich: crawler ranges: %w", err)
	} else if !st.IsDir() {
		return nil, fmt.Errorf("enrich: crawler ranges: %s is not a folder (want a folder of <operator>-*.txt files)", dir)
	}
	names, err := filepath.Glob(filepath.Join(dir, "*-*.txt"))
	if err != nil {
		return nil, fmt.Errorf("enrich: crawler ranges in %s: %w", dir, err)
	}
	c := &CrawlerRanges{ops: map[string]*operatorRanges{}}
	for _, path := range names {
		base := filepath.Base(path)
		op, _, _ := strings.Cut(base, "-")
		if op == "" {
			return nil, fmt.Errorf("enrich: crawler ranges: %s names no operator (want <operator>-*.txt, e.g. googlebot-ipv4.txt)", path)
		}
		if st, err := os.Stat(path); err == nil && st.IsDir() {
			return nil, fmt.Errorf("enrich: crawler ranges: %s is a directory (want a file, one CIDR a line)", path)
		}
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("enrich: crawler ranges: %w", err)
		}
		err = c.add(strings.ToLower(op), path, f)
		f.Close()
		if err != nil {
			return nil, err
		}
	}
	if len(c.ops) == 0 {
		return nil, fmt.Errorf("enrich: crawler ranges: no <operator>-*.txt file in %s (want e.g. googlebot-ipv4.txt, one CIDR a line)", dir)
	}
	return c, nil
}

// ParseCrawlerRanges reads one operator's ranges from r in the format
// LoadCrawlerRanges describes; name is the file's name for errors and for
// Contains.
func ParseCrawlerRanges(operator, name string, r io.Reader) (*CrawlerRanges, error) {
	c := &CrawlerRanges{ops: map[string]*operatorRanges{}}
	if err := c.add(strings.ToLower(operator), name, r); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *CrawlerRanges) add(op, name string, r io.Reader) error {
	o := c.ops[op]
	if o == nil {
		o = &operatorRanges{}
		c.ops[op] = o
	}
	sc := bufio.NewScanner(r)
	line := 0
	var v4, v6 bool
	for sc.Scan() {
		line++
		text := sc.Text()
		if i := strings.IndexByte(text, '#'); i >= 0 {
			text = text[:i]
		}
		text = strings.TrimSpace(text)
		if text == "" {
			continue
		}
		var p netip.Prefix
		var err error
		if strings.Contains(text, "/") {
			p, err = netip.ParsePrefix(text)
		} else {
			var a netip.Addr
			a, err = netip.ParseAddr(text)
			if err == nil {
				p = netip.PrefixFrom(a, a.BitLen())
			}
		}
		if err != nil || p.Addr().Zone() != "" {
			return fmt.Errorf("enrich: %s:%d: %q is not a CIDR (want one a line, e.g. 66.249.64.0/27 or 2001:4860:4801:10::/64)", name, line, text)
		}
		if m := p.Masked(); m != p {
			return fmt.Errorf("enrich: %s:%d: %q has host bits set (the network is %s): a published range is a network", name, line, text, m)
		}
		if a := p.Addr().Unmap(); a.Is4() && p.Bits()-(p.Addr().BitLen()-32) < MinCrawlerPrefix4 || a.Is6() && p.Bits() < MinCrawlerPrefix6 {
			return fmt.Errorf("enrich: %s:%d: %q is broader than any crawler's range (want /%d or longer for IPv4, /%d for IPv6): it would verify every claim from it", name, line, text, MinCrawlerPrefix4, MinCrawlerPrefix6)
		}
		p = p.Masked()
		a := p.Addr().Unmap()
		bits := p.Bits()
		if p.Addr().Is4In6() {
			bits -= 96 // masked, a prefix shorter than /96 is no longer IPv4-mapped
		}
		lo := a
		hi := lastAddr(netip.PrefixFrom(a, bits))
		rg := cidrRange{lo: toCrawlerAddr(netip.AddrFrom16(lo.As16())), hi: toCrawlerAddr(netip.AddrFrom16(hi.As16()))}
		if a.Is4() {
			o.v4 = append(o.v4, rg)
			v4 = true
		} else {
			o.v6 = append(o.v6, rg)
			v6 = true
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("enrich: read %s after line %d: %w", name, line, err)
	}
	base := filepath.Base(name)
	if v4 && !slices.Contains(o.files4, base) {
		o.files4 = append(o.files4, base)
		slices.Sort(o.files4)
	}
	if v6 && !slices.Contains(o.file6, base) {
		o.file6 = append(o.file6, base)
		slices.Sort(o.file6)
	}
	o.v4, o.v6 = merge(o.v4), merge(o.v6)
	return nil
}

// lastAddr returns the last address of the masked prefix p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// merge sorts rs by lo and joins overlapping and adjacent ranges.
func merge(rs []cidrRange) []cidrRange {
	sort.Slice(rs, func(i, j int) bool { return rs[i].lo.less(rs[j].lo) })
	out := rs[:0]
	for _, r := range rs {
		if n := len(out); n > 0 {
			last := &out[n-1]
			next := last.hi // the address after last, unless last ends the space
			if next.lo++; next.lo == 0 {
				next.hi++
			}
			if !next.less(r.lo) || last.hi == (crawlerAddr{^uint64(0), ^uint64(0)}) {
				if last.hi.less(r.hi) {
					last.hi = r.hi
				}
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// Operators returns the operators with ranges, sorted.
func (c *CrawlerRanges) Operators() []string {
	if c == nil {
		return nil
	}
	var ops []string
	for op := range c.ops {
		ops = append(ops, op)
	}
	slices.Sort(ops)
	return ops
}

// Has reports whether operator has ranges for ip's family (IPv4, or IPv6):
// whether Contains can tell a verified crawler at ip from a false claim.
func (c *CrawlerRanges) Has(operator string, ip netip.Addr) bool {
	if c == nil {
		return false
	}
	o := c.ops[operator]
	if o == nil {
		return false
	}
	if ip.Unmap().Is4() {
		return len(o.v4) > 0
	}
	return len(o.v6) > 0
}

// Contains reports whether ip (IPv4, IPv4-mapped IPv6 or IPv6) is in one
// of operator's ranges. It binary-searches the operator's sorted, merged
// ranges, O(log n), and does not allocate.
func (c *CrawlerRanges) Contains(operator string, ip netip.Addr) bool {
	if c == nil || !ip.IsValid() {
		return false
	}
	o := c.ops[operator]
	if o == nil {
		return false
	}
	ip = ip.Unmap()
	rs := o.v6
	if ip.Is4() {
		rs = o.v4
	}
	x := toCrawlerAddr(netip.AddrFrom16(ip.As16()))
	// The first range whose hi is at or above x.
	i, j := 0, len(rs)
	for i < j {
		h := int(uint(i+j) >> 1)
		if rs[h].hi.less(x) {
			i = h + 1
		} else {
			j = h
		}
	}
	return i < len(rs) && !x.less(rs[i].lo)
}

// Files returns the names of the files that gave operator's ranges for ip's
// family, for evidence ("googlebot-ipv4.txt").
func (c *CrawlerRanges) Files(operator string, ip netip.Addr) []string {
	if c == nil {
		return nil
	}
	o := c.ops[operator]
	if o == nil {
		return nil
	}
	if ip.Unmap().Is4() {
		return slices.Clone(o.files4)
	}
	return slices.Clone(o.file6)
}
