// Package compiler lowers .kvl layouts to an IR of modes and lowers every
// (source, destination) layout pair to a loop nest whose innermost run is the
// longest span contiguous on both sides.
//
// A layout is an order of axes, outermost first. Its modes have symbolic
// shapes (page size, layer count, head count, head dim, pool slots) and dense
// strides derived from the order. A pair's loop nest follows the order of the
// store side (the part), so runs come out in part-offset order and
// consecutive runs merge whenever they continue each other on both sides.
package compiler

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/kvreshard/kvreshard/dsl"
)

// Kind says whether a layout describes a store part or a host pool.
type Kind uint8

const (
	Part Kind = iota // one page, no slot axis
	Pool             // many pages, with a slot axis S
)

func (k Kind) String() string {
	if k == Pool {
		return "pool"
	}
	return "part"
}

// Axis is one of C, S, T, L, H, D.
type Axis byte

// The axes.
const (
	C Axis = 'C' // component: K and V, or one MLA latent
	S Axis = 'S' // page slot of a host pool
	T Axis = 'T' // token within a page
	L Axis = 'L' // layer
	H Axis = 'H' // KV head
	D Axis = 'D' // element within a head
)

func (a Axis) String() string { return string(rune(a)) }

// Split says which part of an axis a mode is.
type Split uint8

const (
	Whole Split = iota // the whole axis
	Outer              // X/f: the quotient, X/f blocks
	Inner              // X%f: the f elements inside a block
	// Middle is (X%Factor)/Unit: the Factor/Unit blocks of Unit elements
	// inside a block of Factor. Layouts never declare it; lowering refines
	// the modes of two layouts that split an axis by nested factors into
	// it (T/4 T%4 against T/2 T%2 has T/4, T%4/2 and T%2 on both sides).
	Middle
)

// Mode is one axis, or one part of a split axis, of a layout or of a
// pair's loop nest.
type Mode struct {
	Axis   Axis
	Split  Split
	Factor int // split factor; 0 for a whole axis
	Unit   int // Middle only: the elements of one step of the mode
}

func (m Mode) String() string {
	switch m.Split {
	case Outer:
		return fmt.Sprintf("%s/%d", m.Axis, m.Factor)
	case Inner:
		return fmt.Sprintf("%s%%%d", m.Axis, m.Factor)
	case Middle:
		return fmt.Sprintf("%s%%%d/%d", m.Axis, m.Factor, m.Unit)
	}
	return m.Axis.String()
}

// digit returns the mode of axis a whose index is (x%hi)/lo of the axis
// index x, with hi 0 for no modulus: Whole, Outer, Inner or Middle.
func digit(a Axis, hi, lo int) Mode {
	switch {
	case hi == 0 && lo == 1:
		return Mode{Axis: a}
	case hi == 0:
		return Mode{Axis: a, Split: Outer, Factor: lo}
	case lo == 1:
		return Mode{Axis: a, Split: Inner, Factor: hi}
	}
	return Mode{Axis: a, Split: Middle, Factor: hi, Unit: lo}
}

// bounds returns (hi, lo) of the mode as digit takes them.
func (m Mode) bounds() (hi, lo int) {
	switch m.Split {
	case Outer:
		return 0, m.Factor
	case Inner:
		return m.Factor, 1
	case Middle:
		return m.Factor, m.Unit
	}
	return 0, 1
}

// Layout is a checked layout declaration.
type Layout struct {
	Name  string
	Doc   string
	Kind  Kind
	Modes []Mode
	Pos   string // file:line:col of the declaration, "" when not from a file
}

// Order returns the canonical order text, for example "C L H D/8 T D%8".
func (l *Layout) Order() string {
	s := make([]string, len(l.Modes))
	for i, m := range l.Modes {
		s[i] = m.String()
	}
	return strings.Join(s, " ")
}

// Identity is the layout's canonical identity: its kind and order. Two
// layouts with the same identity place every byte at the same offset,
// whatever their names.
func (l *Layout) Identity() string { return l.Kind.String() + "(" + l.Order() + ")" }

// String returns the declaration in .kvl syntax.
func (l *Layout) String() string {
	doc := ""
	if l.Doc != "" {
		doc = fmt.Sprintf(" %q", l.Doc)
	}
	return fmt.Sprintf("%s %s%s { order %s }", l.Kind, l.Name, doc, l.Order())
}

// COuter reports whether C is the outermost axis, so that each component is
// a block of its own (and K and V head dims may differ).
func (l *Layout) COuter() bool { return len(l.Modes) > 0 && l.Modes[0].Axis == C }

// SlotPool returns the pool layout that keeps pages of part layout l one
// slot after another: S just inside C when C is outermost (a block per
// component, as SGLang keeps K and V apart), else outermost. It is how a
// writer holds pages of a custom part layout when it names no pool.
func (l *Layout) SlotPool() *Layout {
	p := &Layout{Name: l.Name + "_pool", Doc: "pages of " + l.Name + " one slot after another", Kind: Pool}
	i := 0
	if l.COuter() {
		i = 1
	}
	p.Modes = append(append(append([]Mode{}, l.Modes[:i]...), Mode{Axis: S}), l.Modes[i:]...)
	return p
}

// SplitOf returns the split factor of axis a, or 0 when a is whole.
func (l *Layout) SplitOf(a Axis) int {
	for _, m := range l.Modes {
		if m.Axis == a && m.Split != Whole {
			return m.Factor
		}
	}
	return 0
}

// FromDSL converts a checked AST layout.
func FromDSL(a *dsl.Layout) *Layout {
	l := &Layout{Name: a.Name, Doc: a.Doc, Kind: Part}
	if a.Kind == "pool" {
		l.Kind = Pool
	}
	if a.Pos.Line > 0 {
		l.Pos = a.Pos.String()
	}
	for _, m := range a.Order {
		mode := Mode{Axis: Axis(m.Axis[0]), Factor: m.Factor}
		switch m.Op {
		case "/":
			mode.Split = Outer
		case "%":
			mode.Split = Inner
		}
		l.Modes = append(l.Modes, mode)
	}
	return l
}

// ParseLayout parses and checks one layout from its order text, as a
// manifest stores it.
func ParseLayout(kind Kind, name, order string) (*Layout, error) {
	a, err := dsl.ParseOrder(kind.String(), name, order)
	if err != nil {
		return nil, err
	}
	return FromDSL(a), nil
}

// File is a compiled .kvl file: its layouts and every pair a kernel is
// generated for.
type File struct {
	Name    string // the .kvl file name
	Layouts []*Layout
	Pairs   []*Pair
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
			f.Pairs = append(f.Pairs, p)
		}
	}
	return f, nil
}

// String prints the layouts and the lowered pairs; golden tests compare it.
func (f *File) String() string {
	var b strings.Builder
	for _, l := range f.Layouts {
		fmt.Fprintf(&b, "%s\n", l)
	}
	for _, p := range f.Pairs {
		b.WriteString("\n")
		b.WriteString(p.String())
	}
	return b.String()
}
