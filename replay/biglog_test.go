package replay

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"
)

// writeBigLog writes n lines of combined-format access log spread over one
// day of event time from GeneratorStart, with a daily curve (quiet at
// night, busiest in the afternoon), and returns the lines written. The mix
// is meant to look like a public gateway's day, for memory and speed
// measurements:
//   - clients: 200 000 addresses drawn by a Zipf law (a few heavy, a long
//     tail seen once or twice), a tenth of them IPv6;
//   - 3 crawlers (4% of the lines) and one scraper that sends 40% of the
//     lines of 13:00-13:30, walking /items/<n> so that every path it asks
//     for is new (about 1% of the day; at 200 000 lines a day that is two
//     requests a second, past the default rules' per-ip limit);
//   - paths: 5 000 static pages by Zipf, item pages with ids up to 10^6,
//     searches with a query string;
//   - statuses 200, 304, 404, 500; user agents from a short list;
//   - timestamps jittered by up to 20 s, as logs written when responses end;
//   - one line in 2 000 malformed (truncated or with a bad timestamp).
//
// The same seed and n always give the same bytes.
func writeBigLog(w io.Writer, n int, seed uint64) (int, error) {
	rng := rand.New(rand.NewPCG(seed, 0xb16))
	clients := rand.NewZipf(rng, 1.1, 4, 200_000-1)
	pages := rand.NewZipf(rng, 1.2, 1, 5_000-1)
	uas := []string{
		"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Safari/537.36",
		"Mozilla/5.0 (X11; Linux x86_64; rv:121.0) Gecko/20100101 Firefox/121.0",
		"Mozilla/5.0 (Macintosh; Intel Mac OS X 14_2) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.2 Safari/605.1.15",
		"Mozilla/5.0 (iPhone; CPU iPhone OS 17_2 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.2 Mobile/15E148 Safari/604.1",
		"curl/8.5.0",
		"Go-http-client/1.1",
	}
	crawlers := []struct{ ip, ua string }{
		{"66.249.66.1", "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"},
		{"157.55.39.10", "Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)"},
		{"77.75.78.160", "Mozilla/5.0 (compatible; SeznamBot/3.2; +http://napoveda.seznam.cz/en/seznambot-intro/)"},
	}
	statuses := []int{200, 200, 200, 200, 200, 200, 304, 304, 404, 500}
	bw := bufio.NewWriterSize(w, 1<<16)
	day := 24 * time.Hour
	// Event times by inverting the daily curve 1 - 0.6·cos(2π(t - 3h)/day)
	// on a grid: line i sits at the time where the curve's integral reaches
	// i/n.
	const grid = 1440
	cum := make([]float64, grid+1)
	for i := 1; i <= grid; i++ {
		x := (float64(i) - 0.5) / grid
		cum[i] = cum[i-1] + 1 - 0.6*math.Cos(2*math.Pi*(x-0.125))
	}
	total := cum[grid]
	g := 0
	var buf []byte
	for i := range n {
		target := (float64(i) + rng.Float64()) / float64(n) * total
		for g < grid-1 && cum[g+1] < target {
			g++
		}
		frac := (target - cum[g]) / (cum[g+1] - cum[g])
		t := GeneratorStart.Add(time.Duration((float64(g) + frac) / grid * float64(day)))
		t = t.Add(-time.Duration(rng.IntN(20_000)) * time.Millisecond)
		var ip, ua, path string
		scraping := g >= 13*60 && g < 13*60+30 // grid steps are minutes
		switch r := rng.IntN(100); {
		case scraping && r < 40:
			ip, ua = "203.0.113.77", "python-requests/2.31.0"
			path = "/items/" + strconv.Itoa(i)
		case r < 4:
			c := crawlers[rng.IntN(len(crawlers))]
			ip, ua = c.ip, c.ua
			path = "/pages/" + strconv.FormatUint(pages.Uint64(), 10) + ".html"
		default:
			c := clients.Uint64()
			if c%10 == 9 {
				ip = fmt.Sprintf("2001:db8:%x::%x", c>>16, c&0xffff)
			} else {
				ip = fmt.Sprintf("%d.%d.%d.%d", 11+c>>16, (c>>8)&0xff, c&0xff, 1+c%250)
			}
			ua = uas[c%uint64(len(uas))]
			switch q := rng.IntN(10); {
			case q < 6:
				path = "/pages/" + strconv.FormatUint(pages.Uint64(), 10) + ".html"
			case q < 9:
				path = "/items/" + strconv.Itoa(rng.IntN(1_000_000))
			default:
				path = "/search?q=" + strconv.Itoa(rng.IntN(100_000))
			}
		}
		method := "GET"
		if rng.IntN(50) == 0 {
			method = "POST"
		}
		buf = buf[:0]
		buf = append(buf, ip...)
		buf = append(buf, " - - ["...)
		buf = t.AppendFormat(buf, "02/Jan/2006:15:04:05 -0700")
		buf = append(buf, "] \""...)
		buf = append(buf, method...)
		buf = append(buf, ' ')
		buf = append(buf, path...)
		buf = append(buf, " HTTP/1.1\" "...)
		buf = strconv.AppendInt(buf, int64(statuses[rng.IntN(len(statuses))]), 10)
		buf = append(buf, ' ')
		buf = strconv.AppendInt(buf, int64(200+rng.IntN(50_000)), 10)
		buf = append(buf, " \"-\" \""...)
		buf = append(buf, ua...)
		buf = append(buf, "\"\n"...)
		switch rng.IntN(2000) {
		case 0:
			buf = append(buf[:len(buf)/3], '\n') // truncated
		case 1:
			copy(buf[len(ip)+5:], "32/Foo") // bad timestamp
		}
		if _, err := bw.Write(buf); err != nil {
			return i, err
		}
	}
	return n, bw.Flush()
}

// TestWriteBigLog writes a big log for measurements outside the tests:
//
//	SLUICE_BIGLOG=/tmp/big.log SLUICE_BIGLOG_LINES=1000000 go test -run TestWriteBigLog ./replay/
//
// It is skipped when SLUICE_BIGLOG is unset.
func TestWriteBigLog(t *testing.T) {
	path := os.Getenv("SLUICE_BIGLOG")
	if path == "" {
		t.Skip("SLUICE_BIGLOG unset")
	}
	n, err := strconv.Atoi(os.Getenv("SLUICE_BIGLOG_LINES"))
	if err != nil || n <= 0 {
		t.Fatalf("SLUICE_BIGLOG_LINES=%q: want a positive number of lines", os.Getenv("SLUICE_BIGLOG_LINES"))
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := writeBigLog(f, n, 1); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// WriteBigLog is writeBigLog for the external tests.
var WriteBigLog = writeBigLog
