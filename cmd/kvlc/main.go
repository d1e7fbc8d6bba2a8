// Kvlc compiles .kvl layout files to Go kernels.
//
// For every ordered pair of the declared layouts in which at least one side
// is a part layout, it generates a range kernel (the byte runs of a page,
// merged where they are contiguous on both sides) and a copy kernel (the same
// movement between local buffers), and registers them in init under the
// layouts' identities, so that a program linking the package reads and
// writes pages in those layouts without the interpreter.
//
// Usage:
//
//	kvlc [-o out.go] [-pkg name] [-tags list] [-check] file.kvl...
//
// Put it in a go:generate line next to your .kvl file:
//
//	//go:generate go run github.com/kvreshard/kvreshard/cmd/kvlc -o layouts_kvl.go mylayouts.kvl
//
// Several files compile as one unit: names are unique across them and pairs
// join layouts of any of them. The output defaults to the first file's name
// with _kvl.go in place of .kvl. Like stringer, kvlc loads the package of
// the output's directory with golang.org/x/tools/go/packages (with the build
// tags of -tags) to learn its name; -pkg names it instead, and must agree
// with the package when there is one. A directory without Go files takes
// $GOPACKAGE (set by go generate). Before writing, kvlc type-checks the
// package with the new output in place of the old, and writes nothing when
// the output would not build (a layout name that collides with the
// package's own identifiers, say).
//
// With -check, kvlc writes nothing and exits 1 when the output file is
// missing or differs from what it would generate. A malformed .kvl file gets
// every error (up to 20) as file:line:col: message and exit status 1. A
// usage error (a bad flag, -pkg that is not a package name, an output that
// is a directory, a package kvlc cannot tell) prints one message and the
// usage line, and exits 2.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"go/token"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/tools/go/packages"

	"github.com/kvreshard/kvreshard/compiler"
	"github.com/kvreshard/kvreshard/dsl"
	"github.com/kvreshard/kvreshard/gen"
)

// maxErrors caps the errors printed for a bad .kvl file.
const maxErrors = 20

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// usageLine is what a usage error prints after its message.
const usageLine = "usage: kvlc [-o out.go] [-pkg name] [-tags list] [-check] file.kvl..."

// usageError is an error of the command line: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kvlc", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	out := fs.String("o", "", "output `file` (default: first input with _kvl.go for .kvl)")
	pkg := fs.String("pkg", "", "package `name` of the output (default: the package in the output's directory, else $GOPACKAGE)")
	tags := fs.String("tags", "", "comma-separated build `tags` to load the output's package with")
	check := fs.Bool("check", false, "write nothing; exit 1 if the output is missing or stale")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, usageLine)
			fs.SetOutput(stderr)
			fs.PrintDefaults()
			return 0 // -h asked for the usage
		}
		fmt.Fprintf(stderr, "kvlc: %v\n%s\n", err, usageLine)
		return 2
	}
	code, err := generate(*out, *pkg, *tags, *check, fs.Args())
	var ue *usageError
	switch {
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "kvlc: %s\n%s\n", ue.msg, usageLine)
		return 2
	case err != nil:
		printErrors(stderr, err)
	}
	return code
}

// generate does the work of run once the flags are parsed, and returns the
// exit status with the error to print.
func generate(out, pkg, tags string, check bool, inputs []string) (int, error) {
	if len(inputs) == 0 {
		return 2, usagef("no .kvl files given")
	}
	for _, name := range inputs {
		if !strings.HasSuffix(name, ".kvl") {
			return 2, usagef("%s: not a .kvl file", name)
		}
	}
	if pkg != "" && !isPackageName(pkg) {
		return 2, usagef("-pkg %q is not a Go package name", pkg)
	}
	if out == "" {
		out = strings.TrimSuffix(inputs[0], ".kvl") + "_kvl.go"
	}
	if fi, err := os.Stat(out); err == nil && fi.IsDir() {
		return 2, usagef("-o %s is a directory; name the output file", out)
	}
	if !strings.HasSuffix(out, ".go") {
		return 2, usagef("-o %s: the output is a .go file", out)
	}
	var srcs []compiler.Source
	for _, name := range inputs {
		text, err := os.ReadFile(name)
		if err != nil {
			return 1, err
		}
		srcs = append(srcs, compiler.Source{Name: name, Text: text})
	}
	f, err := compiler.CompileAll(srcs...)
	if err != nil {
		return 1, err
	}
	var target *packages.Package
	if !check || pkg == "" {
		target, err = loadPackage(out, tags, nil)
		if err != nil {
			return 2, err
		}
	}
	switch {
	case pkg == "" && target != nil:
		pkg = target.Name
	case pkg == "" && isPackageName(os.Getenv("GOPACKAGE")):
		pkg = os.Getenv("GOPACKAGE")
	case pkg == "":
		return 2, usagef("no Go package in %s to name the output's package from; name it with -pkg", filepath.Dir(out))
	case target != nil && target.Name != pkg:
		return 2, usagef("-pkg %s, but the package in %s is %s", pkg, filepath.Dir(out), target.Name)
	}
	src, err := gen.Generate(f, pkg)
	if err != nil {
		return 1, err
	}
	if check {
		old, err := os.ReadFile(out)
		if err != nil || !bytes.Equal(old, src) {
			return 1, fmt.Errorf("%s is out of date; run go generate", out)
		}
		return 0, nil
	}
	if target != nil {
		// The package again, with the new output in place: it must build.
		if err := typeCheck(out, tags, src); err != nil {
			return 1, err
		}
	}
	if err := writeAtomic(out, src); err != nil {
		return 1, err
	}
	return 0, nil
}

// isPackageName reports whether name can follow the package keyword.
func isPackageName(name string) bool {
	return token.IsIdentifier(name) && name != "_"
}

// loadPackage loads the package of the output's directory with the build
// tags, and src in place of the output file when src is not nil. It returns
// nil without an error when the directory holds no Go package (no Go
// files, or no module around it), and a usage error when the directory
// does not exist or holds more than one package.
func loadPackage(out, tags string, src []byte) (*packages.Package, error) {
	dir, err := filepath.Abs(filepath.Dir(out))
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, usagef("-o %s: no directory %s", out, filepath.Dir(out))
	}
	cfg := &packages.Config{
		Mode:  packages.NeedName | packages.NeedFiles,
		Dir:   dir,
		Tests: false,
	}
	if tags != "" {
		cfg.BuildFlags = []string{"-tags=" + tags}
	}
	if src != nil {
		abs, err := filepath.Abs(out)
		if err != nil {
			return nil, err
		}
		cfg.Mode |= packages.NeedTypes | packages.NeedSyntax | packages.NeedTypesInfo
		cfg.Overlay = map[string][]byte{abs: src}
	}
	pkgs, err := packages.Load(cfg, ".")
	if err != nil || len(pkgs) == 0 {
		return nil, nil // no module, no go command: no package to learn from
	}
	if len(pkgs) > 1 {
		return nil, usagef("%s holds %d packages; name the output's with -pkg", filepath.Dir(out), len(pkgs))
	}
	p := pkgs[0]
	if p.Name == "" {
		return nil, nil // no Go files (yet)
	}
	return p, nil
}

// typeCheck loads the output's package with src as the output and returns
// the errors of the output file, if any.
func typeCheck(out, tags string, src []byte) error {
	p, err := loadPackage(out, tags, src)
	if err != nil || p == nil {
		return err
	}
	abs, err := filepath.Abs(out)
	if err != nil {
		return err
	}
	var msgs []string
	for _, e := range p.Errors {
		if strings.HasPrefix(e.Pos, abs+":") {
			msgs = append(msgs, e.Msg)
		}
	}
	if len(msgs) > 0 {
		return fmt.Errorf("the generated %s would not build: %s", out, strings.Join(msgs, "; "))
	}
	return nil
}

func printErrors(w io.Writer, err error) {
	var list dsl.ErrorList
	if !errors.As(err, &list) {
		fmt.Fprintf(w, "kvlc: %v\n", err)
		return
	}
	for i, e := range list {
		if i == maxErrors {
			fmt.Fprintf(w, "kvlc: and %d more errors\n", len(list)-maxErrors)
			break
		}
		fmt.Fprintln(w, e)
	}
}

// writeAtomic replaces name with data, never leaving a half-written file.
func writeAtomic(name string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(name), "."+filepath.Base(name)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), name)
}
