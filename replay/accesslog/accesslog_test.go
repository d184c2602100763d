package accesslog

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/detector/enrich"
)

// sharedData returns ../shared/data, skipping the test when it is absent.
func sharedData(t testing.TB) string {
	t.Helper()
	data, err := enrich.FindData(".")
	if err != nil {
		t.Skipf("../shared/data absent: %v", err)
	}
	return data
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t.UTC()
}

const ua = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/69.0.3497.100 Safari/537.36"

func TestParseCombined(t *testing.T) {
	tests := []struct {
		name string
		line string
		want Entry
	}{
		{
			name: "combined",
			line: `83.149.9.216 - - [17/May/2015:10:05:03 +0000] "GET /presentations/kibana-search.png HTTP/1.1" 200 203023 "http://semicomplete.com/presentations/" "` + ua + `"`,
			want: Entry{Time: utc("2015-05-17T10:05:03Z"), Client: "83.149.9.216", Method: "GET", Path: "/presentations/kibana-search.png", Proto: "HTTP/1.1", Status: 200, Bytes: 203023, Referer: "http://semicomplete.com/presentations/", UserAgent: ua},
		},
		{
			name: "secrepo trailing space, negative offset, dash referer",
			line: `77.75.78.160 - - [15/Dec/2018:02:18:31 -0800] "GET /robots.txt HTTP/1.1" 200 334 "-" "SeznamBot/3.2" ` + "\n",
			want: Entry{Time: utc("2018-12-15T10:18:31Z"), Client: "77.75.78.160", Method: "GET", Path: "/robots.txt", Proto: "HTTP/1.1", Status: 200, Bytes: 334, UserAgent: "SeznamBot/3.2"},
		},
		{
			name: "common format, dash bytes, user, CRLF",
			line: "192.0.2.1 - frank [10/Oct/2000:13:55:36 -0700] \"GET /apache_pb.gif HTTP/1.0\" 304 -\r\n",
			want: Entry{Time: utc("2000-10-10T20:55:36Z"), Client: "192.0.2.1", Method: "GET", Path: "/apache_pb.gif", Proto: "HTTP/1.0", Status: 304},
		},
		{
			name: "escaped quotes in user agent",
			line: `188.76.8.81 - - [15/Dec/2018:08:00:39 -0800] "GET / HTTP/1.1" 200 12469 "-" "\"Mozilla/5.0 (iPhone) Safari/604.1\"" `,
			want: Entry{Time: utc("2018-12-15T16:00:39Z"), Client: "188.76.8.81", Method: "GET", Path: "/", Proto: "HTTP/1.1", Status: 200, Bytes: 12469, UserAgent: `"Mozilla/5.0 (iPhone) Safari/604.1"`},
		},
		{
			name: "escaped backslash and kept hex escape",
			line: `192.0.2.1 - - [01/Jan/2020:00:00:00 +0000] "GET /a\\b\x41 HTTP/1.1" 200 1 "-" "ua\\"`,
			want: Entry{Time: utc("2020-01-01T00:00:00Z"), Client: "192.0.2.1", Method: "GET", Path: `/a\b\x41`, Proto: "HTTP/1.1", Status: 200, Bytes: 1, UserAgent: `ua\`},
		},
		{
			name: "unescaped quote inside a field does not close it",
			line: `192.0.2.1 - - [01/Jan/2020:00:00:00 +0000] "GET /a"b HTTP/1.1" 200 1 "-" "say "hi"now"`,
			want: Entry{Time: utc("2020-01-01T00:00:00Z"), Client: "192.0.2.1", Method: "GET", Path: `/a"b`, Proto: "HTTP/1.1", Status: 200, Bytes: 1, UserAgent: `say "hi"now`},
		},
		{
			name: "TLS probe request is kept raw",
			line: `192.0.2.7 - - [22/Dec/2022:02:26:58 -0800] "\x16\x03\x01\x00\xa3\x01" 400 226 "-" "-"`,
			want: Entry{Time: utc("2022-12-22T10:26:58Z"), Client: "192.0.2.7", Path: `\x16\x03\x01\x00\xa3\x01`, Status: 400, Bytes: 226},
		},
		{
			name: "dash request",
			line: `192.0.2.7 - - [22/Dec/2022:02:26:58 +0000] "-" 408 0 "-" "-"`,
			want: Entry{Time: utc("2022-12-22T02:26:58Z"), Client: "192.0.2.7", Status: 408},
		},
		{
			name: "empty request",
			line: `192.0.2.7 - - [22/Dec/2022:02:26:58 +0000] "" 400 0 "-" "-"`,
			want: Entry{Time: utc("2022-12-22T02:26:58Z"), Client: "192.0.2.7", Status: 400},
		},
		{
			name: "HTTP/0.9 request",
			line: `192.0.2.7 - - [22/Dec/2022:02:26:58 +0000] "GET /" 200 10`,
			want: Entry{Time: utc("2022-12-22T02:26:58Z"), Client: "192.0.2.7", Method: "GET", Path: "/", Status: 200, Bytes: 10},
		},
		{
			name: "space in path",
			line: `192.0.2.7 - - [22/Dec/2022:02:26:58 +0000] "GET /a b.html HTTP/1.1" 404 10`,
			want: Entry{Time: utc("2022-12-22T02:26:58Z"), Client: "192.0.2.7", Method: "GET", Path: "/a b.html", Proto: "HTTP/1.1", Status: 404, Bytes: 10},
		},
		{
			name: "lower-case method is not a request line",
			line: `192.0.2.7 - - [22/Dec/2022:02:26:58 +0000] "get / HTTP/1.1" 400 10`,
			want: Entry{Time: utc("2022-12-22T02:26:58Z"), Client: "192.0.2.7", Path: "get / HTTP/1.1", Status: 400, Bytes: 10},
		},
		{
			name: "no protocol after path with spaces",
			line: `192.0.2.7 - - [22/Dec/2022:02:26:58 +0000] "GET / x" 400 10`,
			want: Entry{Time: utc("2022-12-22T02:26:58Z"), Client: "192.0.2.7", Path: "GET / x", Status: 400, Bytes: 10},
		},
		{
			name: "IPv6 client and user with a space",
			line: `2001:db8::1 - "a b" [29/Feb/2024:23:59:59 +0130] "POST /api/v1 HTTP/2.0" 201 5 "-" "curl/8.0"`,
			want: Entry{Time: utc("2024-02-29T22:29:59Z"), Client: "2001:db8::1", Method: "POST", Path: "/api/v1", Proto: "HTTP/2.0", Status: 201, Bytes: 5, UserAgent: "curl/8.0"},
		},
		{
			name: "host name client",
			line: `gw_inet.pepboys.com - - [01/Aug/1995:00:00:01 -0400] "GET /images/launch-logo.gif HTTP/1.0" 200 1713`,
			want: Entry{Time: utc("1995-08-01T04:00:01Z"), Client: "gw_inet.pepboys.com", Method: "GET", Path: "/images/launch-logo.gif", Proto: "HTTP/1.0", Status: 200, Bytes: 1713},
		},
		{
			name: "vhost_combined: leading host:port is skipped",
			line: `www.example.com:443 203.0.113.9 - - [25/Oct/2021:11:05:52 +0200] "GET /.well-known HTTP/1.1" 403 6963 "abc.com" "ua"`,
			want: Entry{Time: utc("2021-10-25T09:05:52Z"), Client: "203.0.113.9", Method: "GET", Path: "/.well-known", Proto: "HTTP/1.1", Status: 403, Bytes: 6963, Referer: "abc.com", UserAgent: "ua"},
		},
		{
			name: "a syslog header before the client",
			line: `Mar  5 10:00:00 web1 nginx: 203.0.113.9 - - [25/Oct/2021:11:05:52 +0200] "GET /a HTTP/1.1" 200 1 "-" "ua"`,
			want: Entry{Time: utc("2021-10-25T09:05:52Z"), Client: "203.0.113.9", Method: "GET", Path: "/a", Proto: "HTTP/1.1", Status: 200, Bytes: 1, UserAgent: "ua"},
		},
		{
			name: "a virtual host without a port before the client",
			line: `www.example.com 2001:db8::9 - alice [25/Oct/2021:11:05:52 +0200] "GET /a HTTP/1.1" 200 1`,
			want: Entry{Time: utc("2021-10-25T09:05:52Z"), Client: "2001:db8::9", Method: "GET", Path: "/a", Proto: "HTTP/1.1", Status: 200, Bytes: 1},
		},
		{
			name: "a user name with a space is not a prefix",
			line: `192.0.2.7 - John Smith [25/Oct/2021:11:05:52 +0200] "GET /a HTTP/1.1" 200 1`,
			want: Entry{Time: utc("2021-10-25T09:05:52Z"), Client: "192.0.2.7", Method: "GET", Path: "/a", Proto: "HTTP/1.1", Status: 200, Bytes: 1},
		},
		{
			name: "truncated inside the user agent (elastic line 8899)",
			line: `46.118.127.106 - - [20/May/2015:12:05:17 +0000] "GET /scripts/grok-py-test/configlib.py HTTP/1.1" 200 235 "-" "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html` + "\n",
			want: Entry{Time: utc("2015-05-20T12:05:17Z"), Client: "46.118.127.106", Method: "GET", Path: "/scripts/grok-py-test/configlib.py", Proto: "HTTP/1.1", Status: 200, Bytes: 235, UserAgent: "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html"},
		},
		{
			name: "truncated inside the referer",
			line: `192.0.2.7 - - [22/Dec/2022:02:26:58 +0000] "GET / HTTP/1.1" 200 10 "http://exa`,
			want: Entry{Time: utc("2022-12-22T02:26:58Z"), Client: "192.0.2.7", Method: "GET", Path: "/", Proto: "HTTP/1.1", Status: 200, Bytes: 10, Referer: "http://exa"},
		},
		{
			name: "truncated after the status",
			line: `192.0.2.7 - - [22/Dec/2022:02:26:58 +0000] "GET / HTTP/1.1" 200`,
			want: Entry{Time: utc("2022-12-22T02:26:58Z"), Client: "192.0.2.7", Method: "GET", Path: "/", Proto: "HTTP/1.1", Status: 200},
		},
		{
			name: "nginx extra fields after the user agent are ignored",
			line: `192.0.2.7 - - [22/Dec/2022:02:26:58 +0000] "GET / HTTP/1.1" 200 10 "-" "ua" "198.51.100.1" 0.003`,
			want: Entry{Time: utc("2022-12-22T02:26:58Z"), Client: "192.0.2.7", Method: "GET", Path: "/", Proto: "HTTP/1.1", Status: 200, Bytes: 10, UserAgent: "ua"},
		},
		{
			name: "largest bytes",
			line: `192.0.2.7 - - [22/Dec/2022:02:26:58 +0000] "GET / HTTP/1.1" 200 9223372036854775807`,
			want: Entry{Time: utc("2022-12-22T02:26:58Z"), Client: "192.0.2.7", Method: "GET", Path: "/", Proto: "HTTP/1.1", Status: 200, Bytes: 1<<63 - 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseCombined(tt.line)
			if err != nil {
				t.Fatalf("ParseCombined: %v", err)
			}
			if got != tt.want {
				t.Errorf("ParseCombined =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}

func TestParseCombinedErrors(t *testing.T) {
	const ok = `"GET / HTTP/1.1" 200 10 "-" "ua"`
	tests := []struct {
		name string
		line string
		want error
	}{
		{"empty", "", ErrBadClient},
		{"client only", "192.0.2.1", ErrTruncated},
		{"dash client", `- - - [22/Dec/2022:02:26:58 +0000] ` + ok, ErrBadClient},
		{"bad IPv4", `192.0.2.256 - - [22/Dec/2022:02:26:58 +0000] ` + ok, ErrBadClient},
		{"bad IPv6", `2001:db8:::1 - - [22/Dec/2022:02:26:58 +0000] ` + ok, ErrBadClient},
		{"vhost then no client", `www.example.com:443 - - - [22/Dec/2022:02:26:58 +0000] ` + ok, ErrBadClient},
		{"host:port alone", `www.example.com:443`, ErrBadClient},
		{"quote in client", `"GET - - [22/Dec/2022:02:26:58 +0000] ` + ok, ErrBadClient},
		{"no timestamp", `192.0.2.1 - - "GET / HTTP/1.1" 200 10`, ErrBadTime},
		{"ISO timestamp", `192.0.2.1 - - [2022-12-22T02:26:58+00:00] ` + ok, ErrBadTime},
		{"bad month", `192.0.2.1 - - [22/Dex/2022:02:26:58 +0000] ` + ok, ErrBadTime},
		{"31 April", `192.0.2.1 - - [31/Apr/2022:02:26:58 +0000] ` + ok, ErrBadTime},
		{"29 Feb 2023", `192.0.2.1 - - [29/Feb/2023:02:26:58 +0000] ` + ok, ErrBadTime},
		{"hour 24", `192.0.2.1 - - [22/Dec/2022:24:00:00 +0000] ` + ok, ErrBadTime},
		{"bad zone sign", `192.0.2.1 - - [22/Dec/2022:02:26:58 0000] ` + ok, ErrBadTime},
		{"bad zone minutes", `192.0.2.1 - - [22/Dec/2022:02:26:58 +0060] ` + ok, ErrBadTime},
		{"cut in timestamp", `192.0.2.1 - - [22/Dec/2022:02:26`, ErrBadTime},
		{"year 9999", `192.0.2.1 - - [31/Dec/9999:23:59:59 +0000] ` + ok, ErrBadTime},
		{"before 1970", `192.0.2.1 - - [31/Dec/1969:23:59:59 +0000] ` + ok, ErrBadTime},
		{"cut after timestamp", `192.0.2.1 - - [22/Dec/2022:02:26:58 +0000]`, ErrTruncated},
		{"cut in request", `192.0.2.1 - - [22/Dec/2022:02:26:58 +0000] "GET /inde`, ErrTruncated},
		{"cut after request", `192.0.2.1 - - [22/Dec/2022:02:26:58 +0000] "GET / HTTP/1.1" `, ErrTruncated},
		{"unquoted request", `192.0.2.1 - - [22/Dec/2022:02:26:58 +0000] GET / HTTP/1.1 200 10`, ErrBadRequest},
		{"dash status", `192.0.2.1 - - [22/Dec/2022:02:26:58 +0000] "GET / HTTP/1.1" - 10`, ErrBadStatus},
		{"4-digit status", `192.0.2.1 - - [22/Dec/2022:02:26:58 +0000] "GET / HTTP/1.1" 2000 10`, ErrBadStatus},
		{"negative bytes", `192.0.2.1 - - [22/Dec/2022:02:26:58 +0000] "GET / HTTP/1.1" 200 -5`, ErrBadBytes},
		{"bytes overflow", `192.0.2.1 - - [22/Dec/2022:02:26:58 +0000] "GET / HTTP/1.1" 200 9223372036854775808`, ErrBadBytes},
		{"text after bytes", `192.0.2.1 - - [22/Dec/2022:02:26:58 +0000] "GET / HTTP/1.1" 200 10 www.example.com`, ErrTrailing},
		{"text after referer", `192.0.2.1 - - [22/Dec/2022:02:26:58 +0000] "GET / HTTP/1.1" 200 10 "-" ua`, ErrTrailing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseCombined(tt.line)
			if !errors.Is(err, tt.want) {
				t.Fatalf("ParseCombined error = %v, want %v", err, tt.want)
			}
			var pe *ParseError
			if !errors.As(err, &pe) || pe.Line != 0 || pe.Text != strings.TrimSuffix(tt.line, "\n") {
				t.Errorf("error = %#v, want *ParseError with Line 0 and the line as Text", err)
			}
		})
	}
}

func TestParseErrorTextCap(t *testing.T) {
	tail := strings.Repeat("y", 300)
	tests := []struct {
		name string
		line string
		want int // len(Text)
	}{
		{"short line kept whole", "abc", 3},
		{"ASCII cut at 200", strings.Repeat("x", 200) + tail, 200},
		{"2-byte rune ending at byte 200 kept", strings.Repeat("x", 198) + "é" + tail, 200},
		{"2-byte rune across byte 200 dropped", strings.Repeat("x", 199) + "é" + tail, 199},
		{"4-byte rune across byte 200 dropped", strings.Repeat("x", 197) + "😀" + tail, 197},
		{"invalid UTF-8 cut at 200", strings.Repeat("\x80", 300), 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseCombined(tt.line)
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error = %v, want *ParseError", err)
			}
			if len(pe.Text) != tt.want || pe.Text != tt.line[:tt.want] {
				t.Errorf("Text is %d bytes, want the first %d", len(pe.Text), tt.want)
			}
		})
	}
}

func TestParseNASATSV(t *testing.T) {
	tests := []struct {
		name string
		line string
		want Entry
		err  error
	}{
		{
			name: "no referer or user agent",
			line: "pppa006.compuserve.com\t-\t807256800\tGET\t/images/launch-logo.gif\t200\t1713\t\t",
			want: Entry{Time: utc("1995-08-01T06:00:00Z"), Client: "pppa006.compuserve.com", Method: "GET", Path: "/images/launch-logo.gif", Status: 200, Bytes: 1713},
		},
		{
			name: "all fields, dash bytes",
			line: "192.0.2.4\t-\t0\tHEAD\t/\t304\t-\thttp://r/\tMosaic/2.0",
			want: Entry{Time: utc("1970-01-01T00:00:00Z"), Client: "192.0.2.4", Method: "HEAD", Path: "/", Status: 304, Referer: "http://r/", UserAgent: "Mosaic/2.0"},
		},
		{name: "8 fields", line: "a.b\t-\t1\tGET\t/\t200\t1\t", err: ErrFieldCount},
		{name: "10 fields", line: "a.b\t-\t1\tGET\t/\t200\t1\t\t\t", err: ErrFieldCount},
		{name: "bad host", line: "a b\t-\t1\tGET\t/\t200\t1\t\t", err: ErrBadClient},
		{name: "bad time", line: "a.b\t-\t-1\tGET\t/\t200\t1\t\t", err: ErrBadTime},
		{name: "empty time", line: "a.b\t-\t\tGET\t/\t200\t1\t\t", err: ErrBadTime},
		{name: "huge time", line: "a.b\t-\t99999999999999\tGET\t/\t200\t1\t\t", err: ErrBadTime},
		{name: "bad status", line: "a.b\t-\t1\tGET\t/\t20\t1\t\t", err: ErrBadStatus},
		{name: "bad bytes", line: "a.b\t-\t1\tGET\t/\t200\t1k\t\t", err: ErrBadBytes},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseNASATSV(tt.line)
			if !errors.Is(err, tt.err) {
				t.Fatalf("error = %v, want %v", err, tt.err)
			}
			if err == nil && got != tt.want {
				t.Errorf("got\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}

// result is what Reader.Next returned for one call, for table comparison.
type result struct {
	line   int    // Entry.Line or ParseError.Line
	client string // Entry.Client
	err    error  // cause, or io.EOF
}

func readAll(t *testing.T, r *Reader) []result {
	t.Helper()
	var out []result
	for i := 0; i < 1000; i++ {
		e, err := r.Next()
		var pe *ParseError
		switch {
		case err == nil:
			out = append(out, result{line: e.Line, client: e.Client})
		case errors.As(err, &pe):
			out = append(out, result{line: pe.Line, err: pe.Err})
		default:
			out = append(out, result{err: err})
			return out
		}
	}
	t.Fatal("reader did not stop")
	return nil
}

func TestReader(t *testing.T) {
	const good = `192.0.2.%d - - [22/Dec/2022:02:26:58 +0000] "GET / HTTP/1.1" 200 10 "-" "ua"`
	line := func(n int) string { return strings.Replace(good, "%d", string(rune('0'+n)), 1) }
	longLine := line(9) + " " + strings.Repeat("z", MaxLineBytes)
	tests := []struct {
		name   string
		input  string
		format Format
		want   []result
		detect Format
		stats  Stats
	}{
		{
			name:   "empty input",
			input:  "",
			want:   []result{{err: io.EOF}},
			detect: FormatAuto,
		},
		{
			name:   "blank lines, malformed line, no final newline",
			input:  "\n" + line(1) + "\n  \t\r\nnot a log line\n" + line(2),
			want:   []result{{line: 2, client: "192.0.2.1"}, {line: 4, err: ErrBadTime}, {line: 5, client: "192.0.2.2"}, {err: io.EOF}},
			detect: FormatCombined,
			stats:  Stats{Lines: 5, Entries: 2, Malformed: 1, Blank: 2},
		},
		{
			name:   "CRLF",
			input:  line(1) + "\r\n" + line(2) + "\r\n",
			want:   []result{{line: 1, client: "192.0.2.1"}, {line: 2, client: "192.0.2.2"}, {err: io.EOF}},
			detect: FormatCombined,
			stats:  Stats{Lines: 2, Entries: 2},
		},
		{
			name:   "over-long line is skipped and the reader goes on",
			input:  line(1) + "\n" + longLine + "\n" + line(2) + "\n",
			want:   []result{{line: 1, client: "192.0.2.1"}, {line: 2, err: ErrLineTooLong}, {line: 3, client: "192.0.2.2"}, {err: io.EOF}},
			detect: FormatCombined,
			stats:  Stats{Lines: 3, Entries: 2, Malformed: 1},
		},
		{
			name:   "over-long last line without newline",
			input:  line(1) + "\n" + longLine + longLine,
			want:   []result{{line: 1, client: "192.0.2.1"}, {line: 2, err: ErrLineTooLong}, {err: io.EOF}},
			detect: FormatCombined,
			stats:  Stats{Lines: 2, Entries: 1, Malformed: 1},
		},
		{
			name:   "line of exactly MaxLineBytes with CRLF",
			input:  longLine[:MaxLineBytes] + "\r\n" + longLine[:MaxLineBytes+1] + "\n",
			want:   []result{{line: 1, client: "192.0.2.9"}, {line: 2, err: ErrLineTooLong}, {err: io.EOF}},
			detect: FormatCombined,
			stats:  Stats{Lines: 2, Entries: 1, Malformed: 1},
		},
		{
			name:   "auto detects NASA TSV from its header",
			input:  "\n" + nasaHeader + "\na.b\t-\t1\tGET\t/\t200\t1\t\t\nbad\n",
			want:   []result{{line: 3, client: "a.b"}, {line: 4, err: ErrFieldCount}, {err: io.EOF}},
			detect: FormatNASATSV,
			stats:  Stats{Lines: 4, Entries: 1, Malformed: 1, Header: 1, Blank: 1},
		},
		{
			name:   "auto detects headerless NASA TSV",
			input:  "a.b\t-\t1\tGET\t/\t200\t1\t\t\n",
			want:   []result{{line: 1, client: "a.b"}, {err: io.EOF}},
			detect: FormatNASATSV,
			stats:  Stats{Lines: 1, Entries: 1},
		},
		{
			name:   "combined reader does not skip a TSV header",
			input:  nasaHeader + "\n",
			format: FormatCombined,
			want:   []result{{line: 1, err: ErrBadClient}, {err: io.EOF}},
			detect: FormatCombined,
			stats:  Stats{Lines: 1, Malformed: 1},
		},
		{
			name:   "TSV reader rejects combined lines",
			input:  line(1) + "\n",
			format: FormatNASATSV,
			want:   []result{{line: 1, err: ErrFieldCount}, {err: io.EOF}},
			detect: FormatNASATSV,
			stats:  Stats{Lines: 1, Malformed: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewReader(strings.NewReader(tt.input), tt.format)
			got := readAll(t, r)
			if len(got) != len(tt.want) {
				t.Fatalf("got %d results %+v, want %+v", len(got), got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("result %d = %+v, want %+v", i, got[i], tt.want[i])
				}
			}
			if _, err := r.Next(); err != io.EOF {
				t.Errorf("Next after EOF = %v, want io.EOF", err)
			}
			if r.Format() != tt.detect {
				t.Errorf("Format = %v, want %v", r.Format(), tt.detect)
			}
			if r.Stats() != tt.stats {
				t.Errorf("Stats = %+v, want %+v", r.Stats(), tt.stats)
			}
		})
	}
}

type failingReader struct {
	data []byte
	err  error
}

func (f *failingReader) Read(p []byte) (int, error) {
	if len(f.data) == 0 {
		return 0, f.err
	}
	n := copy(p, f.data)
	f.data = f.data[n:]
	return n, nil
}

func TestReaderReadError(t *testing.T) {
	boom := errors.New("disk on fire")
	in := `192.0.2.1 - - [22/Dec/2022:02:26:58 +0000] "GET / HTTP/1.1" 200 10` + "\n" + `192.0.2.2 - - [22/Dec/2022:02:26:58 +0000] "GET / HTTP/1.1" 200 10`
	r := NewReader(&failingReader{data: []byte(in), err: boom}, FormatAuto)
	got := readAll(t, r)
	want := []result{{line: 1, client: "192.0.2.1"}, {line: 2, client: "192.0.2.2"}, {err: boom}}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("result %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if _, err := r.Next(); err != boom {
		t.Errorf("Next after error = %v, want %v again", err, boom)
	}
}

func TestReaderUnknownFormat(t *testing.T) {
	r := NewReader(strings.NewReader("x\n"), Format(7))
	if _, err := r.Next(); err == nil || err == io.EOF {
		t.Fatalf("Next = %v, want an unknown-format error", err)
	}
	if got := Format(7).String(); got != "Format(7)" {
		t.Errorf("String = %q", got)
	}
}

func countLines(b []byte) int {
	n := bytes.Count(b, []byte{'\n'})
	if len(b) > 0 && b[len(b)-1] != '\n' {
		n++
	}
	return n
}

// TestRealLogs reads the public logs in ../shared/data/access-logs and checks
// that every line is accounted for.
func TestRealLogs(t *testing.T) {
	dir := filepath.Join(sharedData(t), "access-logs")
	tests := []struct {
		file      string
		format    Format
		lines     int
		entries   int
		malformed int
		header    int
	}{
		{"elastic-apache_logs.log", FormatCombined, 10000, 10000, 0, 0},
		{"secrepo-2018-12-15.log", FormatCombined, 4961, 4961, 0, 0},
		{"secrepo-2022-12-22.log", FormatCombined, 1262, 1262, 0, 0},
		{"nasa-19950801.tsv", FormatNASATSV, 30970, 30969, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(dir, tt.file))
			if err != nil {
				t.Skipf("../shared/data absent: %v", err)
			}
			if n := countLines(data); n != tt.lines {
				t.Fatalf("file has %d lines, test expects %d: data changed?", n, tt.lines)
			}
			r := NewReader(bytes.NewReader(data), FormatAuto)
			prev := 0
			for {
				e, err := r.Next()
				if err == io.EOF {
					break
				}
				var pe *ParseError
				if errors.As(err, &pe) {
					t.Errorf("%v", pe)
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if e.Line <= prev || e.Client == "" || e.Time.IsZero() || e.Status < 100 {
					t.Fatalf("implausible entry after line %d: %+v", prev, e)
				}
				prev = e.Line
			}
			s := r.Stats()
			if s.Entries+s.Malformed+s.Header+s.Blank != tt.lines || s.Lines != tt.lines {
				t.Errorf("Stats %+v do not account for %d lines", s, tt.lines)
			}
			want := Stats{Lines: tt.lines, Entries: tt.entries, Malformed: tt.malformed, Header: tt.header}
			if s != want {
				t.Errorf("Stats = %+v, want %+v", s, want)
			}
			if r.Format() != tt.format {
				t.Errorf("detected %v, want %v", r.Format(), tt.format)
			}
		})
	}
}

// TestElasticTruncatedLine checks the lenient parse of line 8899, which ends
// inside the user agent with no closing quote.
func TestElasticTruncatedLine(t *testing.T) {
	f, err := os.Open(filepath.Join(sharedData(t), "access-logs", "elastic-apache_logs.log"))
	if err != nil {
		t.Skipf("../shared/data absent: %v", err)
	}
	defer f.Close()
	r := NewReader(f, FormatCombined)
	for {
		e, err := r.Next()
		if err != nil {
			t.Fatalf("line 8899 not reached: %v", err)
		}
		if e.Line < 8899 {
			continue
		}
		want := Entry{
			Line: 8899, Time: utc("2015-05-20T12:05:17Z"), Client: "46.118.127.106",
			Method: "GET", Path: "/scripts/grok-py-test/configlib.py", Proto: "HTTP/1.1", Status: 200, Bytes: 235,
			UserAgent: "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html",
		}
		if e != want {
			t.Errorf("line 8899 =\n%+v\nwant\n%+v", e, want)
		}
		return
	}
}

// TestSecrepoScraper checks the python-requests scraper the data README
// describes: 4,156 requests from 198.72.227.213, of which 4,151 carry the
// python-requests user agent and 5 a Chrome one.
func TestSecrepoScraper(t *testing.T) {
	f, err := os.Open(filepath.Join(sharedData(t), "access-logs", "secrepo-2018-12-15.log"))
	if err != nil {
		t.Skipf("../shared/data absent: %v", err)
	}
	defer f.Close()
	r := NewReader(f, FormatAuto)
	var fromIP, python int
	perMinute := map[time.Time]int{}
	for {
		e, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if e.Client != "198.72.227.213" {
			continue
		}
		fromIP++
		if strings.Contains(e.UserAgent, "python-requests") {
			python++
			perMinute[e.Time.Truncate(time.Minute)]++
		}
	}
	peak := 0
	for _, n := range perMinute {
		peak = max(peak, n)
	}
	if fromIP != 4156 || python != 4151 || peak != 680 {
		t.Errorf("198.72.227.213: %d requests, %d python-requests, peak %d/min; want 4156, 4151, 680", fromIP, python, peak)
	}
}

// FuzzParseLine checks that no line makes the parsers panic, that errors are
// *ParseErrors with capped text, that parsed entries are plausible, and that
// ParseCombined and Reader agree on a single line.
func FuzzParseLine(f *testing.F) {
	seeds := []string{
		`83.149.9.216 - - [17/May/2015:10:05:03 +0000] "GET /presentations/ HTTP/1.1" 200 203023 "http://semicomplete.com/" "Mozilla/5.0 Chrome/32.0.1700.77 Safari/537.36"`,
		`77.75.78.160 - - [15/Dec/2018:02:18:31 -0800] "GET /robots.txt HTTP/1.1" 200 334 "-" "SeznamBot/3.2" `,
		`192.0.2.1 - frank [10/Oct/2000:13:55:36 -0700] "GET /apache_pb.gif HTTP/1.0" 304 -`,
		`188.76.8.81 - - [15/Dec/2018:08:00:39 -0800] "GET / HTTP/1.1" 200 12469 "-" "\"Mozilla/5.0\""`,
		`192.0.2.7 - - [22/Dec/2022:02:26:58 -0800] "\x16\x03\x01\x00\xa3\x01" 400 226 "-" "-"`,
		`192.0.2.7 - - [22/Dec/2022:02:26:58 +0000] "-" 408 0 "-" "-"`,
		`2001:db8::1 - "a b" [29/Feb/2024:23:59:59 +0130] "POST /api/v1 HTTP/2.0" 201 5 "-" "curl/8.0"`,
		`46.118.127.106 - - [20/May/2015:12:05:17 +0000] "GET /x.py HTTP/1.1" 200 235 "-" "Mozilla/5.0 (compatible; Googlebot/2.1`,
		`192.0.2.1 - - [22/Dec/2022:02:26:58 +0000] "GET /inde`,
		`192.0.2.1 - - [31/Apr/2022:02:26:58 +0000] "GET / HTTP/1.1" 200 1`,
		`www.example.com:443 203.0.113.9 - - [25/Oct/2021:11:05:52 +0200] "GET / HTTP/1.1" 403 6963 "-" "ua"`,
		"pppa006.compuserve.com\t-\t807256800\tGET\t/images/launch-logo.gif\t200\t1713\t\t",
		nasaHeader,
		"",
		"\\",
		`1.2.3.4 - - [01/Jan/2020:00:00:00 +0000] "GET /a\\" 200 1 "\\"`,
	}
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		e, err := ParseCombined(line)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) || pe.Line != 0 || len(pe.Text) > maxErrorText || pe.Err == nil {
				t.Fatalf("ParseCombined(%q) error %#v is not a capped *ParseError", line, err)
			}
		} else {
			checkEntry(t, line, e)
		}
		if strings.ContainsAny(line, "\n\r") {
			return // several lines for the Reader; no single-line comparison
		}
		r := NewReader(strings.NewReader(line), FormatCombined)
		re, rerr := r.Next()
		switch {
		case rerr == io.EOF:
			if strings.TrimLeft(line, " \t") != "" {
				t.Fatalf("Reader skipped non-blank line %q", line)
			}
		case errors.Is(rerr, ErrLineTooLong):
		case (rerr == nil) != (err == nil) || err != nil && !errors.Is(rerr, errors.Unwrap(err)):
			t.Fatalf("Reader error %v, ParseCombined error %v for %q", rerr, err, line)
		case rerr == nil:
			re.Line = 0
			if re != e {
				t.Fatalf("Reader entry %+v != ParseCombined entry %+v", re, e)
			}
		}
		if tsv, err := parseNASATSV(line); err == nil {
			checkEntry(t, line, tsv)
		}
		NewReader(strings.NewReader(line), FormatAuto).Next()
	})
}

func checkEntry(t *testing.T, line string, e Entry) {
	t.Helper()
	if e.Client == "" || e.Time.IsZero() || e.Time.Location() != time.UTC ||
		e.Status < 0 || e.Status > 999 || e.Bytes < 0 || e.Line != 0 {
		t.Fatalf("implausible entry %+v from %q", e, line)
	}
	if e.Method == "" && e.Proto != "" {
		t.Fatalf("Proto without Method: %+v from %q", e, line)
	}
}

var sinkEntry Entry

func BenchmarkParseCombined(b *testing.B) {
	line := `83.149.9.216 - - [17/May/2015:10:05:03 +0000] "GET /presentations/logstash-monitorama-2013/images/kibana-search.png HTTP/1.1" 200 203023 "http://semicomplete.com/presentations/logstash-monitorama-2013/" "` + ua + `"`
	b.ReportAllocs()
	b.SetBytes(int64(len(line)))
	for b.Loop() {
		e, err := ParseCombined(line)
		if err != nil {
			b.Fatal(err)
		}
		sinkEntry = e
	}
}

// BenchmarkReader reads the elastic log from memory; ns/op is per line.
func BenchmarkReader(b *testing.B) {
	data, err := os.ReadFile(filepath.Join(sharedData(b), "access-logs", "elastic-apache_logs.log"))
	if err != nil {
		b.Skipf("../shared/data absent: %v", err)
	}
	lines := countLines(data)
	b.ReportAllocs()
	b.SetBytes(int64(len(data)) / int64(lines))
	b.ResetTimer()
	var r *Reader
	for n := 0; n < b.N; {
		r = NewReader(bytes.NewReader(data), FormatCombined)
		for ; n < b.N; n++ {
			e, err := r.Next()
			if err == io.EOF {
				break
			}
			sinkEntry = e
		}
	}
}

// Old Mac files end lines with a lone CR; a UTF-8 byte-order mark may open
// a file. Neither loses a line.
func TestReaderCROnlyAndBOM(t *testing.T) {
	a := `192.0.2.1 - - [22/Dec/2022:02:26:58 +0000] "GET /a HTTP/1.1" 200 1 "-" "ua"`
	b := `192.0.2.2 - - [22/Dec/2022:02:26:59 +0000] "GET /b HTTP/1.1" 200 1 "-" "ua"`
	r := NewReader(strings.NewReader("\xef\xbb\xbf"+a+"\r"+b+"\r\r"+a+"\n"+b+"\r\n"), FormatAuto)
	var paths []string
	var lines []int
	for {
		e, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		paths = append(paths, e.Path)
		lines = append(lines, e.Line)
	}
	if strings.Join(paths, ",") != "/a,/b,/a,/b" || fmt.Sprint(lines) != "[1 2 4 5]" {
		t.Errorf("paths %v lines %v", paths, lines)
	}
	if st := r.Stats(); st.Lines != 5 || st.Entries != 4 || st.Blank != 1 {
		t.Errorf("stats %+v", st)
	}
}
