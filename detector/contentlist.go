package detector

import (
	"bufio"
	"embed"

	"fmt"
	"io/fs"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/sluice-rl/sluice/rules"
)

// defaultContentLists are the pattern lists the content signal ships with,
// written for sluice (not copied from any other project's lists).
//
//go:embed contentlists/*.txt
var defaultContentLists embed.FS

// contentCategory is what a request for a path (or a user agent) is
// evidence of. The path categories are tried in this order and a request
// counts in the first that matches.
type contentCategory uint8

const (
	catTraversal  contentCategory = iota // path traversal, file inclusion
	catCVE                               // a known exploit's URI
	catSensitive                         // secrets, dumps, backups, web shells
	catAdmin                             // admin consoles
	catCMS                               // CMS paths, when answered 404 or 410
	catExploit                           // an exploit payload (Signatures: the CRS), one request enough
	catRestricted                        // the CRS's restricted files and extensions, refused; its noisy rules
	numHitCategories
	catAuth       = numHitCategories     // auth routes: 401 or 403 is a failed login
	catAuthPost   = numHitCategories + 1 // login forms: any POST is an attempt
	catScanner    = numHitCategories + 2 // scanner user agents
	numCategories = numHitCategories + 3
)

// contentFiles names each category's list file; contentWithQuery marks the
// categories matched against the path with its query.
var (
	contentFiles     = [numCategories]string{"traversal.txt", "cve.txt", "sensitive.txt", "admin.txt", "cms.txt", "", "", "auth.txt", "authpost.txt", "scanners.txt"}
	contentNames     = [numHitCategories]string{"traversal", "cve", "sensitive", "admin", "cms", "exploit", "restricted"}
	contentWithQuery = [numCategories]bool{catTraversal: true, catCVE: true}
)

// ContentLists are the content signal's compiled pattern lists, one per
// category. Build them with LoadContentLists; the zero value matches
// nothing. Safe for concurrent use once built.
type ContentLists struct {
	globs [numCategories][]contentGlob
	// phrases finds, in one pass over a subject, the globs whose
	// longest literal is in it (id: the glob's index in all, in
	// category order); first[c] is category c's first id. Built by
	// compile, after the lists are read.
	phrases *phraseMatcher
	first   [numCategories + 1]int
}

// contentGlob is a lower-cased pattern and its longest literal run (between
// '*'s), which every subject it matches contains: strings.Contains rejects
// most subjects before the glob is tried.
type contentGlob struct {
	pattern, literal string
}

func newContentGlob(p string) contentGlob {
	g := contentGlob{pattern: p}
	for _, lit := range strings.Split(p, "*") {
		if len(lit) > len(g.literal) {
			g.literal = lit
		}
	}
	return g
}

// maxContentPattern bounds a pattern's length in bytes.
const maxContentPattern = 512

// LoadContentLists reads the lists from dir: each category's file
// (traversal.txt, cve.txt, sensitive.txt, admin.txt, cms.txt, auth.txt,
// authpost.txt, scanners.txt) replaces sluice's default for that category
// when present; categories without a file keep the default. An empty dir
// gives the defaults. Another .txt file in dir is an error (a misspelt
// list would otherwise be ignored).
//
// A file holds one pattern a line; blank lines and lines starting with '#'
// are skipped, and so is a comment after " #" (an entry's source). A pattern is a glob over the lower-cased subject (a path,
// without its query except for traversal.txt and cve.txt, or a user agent
// for scanners.txt) where '*' matches any run of characters, also '/', and
// every other byte itself; it must match the whole subject, so write
// "*/.env" for a .env in any folder and "*nikto*" for a token in a user
// agent. A path pattern starts with '/' or '*'. Errors name the file and
// line and wrap ErrBadOptions.
func LoadContentLists(dir string) (*ContentLists, error) {
	var l ContentLists
	var fsys fs.FS = defaultContentLists
	for c := range numCategories {
		if contentFiles[c] == "" {
			continue // no list: the CRS's
		}
		b, err := fs.ReadFile(fsys, "contentlists/"+contentFiles[c])
		if err != nil {
			return nil, fmt.Errorf("detector: content default list %s: %w", contentFiles[c], err)
		}
		if err := l.parse(c, "(default) "+contentFiles[c], string(b)); err != nil {
			return nil, err
		}
	}
	if dir == "" {
		l.compile()
		return &l, nil
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: content lists: %v", ErrBadOptions, err)
	}
	for _, e := range ents {
		if !strings.HasSuffix(strings.ToLower(e.Name()), ".txt") {
			continue // a README, a licence: not a list
		}
		if e.IsDir() {
			return nil, fmt.Errorf("%w: content lists: %s is a directory, not a list file", ErrBadOptions, filepath.Join(dir, e.Name()))
		}
		c := slices.Index(contentFiles[:], e.Name())
		if c < 0 || e.Name() == "" {
			return nil, fmt.Errorf("%w: content lists: %s: not a list of the content signal (want one of %s)",
				ErrBadOptions, filepath.Join(dir, e.Name()), listFileNames())
		}
		path := filepath.Join(dir, e.Name())
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("%w: content lists: %v", ErrBadOptions, err)
		}
		l.globs[c] = nil
		if err := l.parse(contentCategory(c), path, string(b)); err != nil {
			return nil, err
		}
	}
	l.compile()
	return &l, nil
}

// listFileNames lists the list files, comma-separated.
func listFileNames() string {
	var ns []string
	for _, f := range contentFiles {
		if f != "" {
			ns = append(ns, f)
		}
	}
	return strings.Join(ns, ", ")
}

// parse adds the patterns of one list file, named file in errors.
func (l *ContentLists) parse(c contentCategory, file, text string) error {
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		p := sc.Text()
		if i := strings.Index(p, " #"); i >= 0 {
			p = p[:i] // a trailing comment: the entry's source
		}
		p = strings.TrimSpace(p)
		if p == "" || p[0] == '#' {
			continue
		}
		bad := func(why string) error {
			return fmt.Errorf("%w: content list %s:%d: %.80q: %s", ErrBadOptions, file, n, p, why)
		}
		switch {
		case !utf8.ValidString(p):
			return bad("not UTF-8")
		case len(p) > maxContentPattern:
			return bad(fmt.Sprintf("longer than %d bytes", maxContentPattern))
		case strings.Trim(p, "*") == "":
			return bad("matches everything: name what to match, e.g. */.env or *nikto*")
		case c != catScanner && p[0] != '/' && p[0] != '*':
			return bad("a path pattern starts with / or *, e.g. */" + strings.TrimLeft(p, "/"))
		case strings.IndexFunc(p, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0:
			return bad("a control character")
		}
		l.globs[c] = append(l.globs[c], newContentGlob(strings.ToLower(p)))
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%w: content list %s: %v", ErrBadOptions, file, err)
	}
	return nil
}

// compile builds the automaton over every glob's longest literal.
func (l *ContentLists) compile() {
	var phrases []string
	var ids []int
	for c := range numCategories {
		l.first[c] = len(ids)
		for _, g := range l.globs[c] {
			phrases = append(phrases, g.literal)
			ids = append(ids, len(ids))
		}
	}
	l.first[numCategories] = len(ids)
	l.phrases = newPhraseMatcher(phrases, ids)
}

// contentCandidates are the globs whose literal a subject holds.
type contentCandidates struct {
	small [8]uint64
	set   []uint64
}

// candidates scans a subject (any case) for the globs' literals.
func (l *ContentLists) candidates(s string, into *contentCandidates) {
	into.set = into.small[:0]
	if l.phrases.words <= len(into.small) {
		into.set = into.small[:l.phrases.words]
		clear(into.set)
	} else {
		into.set = make([]uint64, l.phrases.words)
	}
	l.phrases.scan(s, into.set)
}

// matchIn reports whether the lower-cased subject s, whose candidates are
// cand, matches a pattern of c.
func (l *ContentLists) matchIn(c contentCategory, s string, cand *contentCandidates) bool {
	lo, hi := l.first[c], l.first[c+1]
	for w := lo / 64; w*64 < hi; w++ {
		x := cand.set[w]
		for x != 0 {
			id := w*64 + bits.TrailingZeros64(x)
			x &= x - 1
			if id >= lo && id < hi && rules.Glob(l.globs[c][id-lo].pattern, s) {
				return true
			}
		}
	}
	return false
}

// match reports whether the lower-cased subject s matches a pattern of c.
func (l *ContentLists) match(c contentCategory, s string) bool {
	var cand contentCandidates
	l.candidates(s, &cand)
	return l.matchIn(c, s, &cand)
}

// Len is the number of patterns of all categories.
func (l *ContentLists) Len() int {
	n := 0
	for _, g := range l.globs {
		n += len(g)
	}
	return n
}

// matchAgent reports whether a user agent (any case) matches a scanner
// pattern (scanners.txt).
func (l *ContentLists) matchAgent(ua string) bool {
	var cand contentCandidates
	l.candidates(ua, &cand)
	lo, hi := l.first[catScanner], l.first[catScanner+1]
	for id := lo; id < hi; id++ {
		if cand.set[id/64]&(1<<(id%64)) != 0 {
			return l.matchIn(catScanner, strings.ToLower(ua), &cand)
		}
	}
	return false
}
