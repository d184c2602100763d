package rules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// The YAML shape of a rule file. Unknown fields are errors.
//
//	domain: api
//	rules:
//	  - id: per-ip
//	    match: [{key: client_ip}]
//	    limit: 1        # tokens per period
//	    period: 1s      # any Go duration: 7s, 15m, 1h
//	    burst: 60       # capacity; default = limit
//	    mode: enforce   # or shadow
//	    failure_mode: open   # a local bucket while Redis fails; or open_unlimited, closed
//	    global: false   # true: the limit holds across regions, split by shares
//	    pinned: false   # global only: counted in the entity's home region, checked from every region
//	    algorithm: token_bucket  # or sliding_window, fixed_window, concurrency
//	    scope: region   # or local: counted in each enforcer's memory, never in Redis (token buckets)
//	  - id: per-tenant-month
//	    match: [{key: tenant}]
//	    algorithm: fixed_window
//	    limit: 1000000
//	    calendar: month          # or day, week (ISO, from Monday); no period
//	    timezone: Europe/Berlin  # IANA name; default UTC
//	  - id: per-key-day
//	    match: [{key: api_key}]
//	    algorithm: fixed_window
//	    limit: 100000
//	    calendar: day            # UTC
//	    global: true
//	    g_counter: true          # each region counts its own; the merged sum is checked
//	  - id: in-flight
//	    match: [{key: api_key}]
//	    algorithm: concurrency
//	    limit: 10       # requests in flight
//	    lease: 30s      # a request's slot is freed after at most this; default 30s
//	costs:              # default cost (hits_addend) per route; else 1
//	  /v1/search: 5
type fileYAML struct {
	Version    wholeNumber            `yaml:"version"`
	Domain     string                 `yaml:"domain"`
	CustomKeys []string               `yaml:"custom_keys"`
	Rules      []ruleYAML             `yaml:"rules"`
	Costs      map[string]wholeNumber `yaml:"costs"`
	Shedding   yaml.Node              `yaml:"shedding"`
}

type ruleYAML struct {
	ID          string       `yaml:"id"`
	Description string       `yaml:"description"`
	Match       []matchYAML  `yaml:"match"`
	Algorithm   string       `yaml:"algorithm"`
	Limit       *wholeNumber `yaml:"limit"` // nil: missing, an error (0 blocks, so it is never a default)
	Period      string       `yaml:"period"`
	Burst       wholeNumber  `yaml:"burst"`
	Calendar    string       `yaml:"calendar"`
	Timezone    string       `yaml:"timezone"`
	Lease       string       `yaml:"lease"`
	Mode        string       `yaml:"mode"`
	FailureMode string       `yaml:"failure_mode"`
	Global      strictBool   `yaml:"global"`
	Pinned      strictBool   `yaml:"pinned"`
	GCounter    strictBool   `yaml:"g_counter"`
	ExactKeys   strictBool   `yaml:"exact_keys"`
	Replaces    []string     `yaml:"replaces"`
	Scope       string       `yaml:"scope"`
	Adaptive    yaml.Node    `yaml:"adaptive"`
}

// DefaultLease is a concurrency rule's lease TTL when the file gives none.
const DefaultLease = 30 * time.Second

// wholeNumber is an integer written as one: 1.5 or "10" is an error, where
// the YAML decoder would truncate or convert.
type wholeNumber int64

func (n *wholeNumber) UnmarshalYAML(v *yaml.Node) error {
	if v.Kind == yaml.ScalarNode && v.Tag == "!!float" && isDigits(strings.TrimLeft(v.Value, "+-")) {
		// Digits past int64's range: YAML reads them as a float.
		return fmt.Errorf("line %d column %d: %s is too large: at most 2^52", v.Line, v.Column, v.Value)
	}
	if v.Kind != yaml.ScalarNode || v.Tag != "!!int" {
		return fmt.Errorf("line %d column %d: %q is not a whole number", v.Line, v.Column, v.Value)
	}
	// Decimal digits only, as YAML 1.2 and the Envoy format read them: the
	// YAML 1.1 forms yaml.v3 also takes made "limit: 010" 8 (found by a
	// fresh user), and 0x10, 0b101 and 1_000 pass unnoticed.
	digits := v.Value
	if digits != "" && (digits[0] == '+' || digits[0] == '-') {
		digits = digits[1:]
	}
	if !isDigits(digits) {
		return fmt.Errorf("line %d column %d: %s: write a whole number in decimal digits", v.Line, v.Column, v.Value)
	}
	x, err := strconv.ParseInt(v.Value, 10, 64)
	if err != nil {
		return fmt.Errorf("line %d column %d: %s is too large: at most 2^52", v.Line, v.Column, v.Value)
	}
	*n = wholeNumber(x)
	return nil
}

// isDigits reports whether s is one or more ASCII digits.
func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// strictBool is true or false, unquoted.
type strictBool bool

func (b *strictBool) UnmarshalYAML(v *yaml.Node) error {
	if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" {
		return fmt.Errorf("line %d column %d: %q is not true or false", v.Line, v.Column, v.Value)
	}
	var x bool
	if err := v.Decode(&x); err != nil {
		return err
	}
	*b = strictBool(x)
	return nil
}

type matchYAML struct {
	Key        string     `yaml:"key"`
	Value      *string    `yaml:"value"`
	Values     stringList `yaml:"values"`
	Prefix     *string    `yaml:"prefix"`
	Wildcard   *string    `yaml:"wildcard"`
	CIDR       stringList `yaml:"cidr"`
	Template   *string    `yaml:"template"`
	Not        stringList `yaml:"not"`
	NotPrefix  stringList `yaml:"not_prefix"`
	Shared     strictBool `yaml:"shared"`
	IgnoreCase strictBool `yaml:"ignore_case"`
}

// stringList is a list of strings, or one string for a list of one.
type stringList []string

func (l *stringList) UnmarshalYAML(v *yaml.Node) error {
	if v.Kind == yaml.ScalarNode {
		var s string
		if err := v.Decode(&s); err != nil {
			return err
		}
		*l = stringList{s}
		return nil
	}
	var ss []string
	if err := v.Decode(&ss); err != nil {
		return fmt.Errorf("line %d column %d: want a string or a list of strings", v.Line, v.Column)
	}
	if ss == nil {
		ss = []string{}
	}
	*l = ss
	return nil
}

// Load reads and parses a rule file; see Parse.
func Load(path string) (*Set, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading rules: %w", err)
	}
	return Parse(path, b)
}

// Parse parses a YAML rule file strictly: unknown fields, duplicate rule ids
// and invalid values are errors. Every error names the file (name), the line
// and column, and what to fix. The returned Set has the file's version, or 1
// when it gives none. A file with a top-level descriptors field is an
// envoyproxy/ratelimit config, read by ParseEnvoy.
func Parse(name string, data []byte) (*Set, error) {
	// One untyped parse tells the format and gives the positions for
	// errors; the strict decode below is the second and last.
	var root yaml.Node
	if yaml.Unmarshal(data, &root) == nil && isEnvoyNode(&root) {
		return ParseEnvoy(name, data)
	}
	var f fileYAML
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: empty rule file: want a mapping with domain and rules", name)
		}
		return nil, positioned(name, data, err)
	}
	if line, ok := secondDocument(dec); ok {
		return nil, fmt.Errorf("%s:%d:1: a second YAML document (---) starts here: put every rule in one document", name, line)
	}
	pos := rulePositions(&root)                     // root parsed: the strict decode of the same text succeeded
	top := func(field string, item string) string { // the position of a top-level field, or of one of its items
		if n := topField(&root, field, item); n != nil {
			return fmt.Sprintf("%s:%d:%d", name, n.Line, n.Column)
		}
		return name + ":1:1"
	}
	at := func(i int) string {
		if i < len(pos) {
			return fmt.Sprintf("%s:%d:%d", name, pos[i].Line, pos[i].Column)
		}
		return name
	}
	// atErr is where rule i's error points: the field it names, else the rule.
	atErr := func(i int, err error) string {
		var fe *fieldError
		if i < len(pos) && errors.As(err, &fe) {
			if n := mappingValue(pos[i], fe.field); n != nil {
				return fmt.Sprintf("%s:%d:%d", name, n.Line, n.Column)
			}
		}
		return at(i)
	}
	if f.Domain == "" {
		return nil, fmt.Errorf("%s:1:1: domain is missing: add e.g. `domain: api` at the top", name)
	}
	if len(f.Rules) == 0 {
		return nil, fmt.Errorf("%s: no rules: add a `rules:` list", top("rules", ""))
	}
	if f.Version < 0 {
		return nil, fmt.Errorf("%s: version %d: want a positive whole number", top("version", ""), f.Version)
	}
	custom := map[string]bool{}
	for _, k := range f.CustomKeys {
		if kk, ok := KeyFor(k); !ok || kk != KeyCustom {
			if ok {
				return nil, fmt.Errorf("%s: custom_keys: %q is a well-known key (%s): remove it from custom_keys", top("custom_keys", k), k, kk)
			}
			return nil, fmt.Errorf("%s: custom_keys: %q: a key name is 1 to %d printable ASCII characters without spaces", top("custom_keys", k), k, maxIDLen)
		}
		if custom[k] {
			return nil, fmt.Errorf("%s: custom_keys: %q is declared twice", top("custom_keys", k), k)
		}
		custom[k] = true
	}
	rs := make([]*Rule, 0, len(f.Rules))
	ids := map[string]int{}
	for i, ry := range f.Rules {
		r, err := ry.rule(custom)
		if err == nil {
			err = r.Validate()
		}
		if err != nil {
			return nil, fmt.Errorf("%s: rule %d: %w", atErr(i, err), i+1, err)
		}
		if j, dup := ids[r.ID]; dup {
			return nil, fmt.Errorf("%s: rule %d: %w %q: id already used by rule %d; ids must be unique", at(i), i+1, ErrInvalidRule, r.ID, j+1)
		}
		ids[r.ID] = i
		rs = append(rs, r)
	}
	for i, r := range rs {
		for _, id := range r.Replaces {
			if _, ok := ids[id]; !ok {
				return nil, fmt.Errorf("%s: rule %d: %w %q: replaces %q, which is not a rule of this file", at(i), i+1, ErrInvalidRule, r.ID, id)
			}
		}
	}
	if cycle := replacesCycle(rs); cycle != nil {
		return nil, fmt.Errorf("%s: rule %d: %w %q: replaces go round in a circle (%s): when all of them match, none applies; remove one",
			at(ids[cycle[0]]), ids[cycle[0]]+1, ErrInvalidRule, cycle[0], strings.Join(cycle, " replaces "))
	}
	version := int64(f.Version)
	if version == 0 {
		version = 1
	}
	s := NewSet(f.Domain, version, rs)
	if len(f.Costs) > 0 {
		s.Costs = make(map[string]int64, len(f.Costs))
		for route, c := range f.Costs {
			if c < 1 || c > MaxCost {
				return nil, fmt.Errorf("%s: costs: route %q: cost must be 1 to %d, got %d", top("costs", route), route, MaxCost, c)
			}
			n := NormalizePath(route) // as the enforcer gives requests' routes
			if _, dup := s.Costs[n]; dup {
				return nil, fmt.Errorf("%s: costs: route %q is %q, given twice (routes are compared normalized: docs/rules.md)", top("costs", route), route, n)
			}
			s.Costs[n] = int64(c)
		}
	}
	if f.Shedding.Kind != 0 {
		sh, err := parseShedding(name, &f.Shedding)
		if err != nil {
			return nil, err
		}
		s.Shedding = sh
	}
	return s, nil
}

func (ry *ruleYAML) rule(custom map[string]bool) (*Rule, error) {
	r := &Rule{ID: ry.ID, Description: ry.Description, Burst: int64(ry.Burst), Global: bool(ry.Global), Pinned: bool(ry.Pinned), GCounter: bool(ry.GCounter),
		ExactKeys: bool(ry.ExactKeys), Replaces: ry.Replaces}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w %q: %s", ErrInvalidRule, ry.ID, fmt.Sprintf(format, a...))
	}
	badField := func(field, format string, a ...any) error {
		return &fieldError{field: field, err: bad(format, a...)}
	}
	if ry.Limit == nil {
		// A missing limit would read as 0, which blocks every request.
		return nil, bad("limit is missing: give the requests per period, e.g. limit: 100, or limit: 0 to block")
	}
	r.Limit = int64(*ry.Limit)
	for _, my := range ry.Match {
		m, err := my.match(custom)
		if err != nil {
			return nil, badField("match", "%v", err)
		}
		r.Match = append(r.Match, m)
	}
	alg, err := ParseAlgorithm(ry.Algorithm)
	if err != nil {
		return nil, badField("algorithm", "%v", err)
	}
	r.Algorithm = alg
	duration := func(field, v string) (time.Duration, error) {
		d, err := time.ParseDuration(v)
		if err != nil {
			return 0, badField(field, "%s %q: %v (write a Go duration such as 7s, 15m, 1h)", field, v, err)
		}
		return d, nil
	}
	switch {
	case alg == Concurrency:
		if ry.Calendar != "" {
			return nil, badField("calendar", "calendar windows need algorithm fixed_window")
		}
		if ry.Period != "" {
			return nil, badField("period", "a concurrency rule has no period: its limit is requests in flight; set lease (the longest a request holds its slot), e.g. lease: 30s")
		}
		r.Period = DefaultLease
		if ry.Lease != "" {
			if r.Period, err = duration("lease", ry.Lease); err != nil {
				return nil, err
			}
		}
	case ry.Lease != "":
		return nil, badField("lease", "lease applies only to algorithm: concurrency")
	case ry.Calendar != "":
		for i, n := range calendarNames {
			if i > 0 && n == ry.Calendar {
				r.Calendar = Calendar(i)
			}
		}
		if r.Calendar == NoCalendar {
			return nil, badField("calendar", "calendar %q: want day, week or month", ry.Calendar)
		}
		if ry.Period != "" {
			return nil, badField("period", "a calendar window has no period: remove period, or calendar")
		}
	case ry.Period == "":
		return nil, bad("period is missing, e.g. period: 1m")
	default:
		if r.Period, err = duration("period", ry.Period); err != nil {
			return nil, err
		}
	}
	if ry.Timezone != "" {
		if r.Calendar == NoCalendar {
			return nil, badField("timezone", "timezone applies only to calendar windows (calendar: day, week or month)")
		}
		if ry.Timezone == "Local" {
			return nil, badField("timezone", "timezone Local depends on the host: name the zone, e.g. Europe/Berlin, or UTC")
		}
		if r.Location, err = time.LoadLocation(ry.Timezone); err != nil {
			return nil, badField("timezone", "timezone %q: %v (write an IANA name such as Europe/Berlin or UTC)", ry.Timezone, err)
		}
	}
	if r.Scope, err = ParseScope(ry.Scope); err != nil {
		return nil, badField("scope", "%v", err)
	}
	if ry.Adaptive.Kind != 0 {
		if r.AdaptiveFloor, err = parseAdaptive(&ry.Adaptive); err != nil {
			return nil, badField("adaptive", "adaptive: %v", err)
		}
	}
	if r.Scope == ScopeLocal && ry.FailureMode != "" {
		return nil, badField("failure_mode", "a local rule never calls Redis, so it has no failure mode: remove failure_mode")
	}
	switch ry.Mode {
	case "", "enforce":
	case "shadow":
		r.Mode = Shadow
	default:
		return nil, badField("mode", "mode %q: want enforce or shadow", ry.Mode)
	}
	switch ry.FailureMode {
	case "", "open":
	case "closed":
		r.FailureMode = FailClosed
	case "open_unlimited":
		r.FailureMode = FailOpenUnlimited
	default:
		return nil, fmt.Errorf("%w %q: failure_mode %q: want open (a local bucket), open_unlimited or closed", ErrInvalidRule, ry.ID, ry.FailureMode)
	}
	return r, nil
}

func (my *matchYAML) match(custom map[string]bool) (Match, error) {
	var m Match
	k, ok := KeyFor(my.Key)
	switch {
	case my.Key == "":
		return m, fmt.Errorf("a match entry has no key, e.g. {key: client_ip}")
	case ok && k == KeyCustom && !custom[my.Key]:
		return m, fmt.Errorf("unknown descriptor key %q (want one of %v); for a key of your own, declare it at the top: custom_keys: [%s]", my.Key, keyNames, my.Key)
	case !ok:
		return m, fmt.Errorf("descriptor key %q: a key name is 1 to %d printable ASCII characters without spaces", my.Key, maxIDLen)
	}
	m.Key = k
	if k == KeyCustom {
		m.Name = my.Key
	}
	str := func(field string, p *string) (string, error) {
		if p == nil {
			return "", nil
		}
		if *p == "" {
			return "", fmt.Errorf("match %s has an empty %s: omit %s to keep a bucket per value of %s", my.Key, field, field, my.Key)
		}
		return *p, nil
	}
	var err error
	if m.Value, err = str("value", my.Value); err != nil {
		return m, err
	}
	if m.Prefix, err = str("prefix", my.Prefix); err != nil {
		return m, err
	}
	if m.Wildcard, err = str("wildcard", my.Wildcard); err != nil {
		return m, err
	}
	if m.Template, err = str("template", my.Template); err != nil {
		return m, err
	}
	m.Values, m.Not, m.NotPrefix, m.Shared, m.IgnoreCase = my.Values, my.Not, my.NotPrefix, bool(my.Shared), bool(my.IgnoreCase)
	if k == KeyClientIP {
		for _, lists := range [][]string{{m.Value}, m.Values, m.Not} {
			for _, v := range lists {
				if err := CheckClientIPValue(v); err != nil {
					return m, fmt.Errorf("match client_ip: %q: %v", v, err)
				}
			}
		}
	}
	if my.CIDR != nil {
		m.CIDR = []netip.Prefix{}
		for _, c := range my.CIDR {
			p, err := netip.ParsePrefix(c)
			if err != nil {
				a, aerr := netip.ParseAddr(c)
				if aerr != nil {
					return m, fmt.Errorf("match %s: cidr %q: not a network such as 10.0.0.0/8 or 2001:db8::/32", my.Key, c)
				}
				p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
			}
			if p.Addr().Is4In6() {
				p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
			}
			m.CIDR = append(m.CIDR, p)
		}
	}
	return m, nil
}

// secondDocument reports whether dec, past the first document, holds another
// one with content, and the line of its "---". Empty documents (a trailing
// "---", as many editors and generators leave) are not one: yaml.v2's
// Unmarshal, which envoyproxy/ratelimit uses, skips them too.
func secondDocument(dec *yaml.Decoder) (line int, ok bool) {
	for {
		var next yaml.Node
		err := dec.Decode(&next)
		switch {
		case errors.Is(err, io.EOF):
			return 0, false
		case err != nil:
			return next.Line, true
		case len(next.Content) == 1 && next.Content[0].Tag == "!!null" && next.Content[0].Value == "":
			continue
		}
		return next.Line, true
	}
}

// replacesCycle returns a circle of rules that replace one another (a
// replaces b ... replaces a), as the ids around it, or nil.
func replacesCycle(rs []*Rule) []string {
	byID := make(map[string]*Rule, len(rs))
	for _, r := range rs {
		byID[r.ID] = r
	}
	const (
		unseen = iota
		onPath
		done
	)
	state := map[string]int{}
	var path []string
	var visit func(id string) []string
	visit = func(id string) []string {
		switch state[id] {
		case onPath:
			i := slices.Index(path, id)
			return append(slices.Clone(path[i:]), id)
		case done:
			return nil
		}
		state[id] = onPath
		path = append(path, id)
		if r := byID[id]; r != nil {
			for _, next := range r.Replaces {
				if c := visit(next); c != nil {
					return c
				}
			}
		}
		path = path[:len(path)-1]
		state[id] = done
		return nil
	}
	for _, r := range rs {
		if c := visit(r.ID); c != nil {
			return c
		}
	}
	return nil
}

// topField returns the node of a top-level field's value, or, with item,
// of the item (a sequence element or mapping key) with that text; nil if
// absent.
func topField(root *yaml.Node, field, item string) *yaml.Node {
	if root.Kind != yaml.DocumentNode || len(root.Content) == 0 {
		return nil
	}
	v := mappingValue(root.Content[0], field)
	if v == nil || item == "" {
		return v
	}
	for _, c := range v.Content {
		if c.Value == item {
			return c
		}
	}
	return v
}

// yamlLine matches the decoder's positions: "line 7: ...", "line 5 column
// 12: ..." (ours, from wholeNumber and strictBool) and "yaml: line 3: ...".
var yamlLine = regexp.MustCompile(`^(?:yaml: )?line (\d+)(?: column (\d+))?: (.*)$`)

// positioned rewrites a decoding error as one "file:line:column: message"
// line per problem, in the file's own terms (see yamlHint). Where the
// decoder gives no column, it is that of the field it names, or of the
// line's first character.
func positioned(name string, data []byte, err error) error {
	var msgs []string
	var te *yaml.TypeError
	if errors.As(err, &te) {
		msgs = te.Errors
	} else {
		msgs = []string{err.Error()}
	}
	lines := strings.Split(string(data), "\n")
	out := make([]string, 0, len(msgs))
	for _, m := range msgs {
		g := yamlLine.FindStringSubmatch(m)
		if g == nil {
			out = append(out, fmt.Sprintf("%s:1:1: %s", name, yamlHint(m)))
			continue
		}
		line, _ := strconv.Atoi(g[1])
		col, _ := strconv.Atoi(g[2])
		if te == nil && col == 0 {
			line = syntaxLine(lines, line)
		}
		if col == 0 && line >= 1 && line <= len(lines) {
			text := lines[line-1]
			col = len(text) - len(strings.TrimLeft(text, " ")) + 1
			if f := fieldNotFound.FindStringSubmatch(g[3]); f != nil {
				if i := strings.Index(text, f[1]+":"); i >= 0 {
					col = i + 1
				}
			}
		}
		out = append(out, fmt.Sprintf("%s:%d:%d: %s", name, line, max(col, 1), yamlHint(g[3])))
	}
	return errors.New(strings.Join(out, "\n"))
}

// syntaxLine returns the line of a YAML syntax error that the parser
// places at line from: the start of the construct it was reading (the list
// item, or the mapping above it), not the line that breaks it. That is the
// first line from on whose text, with the lines before it, is no longer
// YAML; from itself if none is within maxSyntaxSearch lines (each try
// parses the text up to the line again).
func syntaxLine(lines []string, from int) int {
	if from < 1 {
		return from
	}
	for k := from; k <= len(lines) && k < from+maxSyntaxSearch; k++ {
		var v any
		if yaml.Unmarshal([]byte(strings.Join(lines[:k], "\n")), &v) != nil {
			return k
		}
	}
	return from
}

// maxSyntaxSearch bounds syntaxLine's search.
const maxSyntaxSearch = 200

var fieldNotFound = regexp.MustCompile(`^field (\S+) not found`)

// mappingValue returns the value node of key in the mapping m, or nil.
func mappingValue(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// rulePositions returns the position of each item of the top-level "rules"
// sequence.
func rulePositions(root *yaml.Node) []*yaml.Node {
	if root.Kind != yaml.DocumentNode || len(root.Content) == 0 {
		return nil
	}
	if v := mappingValue(root.Content[0], "rules"); v != nil && v.Kind == yaml.SequenceNode {
		return v.Content
	}
	return nil
}

// knownFields lists the yaml names of struct type t's fields, in order.
func knownFields(t reflect.Type) string {
	names := make([]string, 0, t.NumField())
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name != "" && name != "-" {
			names = append(names, name)
		}
	}
	return strings.Join(names, ", ")
}

// yamlHint rewrites the YAML decoder's messages in the file's own terms and
// names the fields that are allowed (read off the types' yaml tags, so the
// lists cannot fall behind them).
func yamlHint(msg string) string {
	return strings.NewReplacer(
		"in type rules.fileYAML", "at the top level (known: "+knownFields(reflect.TypeFor[fileYAML]())+")",
		"in type rules.ruleYAML", "in a rule (known: "+knownFields(reflect.TypeFor[ruleYAML]())+")",
		"in type rules.matchYAML", "in a match entry (known: "+knownFields(reflect.TypeFor[matchYAML]())+")",
		"into int64", "into a whole number",
		"into []rules.ruleYAML", "into a list of rules",
		"into []rules.matchYAML", "into a list of {key, value}",
		"into rules.fileYAML", "into a rule file (a mapping with domain and rules)",
		"into rules.ruleYAML", "into a rule (a mapping)",
		"into rules.matchYAML", "into a match entry (a mapping with key and value)",
		"found character that cannot start any token", "found character that cannot start any token (a tab? YAML indents with spaces)",
	).Replace(msg)
}
