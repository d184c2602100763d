package rules

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The rule files in testdata/rules, as Prometheus keeps config/testdata:
// every *.good.yaml must load, and every *.bad.yaml must fail with exactly
// the error in badConfigs (file:line:column and the fix).

var badConfigs = []struct{ file, err string }{
	{"adaptive-floor-zero.bad.yaml",
		`adaptive-floor-zero.bad.yaml:7:15: rule 1: invalid rule "search": adaptive: floor 0: want a fraction of the limit in (0, 1], e.g. 0.2`},
	{"adaptive-floor-above-one.bad.yaml",
		`adaptive-floor-above-one.bad.yaml:3:95: rule 1: invalid rule "search": adaptive: floor 1.5: want a fraction of the limit in (0, 1], e.g. 0.2`},
	{"adaptive-floor-not-number.bad.yaml",
		`adaptive-floor-not-number.bad.yaml:8:7: rule 1: invalid rule "search": adaptive: floor "low" is not a number: give the least fraction of the limit, in (0, 1], e.g. 0.2`},
	{"shedding-unknown-priority.bad.yaml",
		`shedding-unknown-priority.bad.yaml:6:17: shedding: route "/v1/search": unknown priority "low": want critical, normal or sheddable`},
	{"shedding-threshold-not-number.bad.yaml",
		`shedding-threshold-not-number.bad.yaml:6:16: shedding: thresholds: sheddable: "high" is not a number: give the load (work in flight ÷ capacity) at which sheddable requests are shed, e.g. 0.8`},
	{"shedding-thresholds-order.bad.yaml",
		`shedding-thresholds-order.bad.yaml:5:3: shedding: thresholds: want sheddable ≤ normal ≤ critical (sheddable requests are shed first), got 0.95, 0.9, 1`},
	{"shedding-threshold-zero.bad.yaml",
		`shedding-threshold-zero.bad.yaml:5:26: shedding: thresholds: critical: 0: want a load above 0, e.g. 0.8`},
	{"local-failure-mode.bad.yaml",
		`local-failure-mode.bad.yaml:8:19: rule 1: invalid rule "per-ip-edge": a local rule never calls Redis, so it has no failure mode: remove failure_mode`},
	{"local-global.bad.yaml",
		`local-global.bad.yaml:8:12: rule 1: invalid rule "per-ip-edge": a local rule is counted in each enforcer's memory, so it cannot be global: remove global, or scope`},
	{"local-sliding.bad.yaml",
		`local-sliding.bad.yaml:8:12: rule 1: invalid rule "per-asn-edge": a local rule is a token bucket in the enforcer's memory: remove algorithm sliding_window, or scope`},
	{"local-unknown-scope.bad.yaml",
		`local-unknown-scope.bad.yaml:7:12: rule 1: invalid rule "per-ip-edge": scope "instance": want region (counted in the region's Redis, the default) or local (counted in each enforcer's memory)`},
	{"missing-limit.bad.yaml",
		`missing-limit.bad.yaml:3:5: rule 1: invalid rule "forgot-the-limit": limit is missing: give the requests per period, e.g. limit: 100, or limit: 0 to block`},
	{"bad-cidr.bad.yaml",
		`bad-cidr.bad.yaml:4:12: rule 1: invalid rule "office": match client_ip: cidr "10.0.0.0/33": not a network such as 10.0.0.0/8 or 2001:db8::/32`},
	{"bad-duration.bad.yaml",
		`bad-duration.bad.yaml:6:13: rule 1: invalid rule "per-ip": period "10 minutes": time: unknown unit " minutes" in duration "10 minutes" (write a Go duration such as 7s, 15m, 1h)`},
	{"calendar-with-period.bad.yaml",
		`calendar-with-period.bad.yaml:8:13: rule 1: invalid rule "daily": a calendar window has no period: remove period, or calendar`},
	{"pinned-not-global.bad.yaml",
		`pinned-not-global.bad.yaml:7:13: rule 1: invalid rule "paid-calls": pinned applies only to global rules: add global: true`},
	{"g-counter-timezone.bad.yaml",
		`g-counter-timezone.bad.yaml:8:15: rule 1: invalid rule "daily-quota": a g_counter quota's windows are UTC, so that every region closes them at the same instant: remove timezone Europe/Berlin`},
	{"g-counter-token-bucket.bad.yaml",
		`g-counter-token-bucket.bad.yaml:8:16: rule 1: invalid rule "daily-quota": g_counter needs algorithm fixed_window (a calendar day, week or month, or a period)`},
	{"cidr-not-client-ip.bad.yaml",
		`cidr-not-client-ip.bad.yaml:4:12: rule 1: invalid rule "office": match user: cidr applies only to client_ip`},
	{"cidr-not-network.bad.yaml",
		`cidr-not-network.bad.yaml:4:12: rule 1: invalid rule "office": match client_ip: cidr 10.1.2.3/8: write the network's first address, 10.0.0.0/8`},
	{"concurrency-period.bad.yaml",
		`concurrency-period.bad.yaml:7:13: rule 1: invalid rule "in-flight": a concurrency rule has no period: its limit is requests in flight; set lease (the longest a request holds its slot), e.g. lease: 30s`},
	{"custom-key-well-known.bad.yaml",
		`custom-key-well-known.bad.yaml:2:15: custom_keys: "user" is a well-known key (user): remove it from custom_keys`},
	{"duplicate-id.bad.yaml",
		`duplicate-id.bad.yaml:7:5: rule 2: invalid rule "per-ip": id already used by rule 1; ids must be unique`},
	{"envoy-alias-conflict.bad.yaml",
		`envoy-alias-conflict.bad.yaml:5:10: descriptor keys "masked_remote_address" and "remote_address" (line 3) both mean sluice's client_ip: use one name for it`},
	{"envoy-bad-key-name.bad.yaml",
		`envoy-bad-key-name.bad.yaml:3:10: descriptor key "x plan": a key name is 1 to 64 printable ASCII characters without spaces`},
	{"envoy-composite-collision.bad.yaml",
		`envoy-composite-collision.bad.yaml:6:5: descriptor header_x=id and descriptor header=x_id (line 3 column 5) are both "header_x_id" to envoyproxy/ratelimit, which joins key and value with _: rename one`},
	{"envoy-descriptors-not-list.bad.yaml",
		`envoy-descriptors-not-list.bad.yaml:3:3: descriptors: want a list of descriptors, each a mapping with key (and value, rate_limit, descriptors)`},
	{"envoy-duplicate-descriptor.bad.yaml",
		`envoy-duplicate-descriptor.bad.yaml:8:5: descriptor remote_address=50.0.0.5 is given twice at this level (also at line 3 column 5): merge the two`},
	{"envoy-duplicate-field.bad.yaml",
		`envoy-duplicate-field.bad.yaml:5:5: field key is given twice in a descriptor (also at line 3 column 5): keep one`},
	{"envoy-key-repeated.bad.yaml",
		`envoy-key-repeated.bad.yaml:6:14: descriptor key "generic_key" repeats the key of an enclosing descriptor (line 3): sluice matches a descriptor's entries by key, so a key can appear at one level only`},
	{"envoy-missing-domain.bad.yaml",
		"envoy-missing-domain.bad.yaml:1:1: domain is missing: add e.g. `domain: api` at the top"},
	{"envoy-missing-key.bad.yaml",
		`envoy-missing-key.bad.yaml:3:5: a descriptor has no key: add e.g. key: remote_address`},
	{"envoy-missing-requests.bad.yaml",
		`envoy-missing-requests.bad.yaml:5:7: rate_limit has no requests_per_unit: add e.g. requests_per_unit: 100 (0 denies every request), or unlimited: true`},
	{"envoy-missing-unit.bad.yaml",
		`envoy-missing-unit.bad.yaml:5:7: rate_limit has no unit: add unit: second (or minute, hour, day, week, month, year), or unlimited: true`},
	{"envoy-mixed-formats.bad.yaml",
		`envoy-mixed-formats.bad.yaml:2:1: unknown field "rules" at the top level (known: domain, descriptors); rules is sluice's own format, and a file with descriptors: is an envoyproxy/ratelimit config: keep to one format (sluice rules convert rewrites an envoy config in sluice's)`},
	{"envoy-negative-requests.bad.yaml",
		`envoy-negative-requests.bad.yaml:6:26: requests_per_unit "-1": want a whole number from 0 to 4294967295 (0 denies every request)`},
	{"envoy-only-unlimited.bad.yaml",
		`envoy-only-unlimited.bad.yaml: no rate limits: no descriptor has a rate_limit that sluice would enforce (unlimited ones make no rule)`},
	{"envoy-replaces-itself.bad.yaml",
		`envoy-replaces-itself.bad.yaml:8:18: rate_limit "per_user" replaces itself: remove its own name from replaces`},
	{"envoy-replaces-unknown.bad.yaml",
		`envoy-replaces-unknown.bad.yaml:9:18: replaces "per-user": no rate_limit in this file has that name`},
	{"envoy-requests-not-number.bad.yaml",
		`envoy-requests-not-number.bad.yaml:6:26: requests_per_unit "ten": want a whole number from 0 to 4294967295 (0 denies every request)`},
	{"envoy-shadow-not-bool.bad.yaml",
		`envoy-shadow-not-bool.bad.yaml:5:18: shadow_mode: "yes" is not true or false`},
	{"envoy-shadow-without-limit.bad.yaml",
		`envoy-shadow-without-limit.bad.yaml:4:5: shadow_mode applies only to a descriptor with a rate_limit (it is not inherited): move it beside the rate_limit it should soften`},
	{"envoy-share-threshold-not-wildcard.bad.yaml",
		`envoy-share-threshold-not-wildcard.bad.yaml:5:5: share_threshold applies only to a wildcard value (one ending in *, e.g. value: files/*), not to files=files/a.pdf`},
	{"envoy-unknown-field-descriptor.bad.yaml",
		`envoy-unknown-field-descriptor.bad.yaml:4:5: unknown field "unit" in a descriptor (known: key, value, rate_limit, descriptors, shadow_mode, detailed_metric, share_threshold, value_to_metric); unit belongs under rate_limit:`},
	{"envoy-unknown-field-rate-limit.bad.yaml",
		`envoy-unknown-field-rate-limit.bad.yaml:7:7: unknown field "shadow_mode" in rate_limit (known: unit, requests_per_unit, unlimited, name, replaces); shadow_mode belongs to the descriptor, beside rate_limit:`},
	{"envoy-unknown-field-replaces.bad.yaml",
		`envoy-unknown-field-replaces.bad.yaml:12:35: unknown field "id" in a replaces entry (known: name)`},
	{"envoy-unknown-field-top.bad.yaml",
		`envoy-unknown-field-top.bad.yaml:2:1: unknown field "descriptor_defaults" at the top level (known: domain, descriptors)`},
	{"envoy-unknown-unit.bad.yaml",
		`envoy-unknown-unit.bad.yaml:5:13: rate_limit unit "fortnight": want second, minute, hour, day, week, month or year`},
	{"envoy-unlimited-replaces.bad.yaml",
		`envoy-unlimited-replaces.bad.yaml:8:7: an unlimited rate_limit makes no rule in sluice, so it cannot replace others: remove replaces, or give it a limit`},
	{"envoy-unlimited-with-requests.bad.yaml",
		`envoy-unlimited-with-requests.bad.yaml:6:26: an unlimited rate_limit has no requests_per_unit: remove requests_per_unit, or unlimited`},
	{"envoy-unlimited-with-unit.bad.yaml",
		`envoy-unlimited-with-unit.bad.yaml:5:13: an unlimited rate_limit has no unit: remove unit, or unlimited`},
	{"envoy-year-too-large.bad.yaml",
		`envoy-year-too-large.bad.yaml:5:7: requests_per_unit 1000000000 per year is more than sluice counts in one window (at most 142808: a count times the window in milliseconds stays within 2^52): use a shorter unit with a proportional limit`},
	{"global-not-bool.bad.yaml",
		`global-not-bool.bad.yaml:7:13: "yes please" is not true or false`},
	{"limit-not-number.bad.yaml",
		`limit-not-number.bad.yaml:5:12: "60" is not a whole number`},
	{"missing-domain.bad.yaml",
		"missing-domain.bad.yaml:1:1: domain is missing: add e.g. `domain: api` at the top"},
	{"replaces-unknown.bad.yaml",
		`replaces-unknown.bad.yaml:3:5: rule 1: invalid rule "acme": replaces "tier-fre", which is not a rule of this file`},
	{"sub-millisecond-period.bad.yaml",
		`sub-millisecond-period.bad.yaml:6:13: rule 1: invalid rule "per-ip": period must be a whole number of milliseconds >= 1ms, got 1.5ms`},
	{"template-not-path.bad.yaml",
		`template-not-path.bad.yaml:4:12: rule 1: invalid rule "orders": match user: template applies only to path and route`},
	{"two-conditions.bad.yaml",
		`two-conditions.bad.yaml:4:12: rule 1: invalid rule "v1": match path: use one of value, values, prefix, wildcard, cidr and template`},
	{"undeclared-custom-key.bad.yaml",
		`undeclared-custom-key.bad.yaml:4:12: rule 1: invalid rule "per-plan": unknown descriptor key "x-plan" (want one of [api_key user tenant client_ip asn ja4 method route path account org tier]); for a key of your own, declare it at the top: custom_keys: [x-plan]`},
	{"unknown-field-match.bad.yaml",
		"unknown-field-match.bad.yaml:4:30: field values_not not found in a match entry (known: key, value, values, prefix, wildcard, cidr, template, not, not_prefix, shared, ignore_case)"},
	{"unknown-field-rule.bad.yaml",
		"unknown-field-rule.bad.yaml:7:5: field capacity not found in a rule (known: id, description, match, algorithm, limit, period, burst, calendar, timezone, lease, mode, failure_mode, global, pinned, g_counter, exact_keys, replaces, scope, adaptive)"},
	{"unknown-field-top.bad.yaml",
		"unknown-field-top.bad.yaml:2:1: field rule not found at the top level (known: version, domain, custom_keys, rules, costs, shedding)"},
	// Syntax errors point at the line that breaks the YAML, not at the
	// start of the list item or mapping the parser was reading.
	{"syntax-unclosed-list.bad.yaml", `syntax-unclosed-list.bad.yaml:6:5: did not find expected ',' or ']'`},
	{"syntax-indent.bad.yaml", `syntax-indent.bad.yaml:12:4: did not find expected '-' indicator`},
	{"unknown-timezone.bad.yaml",
		`unknown-timezone.bad.yaml:8:15: rule 1: invalid rule "daily": timezone "Europe/Atlantis": unknown time zone Europe/Atlantis (write an IANA name such as Europe/Berlin or UTC)`},
	{"wildcard-without-star.bad.yaml",
		`wildcard-without-star.bad.yaml:4:12: rule 1: invalid rule "static": match path: wildcard "/static/app.js" has no '*': use value for an exact match`},
}

func fixtureFiles(t *testing.T, pattern string) []string {
	t.Helper()
	fs, err := filepath.Glob(filepath.Join("..", "testdata", "rules", pattern))
	if err != nil {
		t.Fatal(err)
	}
	for i := range fs {
		fs[i] = filepath.Base(fs[i])
	}
	return fs
}

func TestBadConfigs(t *testing.T) {
	files := fixtureFiles(t, "*.bad.yaml")
	if len(files) < 20 {
		t.Fatalf("%d bad fixtures, want at least 20", len(files))
	}
	for _, c := range badConfigs {
		if !slices.Contains(files, c.file) {
			t.Errorf("%s: in the table but not in testdata/rules", c.file)
			continue
		}
		_, err := Parse(c.file, readFixture(t, c.file))
		switch {
		case err == nil:
			t.Errorf("%s: loaded, want error %q", c.file, c.err)
		case err.Error() != c.err:
			t.Errorf("%s:\n got error %q\nwant error %q", c.file, err, c.err)
		}
	}
	for _, f := range files {
		if !slices.ContainsFunc(badConfigs, func(c struct{ file, err string }) bool { return c.file == f }) {
			t.Errorf("%s: no expected error in badConfigs", f)
		}
	}
}

func TestGoodConfigs(t *testing.T) {
	files := fixtureFiles(t, "*.good.yaml")
	if len(files) < 15 {
		t.Fatalf("%d good fixtures", len(files))
	}
	kinds := map[string]bool{}
	for _, f := range files {
		path := filepath.Join("..", "testdata", "rules", f)
		s, err := Load(path)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if len(s.Rules) == 0 || s.Domain == "" {
			t.Errorf("%s: %d rules, domain %q", f, len(s.Rules), s.Domain)
		}
		// Marshal writes the set back in sluice's format, which parses into
		// the same set (DetailedMetric, which the format has no field for,
		// aside).
		out, err := Marshal(s)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		back, err := Parse("marshalled-"+f, out)
		if err != nil {
			t.Fatalf("%s: marshalled form does not parse: %v\n%s", f, err, out)
		}
		sameSet(t, f+" (marshalled)", back, s, true)
		if strings.HasPrefix(f, "envoy-") {
			continue
		}
		for _, r := range s.Rules {
			kinds[r.Algorithm.String()] = true
			kinds["calendar "+r.Calendar.String()] = r.Calendar != NoCalendar || kinds["calendar "+r.Calendar.String()]
			for _, m := range r.Match {
				for k, on := range map[string]bool{"value": m.Value != "", "values": m.Values != nil, "prefix": m.Prefix != "",
					"wildcard": m.Wildcard != "", "cidr": m.CIDR != nil, "template": m.Template != "", "not": m.Not != nil,
					"not_prefix": m.NotPrefix != nil, "shared": m.Shared, "custom key": m.Key == KeyCustom,
					"account": m.Key == KeyAccount, "org": m.Key == KeyOrg, "tier": m.Key == KeyTier} {
					kinds[k] = kinds[k] || on
				}
			}
			for k, on := range map[string]bool{"limit 0": r.Limit == 0, "exact_keys": r.ExactKeys, "replaces": len(r.Replaces) > 0,
				"shadow": r.Mode == Shadow, "global": r.Global, "pinned": r.Pinned, "g_counter": r.GCounter, "fail closed": r.FailureMode == FailClosed,
				"fail open unlimited": r.FailureMode == FailOpenUnlimited, "burst": r.Burst != r.Limit, "timezone": r.Location != nil} {
				kinds[k] = kinds[k] || on
			}
		}
		kinds["costs"] = kinds["costs"] || len(s.Costs) > 0
		kinds["version"] = kinds["version"] || s.Version > 1
	}
	for _, k := range []string{"token_bucket", "sliding_window", "fixed_window", "concurrency", "calendar day", "calendar week",
		"calendar month", "value", "values", "prefix", "wildcard", "cidr", "template", "not", "not_prefix", "shared",
		"custom key", "account", "org", "tier", "limit 0", "exact_keys", "replaces", "shadow", "global", "pinned", "g_counter", "fail closed",
		"fail open unlimited", "burst", "timezone", "costs", "version"} {
		if !kinds[k] {
			t.Errorf("no good sluice-format fixture has %s", k)
		}
	}
}

// TestFixtureErrorsNameTheirLine checks that every Envoy-format error names
// file:line:column, except the one about the file as a whole.
func TestFixtureErrorsNameTheirLine(t *testing.T) {
	for _, c := range badConfigs {
		if !strings.HasPrefix(c.file, "envoy-") || c.file == "envoy-only-unlimited.bad.yaml" {
			continue
		}
		rest, ok := strings.CutPrefix(c.err, c.file+":")
		if !ok || !strings.Contains(rest[:min(len(rest), 8)], ":") {
			t.Errorf("%s: %q names no line and column", c.file, c.err)
		}
	}
}
