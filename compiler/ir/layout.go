// Package ir is the layout compiler's intermediate representation, and
// everything the runtime needs of it: layouts as modes with symbolic shapes,
// the lowering of every (source, destination) layout pair to a loop nest
// whose innermost run is the longest span contiguous on both sides, and a
// parser of a single order (the text a manifest stores). It imports no
// front end: package dsl parses .kvl text, package compiler turns it into
// this IR, package gen emits kernels from it, and the runtime (the kernel
// interpreter, the planner, manifests) uses it alone.
//
// A layout is an order of axes, outermost first. Its modes have symbolic
// shapes (page size, layer count, head count, head dim, pool slots) and dense
// strides derived from the order. A pair's loop nest follows the order of the
// store side (the part), so runs come out in part-offset order and
// consecutive runs merge whenever they continue each other on both sides.
package ir

import (
	"fmt"
	"strings"
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
	// Writes is, for a pool layout, the name of the part layout that a
	// writer of such a pool stores its pages in when it names none; "" when
	// the declaration says nothing.
	Writes string
	Pos    string // file:line:col of the declaration, "" when not from a file
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
	writes := ""
	if l.Writes != "" {
		writes = " writes " + l.Writes
	}
	return fmt.Sprintf("%s %s%s { order %s%s }", l.Kind, l.Name, doc, l.Order(), writes)
}

// ElementOffset returns the offset, in elements, of one element in a
// dense buffer of layout l: the modes in order, outermost first, each
// taking extent(mode) values, the element's index on a mode being
// index(its axis) divided by the split factor (outer half) or taken modulo
// it (inner half). A buffer whose components are regions of their own (C
// outermost, unpacked) gives C extent 1 and index 0.
func (l *Layout) ElementOffset(extent func(Mode) int, index func(Axis) int) int {
	off := 0
	for _, m := range l.Modes {
		idx := index(m.Axis)
		switch m.Split {
		case Outer:
			idx /= m.Factor
		case Inner:
			idx %= m.Factor
		}
		off = off*extent(m) + idx
	}
	return off
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

// File is a compiled .kvl file: its layouts and every pair a kernel is
// generated for.
type File struct {
	Name    string // the .kvl file name
	Layouts []*Layout
	Ranges  []*Nest // lowered following the part: range kernels
	// Copies holds each nest of Ranges lowered following the destination,
	// at the same index: copy kernels (see LowerIn).
	Copies []*Nest
}

// String prints the layouts and the lowered pairs; golden tests compare it.
func (f *File) String() string {
	var b strings.Builder
	for _, l := range f.Layouts {
		fmt.Fprintf(&b, "%s\n", l)
	}
	for _, p := range f.Ranges {
		b.WriteString("\n")
		b.WriteString(p.String())
	}
	return b.String()
}
