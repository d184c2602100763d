package replay

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/sluice-rl/sluice/replay/accesslog"
	"github.com/sluice-rl/sluice/rules"
)

// GeneratorStart is the event time at which generated traffic begins.
var GeneratorStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Scenario describes the traffic Generate produces. Zero fields take the
// defaults named on each.
type Scenario struct {
	Seed     uint64        // any value; the same seed gives the same traffic
	Duration time.Duration // default 10 min
	Regions  int           // default 3
	Clients  int           // ordinary clients; default 300
	Rate     float64       // requests per second per ordinary client; default 0.2
	// HotRate is the request rate of the hot API key "key-hot", whose demand
	// sits 80% in region 0 for the first half and 80% in region 1 after.
	// Default 40 per second.
	HotRate float64
	// ScraperRate is the rate of one python-requests scraper (IP
	// 198.51.100.250, no API key) from the 2nd minute to 60% of the run.
	// Default 8 per second.
	ScraperRate float64
}

func (s *Scenario) defaults() {
	if s.Duration <= 0 {
		s.Duration = 10 * time.Minute
	}
	if s.Regions <= 0 {
		s.Regions = 3
	}
	if s.Clients <= 0 {
		s.Clients = 300
	}
	if s.Rate <= 0 {
		s.Rate = 0.2
	}
	if s.HotRate <= 0 {
		s.HotRate = 40
	}
	if s.ScraperRate <= 0 {
		s.ScraperRate = 8
	}
}

// ScraperIP is the generated scraper's address.
const ScraperIP = "198.51.100.250"

var (
	genRoutes = []struct{ method, route string }{
		{"GET", "/v1/items"}, {"GET", "/v1/items/:id"}, {"GET", "/v1/items/:id"}, {"GET", "/v1/search"},
		{"POST", "/v1/orders"}, {"POST", "/v1/login"},
	}
	genUAs = []string{
		"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Safari/537.36",
		"Mozilla/5.0 (X11; Linux x86_64; rv:121.0) Gecko/20100101 Firefox/121.0",
		"Mozilla/5.0 (Macintosh; Intel Mac OS X 14_2) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.2 Safari/605.1.15",
		"Go-http-client/1.1",
	}
)

// Generate returns the scenario's requests as a Source, sorted by time. The
// same Scenario always gives the same requests. Addresses come from the
// documentation ranges (RFC 5737 192.0.2.0/24, 198.51.100.0/24,
// 203.0.113.0/24; RFC 3849 2001:db8::/32) and the CGNAT range 100.64.0.0/10.
//
// Generate builds the whole traffic in memory before it returns (about
// 250 MB an hour of it at the default sizes): sluice replay refuses a
// --duration over MaxGenerateDuration.
func Generate(sc Scenario) Source {
	sc.defaults()
	rng := rand.New(rand.NewPCG(sc.Seed, 0x5eed))
	end := GeneratorStart.Add(sc.Duration)
	var out []Request
	poisson := func(rate float64, from, to time.Time, mk func(t time.Time) Request) {
		if rate <= 0 {
			return
		}
		for t := from; ; {
			t = t.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
			if !t.Before(to) {
				return
			}
			out = append(out, mk(t))
		}
	}
	route := func(i int) (string, string, string) {
		r := genRoutes[i%len(genRoutes)]
		path := r.route
		if n := len(path); n > 4 && path[n-3:] == ":id" {
			path = fmt.Sprintf("%s%d", path[:n-3], rng.IntN(5000))
		}
		return r.method, r.route, path
	}
	for c := 0; c < sc.Clients; c++ {
		ip := fmt.Sprintf("%d.%d.%d.%d", []int{192, 198, 203}[c%3], []int{0, 51, 0}[c%3], []int{2, 100, 113}[c%3], c/3+1)
		if c%10 == 9 {
			ip = fmt.Sprintf("2001:db8:%x:%x::%x", c, rng.IntN(1<<16), rng.IntN(1<<16))
		}
		key := fmt.Sprintf("key-%03d", c/2)
		ua := genUAs[rng.IntN(len(genUAs))]
		rate := sc.Rate * (0.5 + rng.Float64())
		poisson(rate, GeneratorStart, end, func(t time.Time) Request {
			m, rt, p := route(rng.IntN(len(genRoutes)))
			return Request{Entry: accesslog.Entry{Time: t, Client: ip, Method: m, Path: p, Proto: "HTTP/1.1", Status: 200, UserAgent: ua},
				APIKey: key, User: fmt.Sprintf("user-%d", c), Tenant: fmt.Sprintf("tenant-%d", c/20), Route: rt}
		})
	}
	// The hot key: 200 CGNAT addresses, bucketed by the region they hash to.
	byRegion := make([][]string, sc.Regions)
	for i := 0; i < 200*sc.Regions; i++ {
		ip := fmt.Sprintf("100.%d.%d.%d", 64+i/65536, (i/256)%256, i%256+0)
		r := RegionOf(rules.NormalizeIP(ip, 64), sc.Regions)
		if len(byRegion[r]) < 200 {
			byRegion[r] = append(byRegion[r], ip)
		}
	}
	half := GeneratorStart.Add(sc.Duration / 2)
	hot := func(home int) func(t time.Time) Request {
		return func(t time.Time) Request {
			r := home
			if sc.Regions > 1 && rng.Float64() >= 0.8 {
				r = (home + 1 + rng.IntN(sc.Regions-1)) % sc.Regions
			}
			ips := byRegion[r]
			m, rt, p := route(rng.IntN(4))
			return Request{Entry: accesslog.Entry{Time: t, Client: ips[rng.IntN(len(ips))], Method: m, Path: p, Proto: "HTTP/1.1", Status: 200, UserAgent: genUAs[3]},
				APIKey: "key-hot", User: "svc-acme", Tenant: "acme", Route: rt}
		}
	}
	poisson(sc.HotRate, GeneratorStart, half, hot(0))
	poisson(sc.HotRate, half, end, hot(min(1, sc.Regions-1)))
	scrapeEnd := GeneratorStart.Add(time.Duration(math.Round(float64(sc.Duration) * 0.6)))
	poisson(sc.ScraperRate, GeneratorStart.Add(time.Minute), scrapeEnd, func(t time.Time) Request {
		return Request{Entry: accesslog.Entry{Time: t, Client: ScraperIP, Method: "GET", Path: fmt.Sprintf("/v1/items/%d", rng.IntN(100000)), Proto: "HTTP/1.1", Status: 200,
			UserAgent: "python-requests/2.31.0"}, Route: "/v1/items/:id"}
	})
	slices.SortStableFunc(out, func(a, b Request) int { return a.Time.Compare(b.Time) })
	for i := range out {
		out[i].Line = i + 1
	}
	return &generated{name: fmt.Sprintf("generated(seed=%d, %s, %s)", sc.Seed, sc.Duration, count(sc.Regions, "region")), reqs: out}
}

type generated struct {
	name string
	reqs []Request
	i    int
}

func (g *generated) Name() string { return g.name }
func (g *generated) Stats() accesslog.Stats {
	return accesslog.Stats{Lines: g.i, Entries: g.i}
}
func (g *generated) Next() (Request, error) {
	if g.i >= len(g.reqs) {
		return Request{}, io.EOF
	}
	g.i++
	return g.reqs[g.i-1], nil
}

// Len returns how many requests the generated scenario has (all of them,
// read or not): the total of a progress bar.
func (g *generated) Len() int { return len(g.reqs) }

// MaxGenerateDuration is the longest generated traffic sluice replay
// accepts (Generate holds it all in memory).
const MaxGenerateDuration = 2 * time.Hour
