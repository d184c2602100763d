package rules

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
)

func TestNormalizePath(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"/v1/login", "/v1/login"},
		{"/", "/"},
		{"", ""},
		{"login", "login"}, // a route name
		{"*", "*"},
		// Every respelling of issue 35's list.
		{"/v1/login?x=1", "/v1/login"},
		{"/v1/login?", "/v1/login"},
		{"//v1/login", "/v1/login"},
		{"/v1//login", "/v1/login"},
		{"/./v1/login", "/v1/login"},
		{"/v1/./login", "/v1/login"},
		{"/v1/%6Cogin", "/v1/login"},
		{"/v1/%6cogin", "/v1/login"},
		{"/v1/login/", "/v1/login"},
		{"/V1/LOGIN", "/V1/LOGIN"}, // case is kept: see Match.IgnoreCase
		// And more.
		{"/v1/x/../login", "/v1/login"},
		{"/v1/%2e%2e/v1/login", "/v1/login"},
		{"/../../v1/login", "/v1/login"},
		{"/v1%2Flogin", "/v1/login"},
		{"/v1/login#top", "/v1/login"},
		{"/v1/login/.", "/v1/login"},
		{"/v1/login/x/..", "/v1/login"},
		{"https://api.example.com/v1/login?x", "/v1/login"},
		{"http://api.example.com", "/"},
		{"http://h?q", "/"},
		{"/?a=1", "/"},
		{"//", "/"},
		{"/..", "/"},
		{"/caf\xc3\xa9", "/caf%C3%A9"},
		{"/caf%c3%a9", "/caf%C3%A9"},
		{"/caf%C3%A9", "/caf%C3%A9"},
		{"/a%20b", "/a%20b"},
		{"/a b", "/a%20b"},
		{"/a%3Fb?c", "/a%3Fb"},
		{"/a%25", "/a%25"},
		{"/a%zz", "/a%25zz"},
		{"/a%2", "/a%252"},
		{"/a;b=c,d", "/a;b=c,d"},
		{"/~user/@x:y", "/~user/@x:y"},
		{"/v1/users/%7Bid%7d", "/v1/users/{id}"},
		{"/v1/users/{id}", "/v1/users/{id}"},
		{"/a\\b%22", "/a\\b\""},
		{"/a\x7fb\tc", "/a%7Fb%09c"},
	} {
		if got := NormalizePath(c.in); got != c.want {
			t.Errorf("NormalizePath(%q) = %q, want %q", c.in, got, c.want)
		}
		if got := NormalizePath(NormalizePath(c.in)); got != NormalizePath(c.in) {
			t.Errorf("NormalizePath is not idempotent on %q: %q, then %q", c.in, NormalizePath(c.in), got)
		}
	}
}

func TestNormalizePathAllocs(t *testing.T) {
	for _, p := range []string{"/v1/users/42/orders", "/v1/users/42/orders?page=2&x=%20", "/caf%C3%A9"} {
		if n := testing.AllocsPerRun(100, func() { _ = NormalizePath(p) }); n != 0 {
			t.Errorf("NormalizePath(%q): %v allocations, want 0", p, n)
		}
	}
}

func TestQueryParam(t *testing.T) {
	for _, c := range []struct {
		q, name, want string
		found, twice  bool
	}{
		{"page=2", "page", "2", true, false},
		{"a=1&page=2&b", "page", "2", true, false},
		{"pag%65=2", "page", "2", true, false},
		{"page=a+b", "page", "a b", true, false},
		{"page=a%20b", "page", "a b", true, false},
		{"page=1&page=1", "page", "1", true, false},
		{"page=1&page=2", "page", "1", true, true},
		{"page", "page", "", true, false},
		{"pages=1", "page", "", false, false},
		{"", "page", "", false, false},
		// ';' separates pairs too (Rack 2, Python before 3.9.2, Perl CGI).
		{"page=1;x=7", "page", "1", true, false},
		{"x=7;page=1", "page", "1", true, false},
		{"page=1;page=2", "page", "1", true, true},
	} {
		v, found, twice := QueryParam(c.q, c.name)
		if v != c.want || found != c.found || twice != c.twice {
			t.Errorf("QueryParam(%q, %q) = %q, %v, %v; want %q, %v, %v", c.q, c.name, v, found, twice, c.want, c.found, c.twice)
		}
	}
}

// TestRuleValuesNormalized: a rule's path values are written in the form
// requests' paths take, so that a rule written with a trailing slash or an
// escape still matches.
func TestRuleValuesNormalized(t *testing.T) {
	s, err := Parse("a.yaml", []byte(`domain: a
rules:
  - {id: value, match: [{key: path, value: /v1/%6Cogin/}], limit: 1, period: 1s}
  - {id: values, match: [{key: path, values: [/a/, /b/./c]}], limit: 1, period: 1s}
  - {id: prefix, match: [{key: path, prefix: /admin/}], limit: 1, period: 1s}
  - {id: template, match: [{key: path, template: "/v1/caf\u00e9/{id}/"}], limit: 1, period: 1s}
  - {id: route-name, match: [{key: route, value: login}], limit: 1, period: 1s}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key  Key
		v    string
		want []string
	}{
		{KeyPath, "/v1/login", []string{"value"}},
		{KeyPath, "/a", []string{"values"}},
		{KeyPath, "/b/c", []string{"values"}},
		{KeyPath, "/admin", []string{"prefix"}},
		{KeyPath, "/admin/x", []string{"prefix"}},
		{KeyPath, "/administrator", nil},
		{KeyPath, NormalizePath("/v1/café/7"), []string{"template"}},
		{KeyRoute, "login", []string{"route-name"}},
	} {
		var d Descriptors
		d[c.key] = c.v
		var got []string
		for _, r := range s.Match(&d, nil) {
			got = append(got, r.ID)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s=%q: matched %v, want %v", c.key, c.v, got, c.want)
		}
	}
}

// TestIgnoreCase: a match with ignore_case passes every case of its value
// and keys them in one bucket; without it, case matters.
func TestIgnoreCase(t *testing.T) {
	s, err := Parse("a.yaml", []byte(`domain: a
rules:
  - {id: folded, match: [{key: path, value: /v1/login, ignore_case: true}], limit: 1, period: 1s}
  - {id: exact, match: [{key: path, value: /v1/login}], limit: 1, period: 1s}
  - {id: prefix, match: [{key: path, prefix: /Admin/, ignore_case: true}], limit: 1, period: 1s}
  - {id: template, match: [{key: path, template: "/v1/Users/{id}", ignore_case: true}], limit: 1, period: 1s}
  - {id: glob, match: [{key: user, wildcard: "BOT-*", ignore_case: true}], limit: 1, period: 1s}
`))
	if err != nil {
		t.Fatal(err)
	}
	match := func(k Key, v string) (ids []string, tags []string) {
		var d Descriptors
		d[k] = v
		for _, r := range s.Match(&d, nil) {
			ids = append(ids, r.ID)
			tags = append(tags, EntityTag(r, &d))
		}
		return ids, tags
	}
	ids, lower := match(KeyPath, "/v1/login")
	if !slices.Equal(ids, []string{"folded", "exact"}) {
		t.Fatalf("/v1/login: %v", ids)
	}
	ids, upper := match(KeyPath, "/V1/LOGIN")
	if !slices.Equal(ids, []string{"folded"}) {
		t.Errorf("/V1/LOGIN: matched %v, want [folded]", ids)
	} else if upper[0] != lower[0] {
		t.Errorf("/V1/LOGIN keyed %s, /v1/login %s: want one bucket", upper[0], lower[0])
	}
	for _, c := range []struct {
		k    Key
		v    string
		want string
	}{{KeyPath, "/admin", "prefix"}, {KeyPath, "/ADMIN/x", "prefix"}, {KeyPath, "/V1/USERS/7", "template"}, {KeyUser, "bot-x", "glob"}} {
		if ids, _ := match(c.k, c.v); !slices.Equal(ids, []string{c.want}) {
			t.Errorf("%s=%q: matched %v, want [%s]", c.k, c.v, ids, c.want)
		}
	}
	if _, err := Parse("b.yaml", []byte("domain: a\nrules:\n  - {id: x, match: [{key: client_ip, ignore_case: true}], limit: 1, period: 1s}\n")); err == nil || !strings.Contains(err.Error(), "ignore_case") {
		t.Errorf("ignore_case on client_ip: %v, want an error", err)
	}
}

// muxRoutes are the handlers of TestRespellingsRouteAlike's origin, as Go's
// ServeMux routes them, and rules for the same paths.
var muxRoutes = []struct{ pattern, rule string }{
	{"/v1/login", "{key: path, value: /v1/login}"},
	{"/v1/users/{id}/orders", `{key: path, template: "/v1/users/{id}/orders"}`},
	{"/v1/files/{rest...}", `{key: path, template: "/v1/files/{rest...}"}`},
	{"/caf\u00e9/{id}", `{key: path, template: "/caf\u00e9/{id}"}`},
}

// TestRespellingsRouteAlike is the property of issue 35: any respelling of
// a path that Go's net/http ServeMux (a real server's request parsing,
// following its redirects to the clean path) routes to the same handler,
// with the same wildcard values, as the path itself matches the same rules
// with the same keys once normalized. The respellings are random: escapes of
// any byte in either hex case, dot segments, duplicate slashes, a trailing
// slash, queries. cmd/sluice's gateway test checks the same against a real
// nginx.
func TestRespellingsRouteAlike(t *testing.T) {
	var yml strings.Builder
	yml.WriteString("domain: a\nrules:\n")
	mux := http.NewServeMux()
	for i, r := range muxRoutes {
		fmt.Fprintf(&yml, "  - {id: r%d, match: [%s], limit: 1, period: 1s}\n", i, r.rule)
		mux.HandleFunc(r.pattern, func(w http.ResponseWriter, req *http.Request) {
			fmt.Fprintf(w, "r%d %q %q", i, req.PathValue("id"), req.PathValue("rest"))
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, req *http.Request) { fmt.Fprint(w, "catch-all") })
	set, err := Parse("mux.yaml", []byte(yml.String()))
	if err != nil {
		t.Fatal(err)
	}
	bases := []string{"/v1/login", "/v1/users/42/orders", "/v1/users/a%20b/orders", "/v1/files/a/b.txt", "/v1/files/x", "/caf%C3%A9/7"}
	rng := rand.New(rand.NewPCG(35, 1))
	checked := 0
	for _, base := range bases {
		want := route(t, mux, base)
		if want == "catch-all" || want == "" {
			t.Fatalf("%s: routed to %q: the test's routes are wrong", base, want)
		}
		wantIDs, wantTags := matchPath(set, NormalizePath(base))
		if len(wantIDs) != 1 {
			t.Fatalf("%s: matched %v, want one rule", base, wantIDs)
		}
		for range 1000 {
			s := respell(rng, base)
			if got := route(t, mux, s); got != want {
				continue // another handler, or a request the server refuses
			}
			checked++
			ids, tags := matchPath(set, NormalizePath(s))
			if !slices.Equal(ids, wantIDs) || !slices.Equal(tags, wantTags) {
				t.Errorf("%q routes as %q (%s) but normalizes to %q: rules %v keys %v, want %v %v",
					s, base, want, NormalizePath(s), ids, tags, wantIDs, wantTags)
			}
		}
	}
	if checked < 1000 {
		t.Errorf("only %d respellings routed alike: the generator is too wild to test much", checked)
	}
	t.Logf("%d respellings routed to their base's handler, all normalized alike", checked)
}

func matchPath(set *Set, p string) (ids, tags []string) {
	var d Descriptors
	d[KeyPath] = p
	for _, r := range set.Match(&d, nil) {
		ids = append(ids, r.ID)
		tags = append(tags, EntityTag(r, &d))
	}
	return ids, tags
}

// route returns what mux answers for the request target s, read as a
// server reads a request line, following up to 3 redirects; "" when the
// request is refused.
func route(t *testing.T, mux http.Handler, s string) string {
	for range 4 {
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader("GET " + s + " HTTP/1.1\r\nHost: x\r\n\r\n")))
		if err != nil {
			return ""
		}
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		if rec.Code/100 == 3 {
			loc, err := req.URL.Parse(rec.Header().Get("Location"))
			if err != nil {
				t.Fatal(err)
			}
			s = loc.RequestURI()
			continue
		}
		if rec.Code != http.StatusOK {
			return ""
		}
		return rec.Body.String()
	}
	return ""
}

// respell spells the path p (canonical) another way.
func respell(rng *rand.Rand, p string) string {
	segs := strings.Split(p[1:], "/")
	var b strings.Builder
	for i, seg := range segs {
		b.WriteByte('/')
		if rng.IntN(6) == 0 {
			// A dot segment, an empty one, or a detour: the same path once resolved.
			b.WriteString([]string{"./", "/", "x/../", "%2e/", "x/%2E%2e/", "x%2F..%2F"}[rng.IntN(6)])
		}
		raw, _ := url.PathUnescape(seg)
		for j := 0; j < len(raw); j++ {
			c := raw[j]
			if rng.IntN(4) == 0 || !pathChar(c) {
				hex := fmt.Sprintf("%%%02X", c)
				if rng.IntN(2) == 0 {
					hex = strings.ToLower(hex)
				}
				b.WriteString(hex)
				continue
			}
			b.WriteByte(c)
		}
		if i < len(segs)-1 && rng.IntN(8) == 0 {
			b.WriteString("/") // a doubled slash
		}
	}
	if rng.IntN(5) == 0 {
		b.WriteByte('/')
	}
	switch rng.IntN(4) {
	case 0:
		b.WriteString("?")
	case 1:
		fmt.Fprintf(&b, "?x=%d&y=%%2F", rng.IntN(100))
	}
	return b.String()
}

// FuzzNormalizePath: any input, no panic; the result is in its own form
// (normalizing it again changes nothing), and a path's is a canonical path
// with no query or fragment.
func FuzzNormalizePath(f *testing.F) {
	for _, s := range []string{"/v1/login?x=1", "//a/./b/../c/", "/%2e%2E/%2F%zz%", "http://h/a?b#c", "login", "/caf\xc3\xa9", "/a%00b", "*", ""} {
		f.Add(s, "page")
	}
	f.Fuzz(func(t *testing.T, s, param string) {
		n := NormalizePath(s)
		if NormalizePath(n) != n {
			t.Fatalf("NormalizePath(%q) = %q, and again %q", s, n, NormalizePath(n))
		}
		if p, ok := pathPart(s); ok && p != "" && !canonicalPath(n) {
			t.Fatalf("NormalizePath(%q) = %q: not canonical", s, n)
		}
		_, _, _ = QueryParam(QueryOf(s), param)
	})
}
