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
//	kvlc [-o out.go] [-pkg name] [-check] file.kvl...
//
// Put it in a go:generate line next to your .kvl file:
//
//	//go:generate go run github.com/kvreshard/kvreshard/cmd/kvlc -o layouts_kvl.go mylayouts.kvl
//
// Several files compile as one unit: names are unique across them and pairs
// join layouts of any of them. The output defaults to the first file's name
// with _kvl.go in place of .kvl; the package defaults to $GOPACKAGE (set by
// go generate), else the output directory's name.
//
// With -check, kvlc writes nothing and exits 1 when the output file is
// missing or differs from what it would generate. A malformed .kvl file gets
// every error (up to 20) as file:line:col: message and exit status 1; a usage
// error exits 2.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/kvreshard/kvreshard/compiler"
	"github.com/kvreshard/kvreshard/dsl"
	"github.com/kvreshard/kvreshard/gen"
)

// maxErrors caps the errors printed for a bad .kvl file.
const maxErrors = 20

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kvlc", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", "", "output `file` (default: first input with _kvl.go for .kvl)")
	pkg := fs.String("pkg", "", "package `name` of the output (default: $GOPACKAGE, else the output directory's name)")
	check := fs.Bool("check", false, "write nothing; exit 1 if the output is missing or stale")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: kvlc [-o out.go] [-pkg name] [-check] file.kvl...")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0 // -h asked for the usage, which was printed
		}
		return 2
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "kvlc: no .kvl files given")
		fs.Usage()
		return 2
	}
	for _, name := range fs.Args() {
		if !strings.HasSuffix(name, ".kvl") {
			fmt.Fprintf(stderr, "kvlc: %s: not a .kvl file\n", name)
			return 2
		}
	}
	var srcs []compiler.Source
	for _, name := range fs.Args() {
		text, err := os.ReadFile(name)
		if err != nil {
			fmt.Fprintf(stderr, "kvlc: %v\n", err)
			return 1
		}
		srcs = append(srcs, compiler.Source{Name: name, Text: text})
	}
	if *out == "" {
		*out = strings.TrimSuffix(fs.Arg(0), ".kvl") + "_kvl.go"
	}
	if *pkg == "" {
		*pkg = os.Getenv("GOPACKAGE")
	}
	if *pkg == "" {
		abs, err := filepath.Abs(filepath.Dir(*out))
		if err != nil {
			fmt.Fprintf(stderr, "kvlc: %v\n", err)
			return 1
		}
		*pkg = strings.NewReplacer("-", "_", ".", "_").Replace(filepath.Base(abs))
	}
	src, err := Generate(*pkg, srcs...)
	if err != nil {
		printErrors(stderr, err)
		return 1
	}
	if *check {
		old, err := os.ReadFile(*out)
		if err != nil || !bytes.Equal(old, src) {
			fmt.Fprintf(stderr, "kvlc: %s is out of date; run go generate\n", *out)
			return 1
		}
		return 0
	}
	if err := writeAtomic(*out, src); err != nil {
		fmt.Fprintf(stderr, "kvlc: %v\n", err)
		return 1
	}
	return 0
}

// Generate compiles the sources and returns the generated Go file.
func Generate(pkg string, srcs ...compiler.Source) ([]byte, error) {
	f, err := compiler.CompileAll(srcs...)
	if err != nil {
		return nil, err
	}
	return gen.Generate(f, pkg)
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
