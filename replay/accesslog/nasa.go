package accesslog

import (
	"strings"
	"time"
)

// nasaHeader is the first line of the NASA-HTTP TSV conversion.
const nasaHeader = "host\tlogname\ttime\tmethod\turl\tresponse\tbytes\treferer\tuseragent"

const nasaFields = 9

// parseNASATSV parses one data line of the NASA-HTTP TSV conversion:
// host, logname, time (Unix seconds), method, url, response, bytes, referer,
// user agent, separated by single tabs (empty fields allowed). The host must
// be an IP address or a host name and the time a non-negative decimal;
// response must be three digits; bytes may be empty or "-" (0). Method and
// url are stored as they are (there is no protocol column). s must not carry
// its line ending.
func parseNASATSV(s string) (Entry, error) {
	var e Entry
	var f [nasaFields]string
	n := 0
	for n < nasaFields-1 {
		i := strings.IndexByte(s, '\t')
		if i < 0 {
			break
		}
		f[n], s = s[:i], s[i+1:]
		n++
	}
	f[n] = s
	n++
	if n != nasaFields || strings.IndexByte(s, '\t') >= 0 {
		return e, ErrFieldCount
	}
	if !validClient(f[0]) {
		return e, ErrBadClient
	}
	e.Client = f[0]
	sec, ok := parseUint63(f[2])
	if !ok || sec > maxUnixSeconds {
		return e, ErrBadTime
	}
	e.Time = time.Unix(sec, 0).UTC()
	e.Method, e.Path = f[3], f[4]
	if e.Status, ok = parseStatus(f[5]); !ok {
		return e, ErrBadStatus
	}
	if e.Bytes, ok = parseBytes(f[6]); !ok {
		return e, ErrBadBytes
	}
	e.Referer, e.UserAgent = dash(f[7]), dash(f[8])
	return e, nil
}

// maxUnixSeconds is the start of year 9000: request times are kept well
// inside what time.Time formats as RFC 3339 (years up to 9999), so that
// anything derived from them (window ends, rule expiries) stays printable.
const maxUnixSeconds = 221845392000
