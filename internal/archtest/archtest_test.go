package archtest

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
)

// TestTable checks the table against itself and the module: roots are
// unique, every allowed root is a row, every top-level directory holding a
// package has a row, and every row holds a package (or may be empty).
func TestTable(t *testing.T) {
	roots := map[string]bool{}
	for _, r := range table {
		if roots[r.root] {
			t.Errorf("table: row %s twice", r.root)
		}
		roots[r.root] = true
	}
	for _, r := range table {
		for _, a := range r.allowed {
			if !roots[a] {
				t.Errorf("table: row %s allows %s, which is no row", r.root, a)
			}
		}
		if r.anything && len(r.allowed) > 0 {
			t.Errorf("table: row %s allows anything and a list", r.root)
		}
	}

	m := load(t)
	for _, e := range m.errs {
		t.Errorf("go list: %s", e)
	}
	held := map[*row]bool{}
	for _, p := range m.pkgs {
		r := rowOf(p.rel)
		if r == nil || !roots[top(p.rel)] {
			t.Errorf("%s: top-level directory %s holds a package but has no row in the table", p.rel, top(p.rel))
			continue
		}
		held[r] = true
	}
	for i := range table {
		if r := &table[i]; !held[r] && !r.mayBeEmpty {
			t.Errorf("table: row %s holds no package of the module", r.root)
		}
	}
}

// TestImports checks every in-module import of every package, test files'
// included, against the importer's row.
func TestImports(t *testing.T) {
	m := load(t)
	var bad []string
	for _, p := range m.pkgs {
		if rowOf(p.rel) == nil {
			continue // TestTable reports it
		}
		for _, c := range []struct {
			imports map[string][]string
			test    bool
		}{{p.build, false}, {p.test, true}} {
			for _, path := range slices.Sorted(maps.Keys(c.imports)) {
				if !m.in(path) {
					continue
				}
				if why := verdict(p.rel, m.rel(path), c.test); why != "" {
					bad = append(bad, fmt.Sprintf("%s imports %s (%s): %s", p.rel, m.rel(path), strings.Join(c.imports[path], ", "), why))
				}
			}
		}
	}
	if len(bad) > 0 {
		t.Errorf("%d imports outside ARCHITECTURE.md's package table:\n\t%s", len(bad), strings.Join(bad, "\n\t"))
	}
}

// TestClients checks that the banned rows' non-test builds link none of
// their banned clients, through any chain of imports.
func TestClients(t *testing.T) {
	m := load(t)
	var bad []string
	for _, b := range bans {
		for _, p := range m.pkgs {
			if r := rowOf(p.rel); r == nil || !slices.Contains(b.rows, r.root) {
				continue
			}
			for _, c := range b.clients {
				ch := chain(m.graph, p.path, func(path string) bool { return under(path, c.prefix) })
				if ch != nil {
					bad = append(bad, fmt.Sprintf("%s links %s: %s", p.rel, c.what, m.describe(ch)))
				}
			}
		}
		if len(bad) > 0 {
			t.Errorf("%s:\n\t%s", b.rule, strings.Join(bad, "\n\t"))
			bad = bad[:0]
		}
	}
}

// chain returns the shortest chain [from, ..., x] along graph's edges with
// hit(x), or nil if there is none. x may be from itself: a cycle. Edges are
// tried in graph's order (go list's is sorted), so that the chain is the
// same from run to run.
func chain(graph map[string][]string, from string, hit func(string) bool) []string {
	prev := map[string]string{from: ""}
	for queue := []string{from}; len(queue) > 0; queue = queue[1:] {
		for _, q := range graph[queue[0]] {
			if hit(q) { // before seen, so that chain can return to from
				ch := []string{q}
				for x := queue[0]; ; x = prev[x] {
					ch = append(ch, x)
					if x == from {
						break
					}
				}
				slices.Reverse(ch)
				return ch
			}
			if _, seen := prev[q]; seen {
				continue
			}
			prev[q] = queue[0]
			queue = append(queue, q)
		}
	}
	return nil
}

// describe renders an import chain as "a -> b -> c (a/f.go:3 imports b; b/g.go:9
// imports c)", naming the file of each import made by a module package.
func (m *module) describe(ch []string) string {
	names := make([]string, len(ch))
	var hops []string
	for i, path := range ch {
		names[i] = m.rel(path)
		if i == 0 || !m.in(ch[i-1]) {
			continue
		}
		if p := m.pkg(ch[i-1]); p != nil && len(p.build[path]) > 0 {
			hops = append(hops, p.build[path][0]+" imports "+names[i])
		}
	}
	return strings.Join(names, " -> ") + " (" + strings.Join(hops, "; ") + ")"
}

// pkg returns the module's package of an import path, or nil.
func (m *module) pkg(path string) *pkg {
	i, ok := slices.BinarySearchFunc(m.pkgs, m.rel(path), func(p *pkg, rel string) int { return strings.Compare(p.rel, rel) })
	if !ok {
		return nil
	}
	return m.pkgs[i]
}

// TestNoCycles checks that no top-level directory (internal/ left out)
// reaches itself through imports, test files' included.
func TestNoCycles(t *testing.T) {
	m := load(t)
	// edges: top → top → an example import, "a/f_test.go:3 imports b/c".
	edges := map[string]map[string]string{}
	for _, p := range m.pkgs {
		for _, imports := range []map[string][]string{p.build, p.test} {
			for _, path := range slices.Sorted(maps.Keys(imports)) {
				from, to := top(p.rel), top(m.rel(path))
				if !m.in(path) || from == to || from == "internal" || to == "internal" {
					continue
				}
				if edges[from] == nil {
					edges[from] = map[string]string{}
				}
				if _, ok := edges[from][to]; !ok {
					edges[from][to] = imports[path][0] + " imports " + m.rel(path)
				}
			}
		}
	}
	graph := map[string][]string{}
	for from, tos := range edges {
		graph[from] = slices.Sorted(maps.Keys(tos))
	}
	// The shortest cycle through each directory and every pair that import
	// each other; each cycle once, from its least directory, shortest first.
	var cycles [][]string
	seen := map[string]bool{}
	add := func(cyc []string) { // cyc: [a, ..., z], z imports a
		i := slices.Index(cyc, slices.Min(cyc))
		cyc = append(append(slices.Clone(cyc[i:]), cyc[:i]...), cyc[i])
		if key := strings.Join(cyc, " "); !seen[key] {
			seen[key] = true
			cycles = append(cycles, cyc)
		}
	}
	for _, a := range slices.Sorted(maps.Keys(graph)) {
		if ch := chain(graph, a, func(x string) bool { return x == a }); ch != nil {
			add(ch[:len(ch)-1])
		}
		for _, b := range graph[a] {
			if slices.Contains(graph[b], a) {
				add([]string{a, b})
			}
		}
	}
	slices.SortStableFunc(cycles, func(x, y []string) int { return len(x) - len(y) })
	var bad []string
	for _, cyc := range cycles {
		var hops []string
		for j := 1; j < len(cyc); j++ {
			hops = append(hops, edges[cyc[j-1]][cyc[j]])
		}
		bad = append(bad, strings.Join(cyc, " -> ")+" ("+strings.Join(hops, "; ")+")")
	}
	if len(bad) > 0 {
		t.Errorf("%d import cycles between top-level directories:\n\t%s", len(bad), strings.Join(bad, "\n\t"))
	}
}

// TestChain checks the shortest chain and its return to the start.
func TestChain(t *testing.T) {
	g := map[string][]string{"a": {"b", "c"}, "b": {"d"}, "c": {"a", "d"}, "d": {"x"}}
	for _, c := range []struct {
		from, to string
		want     []string
	}{
		{"a", "x", []string{"a", "b", "d", "x"}},
		{"a", "a", []string{"a", "c", "a"}},
		{"b", "a", nil},
	} {
		if got := chain(g, c.from, func(s string) bool { return s == c.to }); !slices.Equal(got, c.want) {
			t.Errorf("chain(%s, %s) = %v; want %v", c.from, c.to, got, c.want)
		}
	}
}
