package dsl

import (
	"fmt"

	"github.com/alecthomas/participle/v2/lexer"

	"github.com/kvreshard/kvreshard/compiler/ir"
)

// Axes lists the axes in the order messages name them.
var Axes = []string{"C", "S", "T", "L", "H", "D"}

// MaxFactor is the largest split factor the checker accepts.
const MaxFactor = ir.MaxFactor

// Check returns every semantic error in f, in position order, or nil.
func Check(f *File) ErrorList {
	if f == nil {
		return nil
	}
	var errs ErrorList
	first := map[string]*Decl{}
	for _, l := range f.Decls {
		if l == nil {
			continue
		}
		errs = append(errs, checkLayout(l)...)
		if l.Writes != nil && l.Kind == "part" {
			errs = append(errs, errorf(l.Writes.Pos, "part layout %s writes %s; only a pool layout names the part layout it writes", l.Name, l.Writes.Name))
		}
		if prev, ok := first[l.Name]; ok {
			errs = append(errs, errorf(l.Pos, "duplicate layout %q, first defined at %s", l.Name, at(prev.Pos)))
		} else {
			first[l.Name] = l
		}
	}
	errs.sort()
	return errs
}

func errorf(pos lexer.Position, format string, args ...any) *Error {
	return &Error{Pos: pos, Msg: fmt.Sprintf(format, args...)}
}

// OrderDecl returns the layout as the IR's order declaration, the layout and
// each of its modes at their line and column, for ir.CheckOrder and the
// IR's lowering (ir.OrderDecl.Layout). Nil modes are left out.
func (l *Decl) OrderDecl() *ir.OrderDecl {
	d := &ir.OrderDecl{Pos: irPos(l.Pos), Kind: l.Kind, Name: l.Name}
	for _, m := range l.Order {
		if m != nil {
			d.Order = append(d.Order, &ir.OrderMode{Pos: irPos(m.Pos), Axis: m.Axis, Op: m.Op, Factor: m.Factor})
		}
	}
	return d
}

func irPos(p lexer.Position) ir.Pos { return ir.Pos{Line: p.Line, Column: p.Column} }

// checkLayout returns the errors of one layout by the IR's checker, each at
// the position of the layout or mode it is about, sorted as
// ir.CheckOrder sorts them.
func checkLayout(l *Decl) ErrorList {
	ierrs := ir.CheckOrder(l.OrderDecl())
	if len(ierrs) == 0 {
		return nil
	}
	// The checker reports the line and column of the layout or of a mode;
	// give back that node's whole position (file name and offset too).
	full := map[ir.Pos]lexer.Position{irPos(l.Pos): l.Pos}
	for _, m := range l.Order {
		if m == nil {
			continue
		}
		if _, ok := full[irPos(m.Pos)]; !ok {
			full[irPos(m.Pos)] = m.Pos
		}
	}
	errs := make(ErrorList, len(ierrs))
	for i, e := range ierrs {
		pos, ok := full[e.Pos]
		if !ok {
			pos = lexer.Position{Filename: l.Pos.Filename, Line: e.Pos.Line, Column: e.Pos.Column}
		}
		errs[i] = &Error{Pos: pos, Msg: e.Msg}
	}
	return errs
}
