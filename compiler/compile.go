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

	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/dsl"
)

// FromDSL converts a checked AST layout, lowering its order as the IR
// lowers any order declaration.
func FromDSL(a *dsl.Decl) *ir.Layout {
	l := a.OrderDecl().Layout()
	l.Doc = a.Doc
	l.Writes = a.WritesName()
	if a.Pos.Line > 0 {
		l.Pos = a.Pos.String()
	}
	return l
}

// checkWrites returns an error for each pool layout whose writes clause
// names no part layout of the unit, at the name.
func checkWrites(ls []*ir.Layout, decls map[string]*dsl.Decl) dsl.ErrorList {
	var parts []string
	for _, l := range ls {
		if l.Kind == ir.Part {
			parts = append(parts, l.Name)
		}
	}
	var errs dsl.ErrorList
	for _, l := range ls {
		if l.Kind != ir.Pool || l.Writes == "" {
			continue
		}
		pos := decls[l.Name].Writes.Pos
		switch w, ok := decls[l.Writes]; {
		case !ok && len(parts) == 0:
			errs = append(errs, &dsl.Error{Pos: pos, Msg: fmt.Sprintf("pool layout %s writes unknown layout %q; no part layout is declared", l.Name, l.Writes)})
		case !ok:
			errs = append(errs, &dsl.Error{Pos: pos, Msg: fmt.Sprintf("pool layout %s writes unknown layout %q; part layouts are %s", l.Name, l.Writes, strings.Join(parts, ", "))})
		case w.Kind != "part":
			errs = append(errs, &dsl.Error{Pos: pos, Msg: fmt.Sprintf("pool layout %s writes %s, a pool layout; it writes a part layout", l.Name, l.Writes)})
		}
	}
	return errs
}

// Source is one .kvl file.
type Source struct {
	Name string
	Text []byte
}

// Compile parses, checks and lowers one .kvl file.
func Compile(filename string, src []byte) (*ir.File, error) {
	return CompileAll(Source{filename, src})
}

// CompileAll parses, checks and lowers .kvl files as one unit: layout names
// are unique across them and pairs join layouts of any of them. Every pair
// of valid layouts in which one side is a part lowers, whatever the splits
// of its sides, so the only errors are a dsl.ErrorList for the sources.
func CompileAll(srcs ...Source) (*ir.File, error) {
	var names []string
	var errs dsl.ErrorList
	f := &ir.File{}
	first := map[string]*dsl.Decl{}
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
		for _, a := range ast.Decls {
			if prev, dup := first[a.Name]; dup {
				errs = append(errs, &dsl.Error{Pos: a.Pos, Msg: fmt.Sprintf("duplicate layout %q, first defined at %s", a.Name, prev.Pos)})
				continue
			}
			first[a.Name] = a
			f.Layouts = append(f.Layouts, FromDSL(a))
		}
	}
	errs = append(errs, checkWrites(f.Layouts, first)...)
	if len(errs) > 0 {
		return nil, errs
	}
	f.Name = strings.Join(names, ", ")
	for _, src := range f.Layouts {
		for _, dst := range f.Layouts {
			if src.Kind == ir.Pool && dst.Kind == ir.Pool {
				continue
			}
			p, err := ir.Lower(src, dst)
			if err != nil {
				return nil, err
			}
			cp, err := ir.LowerIn(src, dst, ir.Dst)
			if err != nil {
				return nil, err
			}
			f.Ranges = append(f.Ranges, p)
			f.Copies = append(f.Copies, cp)
		}
	}
	return f, nil
}
