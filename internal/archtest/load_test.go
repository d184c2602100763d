package archtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// module is the module under test as go list and go/parser see it.
type module struct {
	root  string              // directory holding go.mod
	path  string              // module path, "github.com/sluice-rl/sluice"
	pkgs  []*pkg              // the module's packages, sorted by rel
	graph map[string][]string // import path → its non-test imports, for every package of the build
	errs  []string            // go list's package errors, "import/path: message"
}

// pkg is one package of the module.
type pkg struct {
	rel   string              // module-relative path, "enforcer/sidecar"; "." for the root
	path  string              // import path
	build map[string][]string // non-test files' imports: import path → "file:line" of each, file module-relative
	test  map[string][]string // test files' imports (in-package and _test), same shape
}

// listed is the part of go list -json's output that load reads.
type listed struct {
	ImportPath, Dir, Name string
	Module                *struct {
		Path string
		Main bool
	}
	Imports, TestImports, XTestImports                           []string
	GoFiles, CgoFiles, TestGoFiles, XTestGoFiles, IgnoredGoFiles []string
	Error                                                        *struct{ Err string }
}

var loaded struct {
	once sync.Once
	m    *module
	err  error
}

// load returns the module, loaded once for all the tests.
func load(t *testing.T) *module {
	t.Helper()
	loaded.once.Do(func() { loaded.m, loaded.err = loadModule() })
	if loaded.err != nil {
		t.Fatalf("load module: %v", loaded.err)
	}
	return loaded.m
}

// loadModule runs go env GOMOD and one go list -deps over the module's
// packages, then parses the import blocks of each module package's files.
func loadModule() (*module, error) {
	out, err := goCmd("", "env", "GOMOD")
	if err != nil {
		return nil, err
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return nil, errors.New("go env GOMOD: not inside a module")
	}
	m := &module{root: filepath.Dir(gomod), graph: map[string][]string{}}
	out, err = goCmd(m.root, "list", "-e", "-deps",
		"-json=ImportPath,Dir,Name,Module,Imports,TestImports,XTestImports,GoFiles,CgoFiles,TestGoFiles,XTestGoFiles,IgnoredGoFiles,Error",
		"./...")
	if err != nil {
		return nil, err
	}
	var mine []*listed
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		l := new(listed)
		if err := dec.Decode(l); err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("decode go list: %w", err)
		}
		m.graph[l.ImportPath] = l.Imports
		if l.Error != nil {
			m.errs = append(m.errs, l.ImportPath+": "+l.Error.Err)
		}
		if l.Module != nil && l.Module.Main {
			m.path = l.Module.Path
			mine = append(mine, l)
		}
	}
	if m.path == "" {
		return nil, fmt.Errorf("go list ./... in %s: no package of the main module", m.root)
	}
	for _, l := range mine {
		p, err := m.parse(l)
		if err != nil {
			return nil, err
		}
		m.pkgs = append(m.pkgs, p)
	}
	slices.SortFunc(m.pkgs, func(a, b *pkg) int { return strings.Compare(a.rel, b.rel) })
	return m, nil
}

// parse reads the imports of l's files: those of the default build and those
// that build tags leave out (race_on_test.go), if they are of the package or
// its _test package. It errs if go list names an in-module import that no
// file holds.
func (m *module) parse(l *listed) (*pkg, error) {
	p := &pkg{rel: m.rel(l.ImportPath), path: l.ImportPath, build: map[string][]string{}, test: map[string][]string{}}
	fset := token.NewFileSet()
	files := slices.Concat(l.GoFiles, l.CgoFiles, l.TestGoFiles, l.XTestGoFiles, l.IgnoredGoFiles)
	for i, name := range files {
		full := filepath.Join(l.Dir, name)
		f, err := parser.ParseFile(fset, full, nil, parser.ImportsOnly)
		if err != nil {
			return nil, fmt.Errorf("parse imports: %w", err)
		}
		ignored := i >= len(files)-len(l.IgnoredGoFiles)
		if ignored && l.Name != "" && f.Name.Name != l.Name && f.Name.Name != l.Name+"_test" {
			continue // a //go:build ignore program and the like
		}
		into := p.build
		if strings.HasSuffix(name, "_test.go") {
			into = p.test
		}
		rel, err := filepath.Rel(m.root, full)
		if err != nil {
			return nil, err
		}
		for _, s := range f.Imports {
			path, err := strconv.Unquote(s.Path.Value)
			if err != nil {
				return nil, fmt.Errorf("%s: import %s: %w", rel, s.Path.Value, err)
			}
			at := filepath.ToSlash(rel) + ":" + strconv.Itoa(fset.Position(s.Pos()).Line)
			into[path] = append(into[path], at)
		}
	}
	for _, c := range []struct {
		listed []string
		parsed map[string][]string
	}{{l.Imports, p.build}, {l.TestImports, p.test}, {l.XTestImports, p.test}} {
		for _, path := range c.listed {
			if _, ok := c.parsed[path]; !ok && m.in(path) {
				return nil, fmt.Errorf("%s: go list says it imports %s, but no file parsed does", p.rel, path)
			}
		}
	}
	return p, nil
}

// in reports whether an import path is of the module.
func (m *module) in(path string) bool { return under(path, m.path) }

// rel returns the module-relative form of an import path of the module
// ("." for the module's root), or the path itself for another module's.
func (m *module) rel(path string) string {
	switch {
	case path == m.path:
		return "."
	case m.in(path):
		return strings.TrimPrefix(path, m.path+"/")
	}
	return path
}

// goCmd runs the go command in dir (the current directory if "") with
// GOWORK=off, so that ./... means this module only, and returns its stdout.
func goCmd(dir string, args ...string) ([]byte, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}
