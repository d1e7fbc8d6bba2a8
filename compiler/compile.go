// Package compiler is the front end of the layout compiler: it parses and
// checks .kvl files with package dsl and turns their layouts into the IR of
// package ir, lowering every pair. The IR's types and functions are also
// available here under their own names, for programs that compile .kvl text
// (kvlc, kvreshard --kvl); a serving process that only reads and writes
// pages imports package ir and links no parser.
package compiler

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/kvreshard/kvreshard/dsl"
)

// FromDSL converts a checked AST layout, lowering its order as the IR
// lowers any order declaration.
func FromDSL(a *dsl.Layout) *Layout {
	l := a.Decl().Layout()
	l.Doc = a.Doc
	if a.Pos.Line > 0 {
		l.Pos = a.Pos.String()
	}
	return l
}

// Source is one .kvl file.
type Source struct {
	Name string
	Text []byte
}

// Compile parses, checks and lowers one .kvl file.
func Compile(filename string, src []byte) (*File, error) {
	return CompileAll(Source{filename, src})
}

// CompileAll parses, checks and lowers .kvl files as one unit: layout names
// are unique across them and pairs join layouts of any of them. Every pair
// of valid layouts in which one side is a part lowers, whatever the splits
// of its sides, so the only errors are a dsl.ErrorList for the sources.
func CompileAll(srcs ...Source) (*File, error) {
	var names []string
	var errs dsl.ErrorList
	f := &File{}
	first := map[string]*dsl.Layout{}
	for _, s := range srcs {
		names = append(names, filepath.Base(s.Name))
		ast, err := dsl.Parse(s.Name, s.Text)
		if err != nil {
			var el dsl.ErrorList
			if errors.As(err, &el) {
				errs = append(errs, el...)
				continue
			}
			return nil, err
		}
		for _, a := range ast.Layouts {
			if prev, dup := first[a.Name]; dup {
				errs = append(errs, &dsl.Error{Pos: a.Pos, Msg: fmt.Sprintf("duplicate layout %q, first defined at %s", a.Name, prev.Pos)})
				continue
			}
			first[a.Name] = a
			f.Layouts = append(f.Layouts, FromDSL(a))
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	f.Name = strings.Join(names, ", ")
	for _, src := range f.Layouts {
		for _, dst := range f.Layouts {
			if src.Kind == Pool && dst.Kind == Pool {
				continue
			}
			p, err := Lower(src, dst)
			if err != nil {
				return nil, err
			}
			cp, err := LowerIn(src, dst, Dst)
			if err != nil {
				return nil, err
			}
			f.Pairs = append(f.Pairs, p)
			f.Copies = append(f.Copies, cp)
		}
	}
	return f, nil
}
