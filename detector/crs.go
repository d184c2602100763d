package detector

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/corazawaf/libinjection-go"
	"rsc.io/binaryregexp"
)

// A native evaluator of the OWASP Core Rule Set's request rules over what a
// decision record carries (a method, a target and a user agent). It reads
// the CRS's own rule files (SecLang: the corpus stays the source of truth,
// updated by bumping its module) and evaluates their operators (@rx, @pm,
// @pmFromFile and its .data files, libinjection's @detectSQLi and
// @detectXSS, @validateByteRange) and transformations (crstransform.go) as
// the Coraza engine does, with what makes it one to two orders of magnitude
// cheaper than a Coraza transaction: no transaction, collections, macros or
// actions; each value transformed once per distinct transformation prefix;
// one automaton pass per distinct transformed value that decides every
// @pm rule and skips every @rx rule none of whose literals is in it
// (crsmatch.go); and a stop at the first exploit, which decides the
// verdict. TestCRSNativeAgreesWithCoraza holds it to Coraza's verdicts on
// the CRS's own regression tests, the shared real logs and CrowdSec's
// snippets; FuzzCRSNativeAgreesWithCoraza on anything else.

// errCRSUnsupported is wrapped when a rule the evaluator must run uses a
// variable, operator, transformation or action it does not implement (a
// new CRS version may): the rules do not load, so that no rule is silently
// dropped.
var errCRSUnsupported = errors.New("detector: a CRS rule uses what the native evaluator does not implement")

// crsVarKind is a SecLang variable (a collection) of a request.
type crsVarKind uint8

const (
	cvEmpty     crsVarKind = iota // a collection a decision record cannot fill: cookies, bodies, files, XML
	cvArgs                        // ARGS, ARGS_GET: the query's values
	cvArgsNames                   // ARGS_NAMES, ARGS_GET_NAMES
	cvQueryString
	cvFilename // REQUEST_FILENAME: the path, decoded
	cvBasename
	cvURI    // REQUEST_URI: the target, re-encoded
	cvURIRaw // REQUEST_URI_RAW: as sent
	cvLine   // REQUEST_LINE
	cvHeaders
	cvHeaderNames
	cvMethod
	cvProtocol
	cvMatchedVars // MATCHED_VARS: a chained rule's parent's matches
)

var crsVarKinds = map[string]crsVarKind{
	"ARGS": cvArgs, "ARGS_GET": cvArgs, "ARGS_NAMES": cvArgsNames, "ARGS_GET_NAMES": cvArgsNames,
	"QUERY_STRING": cvQueryString, "REQUEST_FILENAME": cvFilename, "REQUEST_BASENAME": cvBasename,
	"REQUEST_URI": cvURI, "REQUEST_URI_RAW": cvURIRaw, "REQUEST_LINE": cvLine,
	"REQUEST_HEADERS": cvHeaders, "REQUEST_HEADERS_NAMES": cvHeaderNames,
	"REQUEST_METHOD": cvMethod, "REQUEST_PROTOCOL": cvProtocol, "MATCHED_VARS": cvMatchedVars,
	"REQUEST_COOKIES": cvEmpty, "REQUEST_COOKIES_NAMES": cvEmpty, "XML": cvEmpty, "FILES": cvEmpty,
	"FILES_NAMES": cvEmpty, "REQUEST_BODY": cvEmpty, "ARGS_POST": cvEmpty, "ARGS_POST_NAMES": cvEmpty,
}

// crsVar is one target of a rule: a collection, and a key (a header's
// name, lower case) or "" for all of it.
type crsVar struct {
	kind crsVarKind
	key  string
}

type crsOpKind uint8

const (
	opRx crsOpKind = iota
	opPm
	opSQLi
	opXSS
	opByteRange
)

// crsRule is one compiled SecRule (or a link of a chain).
type crsRule struct {
	id      uint32
	phase   int
	vars    []crsVar
	exclude map[crsVarKind][]string // excluded keys, lower case
	node    int                     // its transformation chain in the trie
	multi   bool                    // multiMatch: test every changed step
	op      crsOpKind
	neg     bool
	re      *regexp.Regexp
	bre     *binaryregexp.Regexp
	bytes   [256]bool // @validateByteRange's valid bytes
	bit     int       // its bit in the prefilter's masks; -1 for none
	decided bool      // the prefilter's bit is the verdict (@pm)
	xssPerf bool      // tag xss-perf-disable
	ctlXSS  bool      // ctl:ruleRemoveTargetByTag=xss-perf-disable;REQUEST_FILENAME
	chain   *crsRule
}

// crsEngine is the compiled rules. Safe for concurrent use.
type crsEngine struct {
	rules   []*crsRule // phase 1, then phase 2, each in file order
	nodes   []crsNode  // the transformation trie; 0 is the value as is
	phrases *phraseMatcher
	paths   [][]int // node -> the nodes from 0 to it
	nbits   int
	// undecided holds the bits of the @rx rules' literals, a necessary
	// condition only: set for a value the prefilter cannot vouch for.
	undecided ruleMask
	scan      int       // index of the last scanner rule (913)
	exploit   int       // index of the first exploit rule
	scratch   sync.Pool // *crsScratch
}

// crsNode is a transformation applied to its parent's value.
type crsNode struct {
	parent int
	name   string
	t      crsTransform
}

// crsFiles are the CRS files the evaluator runs: the request rules that
// read a request line and its user agent (see crsDirectives for the why
// of each left out).
var crsFiles = []string{
	"REQUEST-913-SCANNER-DETECTION.conf",
	"REQUEST-921-PROTOCOL-ATTACK.conf",
	"REQUEST-930-APPLICATION-ATTACK-LFI.conf",
	"REQUEST-931-APPLICATION-ATTACK-RFI.conf",
	"REQUEST-932-APPLICATION-ATTACK-RCE.conf",
	"REQUEST-933-APPLICATION-ATTACK-PHP.conf",
	"REQUEST-934-APPLICATION-ATTACK-GENERIC.conf",
	"REQUEST-941-APPLICATION-ATTACK-XSS.conf",
	"REQUEST-942-APPLICATION-ATTACK-SQLI.conf",
	"REQUEST-944-APPLICATION-ATTACK-JAVA.conf",
}

// crsLoader collects what the rules give the automaton.
type crsLoader struct {
	e       *crsEngine
	fsys    fs.FS
	dir     string
	phrases []string
	bits    []int
}

// newCRSEngine compiles the paranoia-level-1 rules of crsFiles from fsys
// (the coraza-coreruleset layout: @owasp_crs/...). A rule that uses what
// the evaluator lacks is an error wrapping errCRSUnsupported.
func newCRSEngine(fsys fs.FS) (*crsEngine, error) {
	e := &crsEngine{nodes: []crsNode{{parent: -1}}}
	ld := &crsLoader{e: e, fsys: fsys, dir: "@owasp_crs"}
	var byPhase [3][]*crsRule
	for _, name := range crsFiles {
		lines, err := seclangLines(fsys, path.Join(ld.dir, name))
		if err != nil {
			return nil, err
		}
		var head, last *crsRule
	file:
		for _, l := range lines {
			dir, rest, _ := strings.Cut(l.text, " ")
			switch dir {
			case "SecMarker", "SecComponentSignature":
				continue
			case "SecRule":
			default:
				return nil, fmt.Errorf("%w: %s:%d: directive %s", errCRSUnsupported, name, l.line, dir)
			}
			vars, op, acts, err := splitSecRule(rest)
			if err != nil {
				return nil, fmt.Errorf("detector: %s:%d: %w", name, l.line, err)
			}
			if strings.EqualFold(vars, "TX:DETECTION_PARANOIA_LEVEL") {
				if op == "@lt 1" {
					continue
				}
				break file // paranoia level 2 and above: not run
			}
			r, err := ld.compile(vars, op, acts, head != nil)
			if err != nil {
				return nil, fmt.Errorf("detector: %s:%d: %w", name, l.line, err)
			}
			if head != nil {
				last.chain, last = r, r
			} else {
				head, last = r, r
				if r.phase < 1 || r.phase > 2 {
					return nil, fmt.Errorf("%w: %s:%d: rule %d in phase %d", errCRSUnsupported, name, l.line, r.id, r.phase)
				}
				byPhase[r.phase] = append(byPhase[r.phase], r)
			}
			if !hasAction(acts, "chain") {
				head, last = nil, nil
			}
		}
	}
	e.rules = append(byPhase[1], byPhase[2]...)
	if e.nbits > crsMaskWords*64 {
		return nil, fmt.Errorf("%w: %d rules with phrases, over %d", errCRSUnsupported, e.nbits, crsMaskWords*64)
	}
	e.phrases = newPhraseMatcher(ld.phrases, ld.bits)
	for n := range e.nodes {
		var p []int
		for x := n; x >= 0; x = e.nodes[x].parent {
			p = append(p, x)
		}
		slices.Reverse(p)
		e.paths = append(e.paths, p)
	}
	e.scan, e.exploit = -1, len(e.rules)
	for i, r := range e.rules {
		if r.id/1000 == 913 {
			e.scan = i
		}
		if crsClass(r.id) == SigExploit {
			e.exploit = min(e.exploit, i)
		}
	}
	e.scratch.New = func() any { return &crsScratch{} }
	return e, nil
}

type seclangLine struct {
	text string
	line int
}

// seclangLines reads a SecLang file's directives as Coraza's parser does:
// trimmed lines, '#' comments and blank lines skipped, a trailing '\'
// joining the next line.
func seclangLines(fsys fs.FS, name string) ([]seclangLine, error) {
	b, err := fs.ReadFile(fsys, name)
	if err != nil {
		return nil, fmt.Errorf("detector: reading the CRS: %w", err)
	}
	var out []seclangLine
	var buf strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	n, start := 0, 0
	for sc.Scan() {
		n++
		l := strings.TrimSpace(sc.Text())
		if l == "" || l[0] == '#' {
			continue
		}
		if buf.Len() == 0 {
			start = n
		}
		if strings.HasSuffix(l, `\`) {
			buf.WriteString(strings.TrimSuffix(l, `\`))
			continue
		}
		buf.WriteString(l)
		out = append(out, seclangLine{buf.String(), start})
		buf.Reset()
	}
	return out, sc.Err()
}

// splitSecRule cuts a SecRule's arguments into its variables, its operator
// (quotes removed, \" unescaped) and its actions.
func splitSecRule(s string) (vars, op, acts string, err error) {
	s = strings.TrimSpace(s)
	vars, rest, ok := strings.Cut(s, " ")
	rest = strings.TrimLeft(rest, " ")
	if !ok || rest == "" || rest[0] != '"' {
		return "", "", "", fmt.Errorf("a SecRule without a quoted operator: %q", s)
	}
	esc, end := 0, -1
	for i := 1; i < len(rest) && end < 0; i++ {
		switch {
		case rest[i] == '\\':
			esc++
		case rest[i] == '"' && esc%2 == 0:
			end = i
		default:
			esc = 0
		}
	}
	if end < 0 {
		return "", "", "", fmt.Errorf("an unterminated operator: %q", s)
	}
	op = strings.ReplaceAll(rest[1:end], `\"`, `"`)
	acts = strings.TrimSpace(rest[end+1:])
	if len(acts) >= 2 && acts[0] == '"' && acts[len(acts)-1] == '"' {
		acts = acts[1 : len(acts)-1]
	}
	return vars, op, acts, nil
}

// splitActions cuts a rule's actions at commas outside single quotes into
// names and values (quotes removed).
func splitActions(acts string) [][2]string {
	var out [][2]string
	quoted, start := false, 0
	add := func(a string) {
		k, v, _ := strings.Cut(strings.TrimSpace(a), ":")
		if v = strings.TrimSpace(v); len(v) >= 2 && v[0] == '\'' && v[len(v)-1] == '\'' {
			v = v[1 : len(v)-1]
		}
		if k != "" {
			out = append(out, [2]string{strings.TrimSpace(k), v})
		}
	}
	for i := 0; i < len(acts); i++ {
		switch {
		case i > 0 && acts[i-1] == '\\':
		case acts[i] == '\'':
			quoted = !quoted
		case acts[i] == ',' && !quoted:
			add(acts[start:i])
			start = i + 1
		}
	}
	add(acts[start:])
	return out
}

func hasAction(acts, name string) bool {
	for _, a := range splitActions(acts) {
		if a[0] == name {
			return true
		}
	}
	return false
}

// compile builds a rule: its variables, transformation chain, operator and
// the actions that change what is evaluated.
func (ld *crsLoader) compile(vars, op, acts string, chained bool) (*crsRule, error) {
	r := &crsRule{phase: 2, bit: -1, exclude: map[crsVarKind][]string{}}
	var chain []string
	for _, a := range splitActions(acts) {
		switch k, v := a[0], a[1]; k {
		case "id":
			id, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("a bad rule id %q", v)
			}
			r.id = uint32(id)
		case "phase":
			switch v {
			case "request":
				r.phase = 2
			default:
				r.phase, _ = strconv.Atoi(v)
			}
		case "t":
			if v == "none" {
				chain = chain[:0]
				continue
			}
			if crsTransforms[v] == nil {
				return nil, fmt.Errorf("%w: transformation %s", errCRSUnsupported, v)
			}
			chain = append(chain, v)
		case "multiMatch":
			r.multi = true
		case "tag":
			r.xssPerf = r.xssPerf || v == "xss-perf-disable"
		case "ctl":
			if v != "ruleRemoveTargetByTag=xss-perf-disable;REQUEST_FILENAME" {
				return nil, fmt.Errorf("%w: ctl:%s", errCRSUnsupported, v)
			}
			r.ctlXSS = true
		case "skipAfter", "skip", "allow", "deny", "drop", "redirect", "exec":
			return nil, fmt.Errorf("%w: action %s", errCRSUnsupported, k)
		}
	}
	r.node = ld.e.chainNode(chain)
	for _, v := range strings.Split(vars, "|") {
		neg := strings.HasPrefix(v, "!")
		v = strings.TrimPrefix(v, "!")
		if strings.HasPrefix(v, "&") {
			return nil, fmt.Errorf("%w: a count (%s)", errCRSUnsupported, v)
		}
		name, key, _ := strings.Cut(v, ":")
		kind, ok := crsVarKinds[name]
		switch {
		case !ok:
			return nil, fmt.Errorf("%w: variable %s", errCRSUnsupported, name)
		case kind == cvEmpty:
			continue
		case strings.HasPrefix(key, "/"):
			return nil, fmt.Errorf("%w: a key pattern on %s", errCRSUnsupported, name)
		case neg:
			r.exclude[kind] = append(r.exclude[kind], strings.ToLower(key))
		case kind == cvMatchedVars && !chained:
			return nil, fmt.Errorf("%w: MATCHED_VARS outside a chain", errCRSUnsupported)
		default:
			r.vars = append(r.vars, crsVar{kind, strings.ToLower(key)})
		}
	}
	if len(r.vars) == 0 {
		// Only collections a record cannot fill: the rule never
		// matches, and its operator is not compiled.
		return r, nil
	}
	if err := ld.operator(r, op); err != nil {
		return nil, fmt.Errorf("rule %d: %w", r.id, err)
	}
	return r, nil
}

// chainNode returns the trie node of a transformation chain, adding it.
func (e *crsEngine) chainNode(chain []string) int {
	n := 0
next:
	for _, name := range chain {
		for i, x := range e.nodes {
			if x.parent == n && x.name == name {
				n = i
				continue next
			}
		}
		e.nodes = append(e.nodes, crsNode{parent: n, name: name, t: crsTransforms[name]})
		n = len(e.nodes) - 1
	}
	return n
}

// operator compiles a rule's operator as Coraza does: a bare expression is
// @rx; @rx in multi-line, dot-all mode, over bytes when the expression
// names a byte that is not UTF-8.
func (ld *crsLoader) operator(r *crsRule, op string) error {
	switch {
	case op == "" || op[0] != '@' && op[0] != '!':
		op = "@rx " + op
	case op == "!":
		op = "!@rx"
	case len(op) > 1 && op[0] == '!' && op[1] != '@':
		op = "!@rx " + op[1:]
	}
	name, arg, _ := strings.Cut(op, " ")
	name, arg = strings.TrimSpace(name), strings.TrimSpace(arg)
	if strings.HasPrefix(name, "!") {
		r.neg = true
		name = name[1:]
	}
	switch name {
	case "@rx":
		expr := "(?sm)" + arg
		var err error
		if crsArbitraryBytes(expr) {
			r.bre, err = binaryregexp.Compile(expr)
		} else {
			r.re, err = regexp.Compile(expr)
		}
		if err != nil {
			return err
		}
		if lits := rxLiterals(expr); lits != nil && !r.neg {
			ld.phrase(r, lits, false)
		}
	case "@pm":
		return ld.pm(r, strings.Split(strings.ToLower(arg), " "))
	case "@pmFromFile", "@pmf":
		b, err := fs.ReadFile(ld.fsys, path.Join(ld.dir, arg))
		if err != nil {
			return fmt.Errorf("reading %s: %w", arg, err)
		}
		var list []string
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if l := strings.TrimSpace(sc.Text()); l != "" && l[0] != '#' {
				list = append(list, strings.ToLower(l))
			}
		}
		return ld.pm(r, list)
	case "@detectSQLi":
		r.op = opSQLi
	case "@detectXSS":
		r.op = opXSS
	case "@validateByteRange":
		r.op = opByteRange
		if arg == "" {
			return fmt.Errorf("%w: @validateByteRange without ranges", errCRSUnsupported)
		}
		for _, br := range strings.Split(arg, ",") {
			lo, hi, ok := strings.Cut(strings.TrimSpace(br), "-")
			if !ok {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 != nil || err2 != nil || a < 0 || b > 255 || a > b {
				return fmt.Errorf("a bad byte range %q", br)
			}
			for c := a; c <= b; c++ {
				r.bytes[c] = true
			}
		}
	default:
		return fmt.Errorf("%w: operator %s", errCRSUnsupported, name)
	}
	return nil
}

// pm makes r a @pm rule, decided by the automaton on its phrases (ASCII
// case-insensitive substrings, as Coraza's Aho-Corasick finds them).
func (ld *crsLoader) pm(r *crsRule, list []string) error {
	r.op = opPm
	if r.neg || slices.Contains(list, "") {
		return fmt.Errorf("%w: a negated @pm or an empty phrase", errCRSUnsupported)
	}
	ld.phrase(r, list, true)
	return nil
}

// phrase gives r a bit in the automaton's masks, set by any of list.
func (ld *crsLoader) phrase(r *crsRule, list []string, decided bool) {
	r.bit, r.decided = ld.e.nbits, decided
	if !decided && r.bit < crsMaskWords*64 {
		ld.e.undecided.set(r.bit)
	}
	ld.e.nbits++
	for _, p := range list {
		ld.phrases = append(ld.phrases, p)
		ld.bits = append(ld.bits, r.bit)
	}
}

// crsArbitraryBytes reports whether an expression names a byte (\xHH,
// \x{HH}) that is not valid UTF-8, as Coraza's matchesArbitraryBytes does.
func crsArbitraryBytes(expr string) bool {
	dec := make([]byte, 0, len(expr))
	for i := 0; i < len(expr); i++ {
		c := expr[i]
		if c != '\\' {
			dec = append(dec, c)
			continue
		}
		if i+3 >= len(expr) {
			dec = append(dec, expr[i:]...)
			break
		}
		if expr[i+1] != 'x' {
			dec = append(dec, c)
			continue
		}
		sub, adv := expr[i:], 3
		if len(sub) >= 6 && sub[2] == '{' {
			if end := strings.IndexByte(sub, '}'); end != -1 {
				sub, adv = `\x`+sub[3:end], end
			}
		}
		v, mb, _, err := strconv.UnquoteChar(sub, 0)
		if err != nil || mb {
			dec = append(dec, c)
			continue
		}
		dec = append(dec, byte(v))
		i += adv
	}
	return !utf8.Valid(dec)
}

// crsArgumentLimit is Coraza's default SecArgumentsLimit: the query
// arguments past it are not parsed.
const crsArgumentLimit = 1000

// crsScratch is one evaluation's state: the request's values (slots) and,
// per slot and transformation node, the transformed value and its
// automaton mask, computed when first needed. Pooled.
type crsScratch struct {
	gen      uint32
	nodes    int
	fixedEnd int      // slots past it are matched values
	vals     []string // slot -> value as is
	memo     []crsMemo
	fixed    [8]int // method, protocol, raw URI, line, URI, filename, basename, query
	hdrs     []crsHeader
	names    []int // slots of argument names
	args     []int // slots of argument values
	hnames   []int // slots of header names
	match    []int // slots of the current rule's matched values (MATCHED_VARS)
	slots    []int // scratch list
}

type crsHeader struct {
	lname string
	slot  int
}

type crsMemo struct {
	gen, maskGen uint32
	changed      bool
	v            string
	mask         ruleMask
}

func (sc *crsScratch) addSlot(v string) int {
	sc.vals = append(sc.vals, v)
	need := len(sc.vals) * sc.nodes
	if need > len(sc.memo) {
		sc.memo = append(sc.memo, make([]crsMemo, need-len(sc.memo))...)
	}
	slot := len(sc.vals) - 1
	if slot >= sc.fixedEnd {
		// A matched value takes the slot of another rule's: its memo
		// is stale within this generation.
		clear(sc.memo[slot*sc.nodes : need])
	}
	return slot
}

// reset fills the slots with a request's variables as Coraza's
// ProcessURI and AddRequestHeader set them.
func (sc *crsScratch) reset(nodes int, method, target, ua string) {
	sc.gen++
	if sc.gen == 0 {
		clear(sc.memo)
		sc.gen = 1
	}
	sc.nodes, sc.fixedEnd = nodes, 1<<30
	sc.vals, sc.hdrs, sc.names, sc.args, sc.hnames, sc.match = sc.vals[:0], sc.hdrs[:0], sc.names[:0], sc.args[:0], sc.hnames[:0], sc.match[:0]
	uri, path, query := target, "", ""
	if i := strings.IndexByte(uri, '#'); i >= 0 {
		uri = uri[:i]
	}
	if u, err := url.ParseRequestURI(uri); err != nil {
		path, query, _ = strings.Cut(uri, "?")
	} else {
		uri, path, query = u.String(), u.Path, u.RawQuery
	}
	base := path
	if i := strings.LastIndexAny(path, `/\`); i != -1 && len(path) > i+1 {
		base = path[i+1:]
	}
	for i, v := range [...]string{method, "HTTP/1.1", target, method + " " + target + " HTTP/1.1", uri, path, base, query} {
		sc.fixed[i] = sc.addSlot(v)
	}
	for n := 0; query != "" && n < crsArgumentLimit; {
		kv := query
		if i := strings.IndexByte(kv, '&'); i >= 0 {
			kv, query = kv[:i], kv[i+1:]
		} else {
			query = ""
		}
		if kv == "" {
			continue
		}
		k, v, _ := strings.Cut(kv, "=")
		sc.names = append(sc.names, sc.addSlot(crsQueryUnescape(k)))
		sc.args = append(sc.args, sc.addSlot(crsQueryUnescape(v)))
		n++
	}
	for _, h := range [...][2]string{{"Host", "localhost"}, {"Accept", "*/*"}, {"User-Agent", ua}} {
		if h[1] == "" && h[0] == "User-Agent" {
			continue
		}
		sc.hdrs = append(sc.hdrs, crsHeader{strings.ToLower(h[0]), sc.addSlot(h[1])})
		sc.hnames = append(sc.hnames, sc.addSlot(h[0]))
	}
	sc.fixedEnd = len(sc.vals)
}

// crsQueryUnescape decodes a query's key or value as Coraza's does: '+' a
// space, %XX a byte, a bad or cut escape kept.
func crsQueryUnescape(s string) string {
	if strings.IndexAny(s, "+%") < 0 {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '+':
			b = append(b, ' ')
		case c == '%' && i+2 < len(s) && validHex(s[i+1]) && validHex(s[i+2]):
			b = append(b, x2c(s[i+1:]))
			i += 2
		default:
			b = append(b, c)
		}
	}
	return string(b)
}

// value is slot's value through node's transformations, and whether the
// last of them changed it.
func (e *crsEngine) value(sc *crsScratch, slot, node int) (string, bool) {
	if node == 0 {
		return sc.vals[slot], false
	}
	m := &sc.memo[slot*sc.nodes+node]
	if m.gen != sc.gen {
		in, _ := e.value(sc, slot, e.nodes[node].parent)
		m = &sc.memo[slot*sc.nodes+node] // the recursion may grow memo
		m.v, m.changed = e.nodes[node].t(in)
		m.gen = sc.gen
	}
	return m.v, m.changed
}

// mask is the automaton's verdict on slot's value through node.
func (e *crsEngine) mask(sc *crsScratch, slot, node int) *ruleMask {
	for node != 0 {
		if _, changed := e.value(sc, slot, node); changed {
			break
		}
		node = e.nodes[node].parent // the same string as its parent's
	}
	m := &sc.memo[slot*sc.nodes+node]
	if m.maskGen != sc.gen {
		v, _ := e.value(sc, slot, node)
		m.mask = ruleMask{}
		e.phrases.scan(v, m.mask[:])
		if foldsBeyondASCII(v) {
			// A (?i) expression matches U+017F as s and U+212A as k,
			// which the automaton does not: every @rx rule runs. @pm
			// folds ASCII only, as Coraza's does, so the scan still
			// decides those (U+017F matches no phrase's s).
			m.mask.or(&e.undecided)
		}
		m.maskGen = sc.gen
	}
	return &m.mask
}

// test runs r's operator on slot's value through node.
func (e *crsEngine) test(sc *crsScratch, r *crsRule, slot, node int) bool {
	if r.bit >= 0 {
		if !e.mask(sc, slot, node).has(r.bit) {
			return false
		}
		if r.decided {
			return true
		}
	}
	v, _ := e.value(sc, slot, node)
	var ok bool
	switch r.op {
	case opRx:
		if r.bre != nil {
			ok = r.bre.MatchString(v)
		} else {
			ok = r.re.MatchString(v)
		}
	case opSQLi:
		ok, _ = libinjection.IsSQLi(v)
	case opXSS:
		ok = libinjection.IsXSS(v)
	case opByteRange:
		for i := 0; i < len(v) && !ok; i++ {
			ok = !r.bytes[v[i]]
		}
	}
	return ok != r.neg
}

// targets appends the slots of r's variable x to sc.slots.
func (sc *crsScratch) targets(r *crsRule, x crsVar, noFilename bool) []int {
	out := sc.slots[:0]
	excluded := func(key string) bool { return slices.Contains(r.exclude[x.kind], key) }
	switch x.kind {
	case cvArgs:
		out = append(out, sc.args...)
	case cvArgsNames:
		out = append(out, sc.names...)
	case cvMethod:
		out = append(out, sc.fixed[0])
	case cvProtocol:
		out = append(out, sc.fixed[1])
	case cvURIRaw:
		out = append(out, sc.fixed[2])
	case cvLine:
		out = append(out, sc.fixed[3])
	case cvURI:
		out = append(out, sc.fixed[4])
	case cvFilename:
		if !noFilename {
			out = append(out, sc.fixed[5])
		}
	case cvBasename:
		out = append(out, sc.fixed[6])
	case cvQueryString:
		out = append(out, sc.fixed[7])
	case cvHeaders:
		for _, h := range sc.hdrs {
			if (x.key == "" || x.key == h.lname) && !excluded(h.lname) {
				out = append(out, h.slot)
			}
		}
	case cvHeaderNames:
		out = append(out, sc.hnames...)
	case cvMatchedVars:
		out = append(out, sc.match...)
	}
	sc.slots = out
	return out
}

// match reports whether r (with its chain) matches, adding its matched
// values to sc.match for the links that read MATCHED_VARS.
func (e *crsEngine) match(sc *crsScratch, r *crsRule, noFilename bool) bool {
	all := r.chain != nil // a chain reads every match, not the first
	found := false
	var matched []int
	for _, x := range r.vars {
		for _, slot := range sc.targets(r, x, noFilename && r.xssPerf) {
			if !r.multi {
				if e.test(sc, r, slot, r.node) {
					found = true
					if !all {
						return true
					}
					v, _ := e.value(sc, slot, r.node)
					matched = append(matched, sc.addSlot(v))
				}
				continue
			}
			// multiMatch: the value as is and after every
			// transformation that changed it.
			for i, node := range e.paths[r.node] {
				if i > 0 {
					if _, changed := e.value(sc, slot, node); !changed {
						continue
					}
				}
				if e.test(sc, r, slot, node) {
					found = true
					if !all {
						return true
					}
					v, _ := e.value(sc, slot, node)
					matched = append(matched, sc.addSlot(v))
				}
			}
		}
	}
	if !found {
		return false
	}
	sc.match = append(sc.match, matched...)
	if r.chain == nil {
		return true
	}
	return e.match(sc, r.chain, noFilename)
}

// eval judges a request line and user agent: whether a scanner rule
// matched, and the highest class of the rules that did (crsClass), named
// by the first of that class in evaluation order. It stops at the first
// exploit once the scanner rules, which come first, have run.
func (e *crsEngine) eval(method, target, ua string) Verdict {
	sc := e.scratch.Get().(*crsScratch)
	defer e.scratch.Put(sc)
	sc.reset(len(e.nodes), method, target, ua)
	var v Verdict
	noFilename := false
	for i, r := range e.rules {
		sc.match = sc.match[:0]
		sc.vals = sc.vals[:sc.fixedEnd]
		if !e.match(sc, r, noFilename) {
			continue
		}
		noFilename = noFilename || r.ctlXSS
		if r.id/1000 == 913 && r.id%1000 >= 100 {
			v.Scanner = true
			continue
		}
		if c := crsClass(r.id); c > v.Class {
			v.Class, v.Rule = c, r.id
			if c == SigExploit && i > e.scan {
				break
			}
		}
	}
	return v
}
