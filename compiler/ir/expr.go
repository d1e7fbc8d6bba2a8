package ir

import (
	"fmt"
	"sort"
	"strings"
)

// Sym is a shape known only at run time.
type Sym uint8

// The symbols of the IR. Per-side symbols come in pairs: the source's, then
// the destination's.
const (
	SymItem  Sym = iota // I: bytes per element
	SymPage             // T: tokens per page
	SymDim              // D: head dim of the component, in elements
	SymComps            // NC: number of components
	SymSrcLayers
	SymDstLayers
	SymSrcHeads
	SymDstHeads
	SymSrcSlots
	SymDstSlots
	SymCommonLayers // nL: layers both sides hold
	SymCommonHeads  // nH: heads both sides hold
	NumSyms
)

var symNames = [NumSyms]string{"I", "T", "D", "NC", "Ls", "Ld", "Hs", "Hd", "Ss", "Sd", "nL", "nH"}

func (s Sym) String() string { return symNames[s] }

// Factor is a symbol, or a symbol divided by a split factor (Div > 0).
type Factor struct {
	Sym Sym
	Div int
}

func (f Factor) String() string {
	if f.Div > 0 {
		return fmt.Sprintf("%s/%d", f.Sym, f.Div)
	}
	return f.Sym.String()
}

// Expr is a monomial: Const times the product of Factors. Shapes and strides
// of dense layouts are always monomials.
type Expr struct {
	Const   int
	Factors []Factor // sorted
}

// Lit returns the constant expression n.
func Lit(n int) Expr { return Expr{Const: n} }

// Of returns the expression of one symbol.
func Of(s Sym) Expr { return Expr{Const: 1, Factors: []Factor{{Sym: s}}} }

// Mul returns the product of e and o.
func (e Expr) Mul(o Expr) Expr {
	r := Expr{Const: e.Const * o.Const}
	r.Factors = append(append(r.Factors, e.Factors...), o.Factors...)
	sort.Slice(r.Factors, func(i, j int) bool {
		a, b := r.Factors[i], r.Factors[j]
		if a.Sym != b.Sym {
			return a.Sym < b.Sym
		}
		return a.Div < b.Div
	})
	return r
}

// Equal reports whether two monomials are identical.
func (e Expr) Equal(o Expr) bool {
	if e.Const != o.Const || len(e.Factors) != len(o.Factors) {
		return false
	}
	for i := range e.Factors {
		if e.Factors[i] != o.Factors[i] {
			return false
		}
	}
	return true
}

// Has reports whether the expression mentions symbol s.
func (e Expr) Has(s Sym) bool {
	for _, f := range e.Factors {
		if f.Sym == s {
			return true
		}
	}
	return false
}

func (e Expr) String() string {
	var parts []string
	if e.Const != 1 || len(e.Factors) == 0 {
		parts = append(parts, fmt.Sprint(e.Const))
	}
	for _, f := range e.Factors {
		parts = append(parts, f.String())
	}
	return strings.Join(parts, "*")
}

// Eval computes the expression from symbol values.
func (e Expr) Eval(v *Env) int {
	n := e.Const
	for _, f := range e.Factors {
		x := v[f.Sym]
		if f.Div > 0 {
			x /= f.Div
		}
		n *= x
	}
	return n
}

// Env holds the value of every symbol for one problem.
type Env [NumSyms]int
