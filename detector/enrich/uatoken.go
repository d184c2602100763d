package enrich

// Crawler words: how UAFamily tells a crawler's user agent by its tokens
// rather than by letters anywhere in it. A word is a maximal run of ASCII
// letters and digits ("Googlebot-Image/1.0" has the words Googlebot, Image,
// 1 and 0), so "bot" inside "CUBOT", "fuboTV" or "Banca Caboto" is no
// claim.

// crawlerSuffixes end a crawler's product name: AhrefsBot, bingbot,
// Baiduspider, WebCrawler, feedfetcher. "bot" is special-cased in
// isCrawlerWord (its case must not be all capitals, unless the word is only
// "BOT").
var crawlerSuffixes = []string{"bot", "spider", "crawler", "crawl", "fetcher", "scraper", "indexer", "archiver",
	"preview", "extractor", "exractor", "proxy", "synthetic", "synthetics", "auditor", "checker", "monitor", "analyzer", "httpclient", "agent"}

// crawlerPrefixes begin a crawler's or a monitor's word: crawler4j,
// Spider-Pig, checkers, monitoring, preview services, feed readers,
// validators, health and uptime checks, probes, subscriber counts.
var crawlerPrefixes = []string{"bot", "crawl", "spider", "scrap", "fetch", "monitor", "checker", "validator", "preview",
	"feed", "archiv", "uptime", "probe", "subscriber", "scanner", "robot", "siteaudit", "linkcheck"}

// crawlerWholeWords are crawler words only when they stand alone: "http"
// and "https" are a contact URL's scheme ("+http://www.google.com/bot.html"),
// which browsers do not put in their user agents; the others name what the
// client does.
var crawlerWholeWords = []string{"http", "https", "index", "check", "scan", "headless",
	"headlesschrome", "lighthouse", "phantomjs", "slimerjs", "selenium", "puppeteer", "playwright", "httrack", "nutch",
	"wordpress", "favicon", "analyzer", "seo", "audit", "rss", "verification", "dcv", "webhook", "daemon", "cron",
	// HTTP libraries and tools UAFamily has no family for.
	"perl", "lwp", "php", "ruby", "guzzlehttp", "restsharp", "postmanruntime", "winhttp", "grpc", "jersey",
	"httpurlconnection", "apachebench", "newspaper", "collectd", "prometheus", "monit", "zabbix", "nagios", "xymon",
	// Monitoring, scanning and preview services, and AI agents, by name.
	"pingdom", "site24x7", "catchpoint", "datadog", "statuscake", "hexometer", "updown", "speedcurve", "ptst",
	"nuclei", "nikto", "sqlmap", "masscan", "zgrab", "acunetix", "arachni", "netcraft", "expanse", "fuzz", "jorgee", "clamav",
	"whatsapp", "facebookexternalhit", "facebookcatalog", "externalagent", "discourse", "onebox", "iframely", "embedly",
	"outbrain", "twingly", "chatgpt", "openai", "perplexity", "claude", "anthropic", "cohere", "googleother", "mediapartners",
	"inspectiontool", "googleweblight"}

// isCrawlerUA reports whether ua has a crawler word (see UAFamily).
func isCrawlerUA(ua string) bool {
	// A bare name, or a contact address.
	if bareToken(ua) || hasEmail(ua) {
		return true
	}
	for i := 0; i < len(ua); {
		if !isAlnum(ua[i]) {
			i++
			continue
		}
		j := i
		for j < len(ua) && isAlnum(ua[j]) {
			j++
		}
		if isCrawlerWord(ua[i:j]) {
			return true
		}
		// Google's other agents: Google-InspectionTool, mediapartners-google;
		// not "Google Pixel" or "Google/google".
		if equalFold(ua[i:j], "google") && (i > 0 && ua[i-1] == '-' || j < len(ua) && ua[j] == '-') {
			return true
		}
		i = j
	}
	return false
}

// bareToken reports whether ua is one word of letters, digits, '.', '_'
// and '-' with a letter in it ("Hexometer", "Request-Promise"): a script's
// name, where every browser sends a product and version.
func bareToken(ua string) bool {
	letter := false
	for i := 0; i < len(ua); i++ {
		c := ua[i]
		switch {
		case 'a' <= c|0x20 && c|0x20 <= 'z':
			letter = true
		case '0' <= c && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return letter
}

// hasEmail reports whether ua has a contact address: '@' after a letter or
// digit and before a domain of letters, digits, '-' and '.' that starts
// with a letter and has a dot ("help@moz.com"; not "android@111.0" or
// "en_IR@calendar=gregorian").
func hasEmail(ua string) bool {
	for i := 1; i+1 < len(ua); i++ {
		if ua[i] != '@' || !isAlnum(ua[i-1]) || !isLetter(ua[i+1]) {
			continue
		}
		dot := false
		for j := i + 1; j < len(ua) && (isAlnum(ua[j]) || ua[j] == '-' || ua[j] == '.'); j++ {
			if ua[j] == '.' && j+1 < len(ua) && isLetter(ua[j+1]) {
				dot = true
			}
		}
		if dot {
			return true
		}
	}
	return false
}

func isLetter(c byte) bool { return 'a' <= c|0x20 && c|0x20 <= 'z' }

func isAlnum(c byte) bool {
	return 'a' <= c|0x20 && c|0x20 <= 'z' || '0' <= c && c <= '9'
}

// isCrawlerWord reports whether w, a run of letters and digits in its
// original case, is a crawler word.
func isCrawlerWord(w string) bool {
	if len(w) < 2 {
		return false
	}
	// "bot" as a suffix must be written bot or Bot: CUBOT is a phone maker.
	if n := len(w); n >= 3 && equalFold(w[n-3:], "bot") {
		if n == 3 || w[n-3:] == "bot" || w[n-3:] == "Bot" {
			return true
		}
	}
	for _, s := range crawlerSuffixes[1:] {
		if len(w) >= len(s) && equalFold(w[len(w)-len(s):], s) {
			return true
		}
	}
	for _, p := range crawlerPrefixes {
		if len(w) >= len(p) && equalFold(w[:len(p)], p) {
			if p == "bot" && len(w) > 3 && !isUpper(w[0]) && isLower(w[3]) {
				continue // "botanic", but Botify and BOT-xyz
			}
			return true
		}
	}
	if containsFold(w, "health") {
		return true
	}
	for _, x := range crawlerWholeWords {
		if equalFold(w, x) {
			return true
		}
	}
	return false
}

func isUpper(c byte) bool { return 'A' <= c && c <= 'Z' }
func isLower(c byte) bool { return 'a' <= c && c <= 'z' }

// containsFold reports whether s contains lower-case t, ASCII
// case-insensitively.
func containsFold(s, t string) bool {
	for i := 0; i+len(t) <= len(s); i++ {
		if equalFold(s[i:i+len(t)], t) {
			return true
		}
	}
	return false
}

// equalFold is strings.EqualFold for ASCII s and lower-case t.
func equalFold(s, t string) bool {
	if len(s) != len(t) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if isUpper(c) {
			c += 'a' - 'A'
		}
		if c != t[i] {
			return false
		}
	}
	return true
}

// HasToken reports whether ua contains token, ASCII case-insensitively, at
// word boundaries: neither the byte before nor the byte after it is a
// letter or digit. token is a crawler's product token such as "googlebot",
// "adsbot-google" or "chatgpt-user", in lower case; "googlebot" is found in
// "Googlebot-Image/1.0" and "(compatible; Googlebot/2.1; ...)", not in
// "NotGooglebotX". It does not allocate.
func HasToken(ua, token string) bool {
	if token == "" {
		return false
	}
	for i := 0; i+len(token) <= len(ua); i++ {
		if i > 0 && isAlnum(ua[i-1]) {
			continue
		}
		if !equalFold(ua[i:i+len(token)], token) {
			continue
		}
		if e := i + len(token); e == len(ua) || !isAlnum(ua[e]) {
			return true
		}
	}
	return false
}
