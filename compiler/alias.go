package compiler

import "github.com/kvreshard/kvreshard/compiler/ir"

// The IR of package ir under the front end's name. See package ir for the
// documentation of each.

type (
	Kind     = ir.Kind
	Axis     = ir.Axis
	Split    = ir.Split
	Mode     = ir.Mode
	Layout   = ir.Layout
	File     = ir.File
	Side     = ir.Side
	FoldKind = ir.FoldKind
	Fold     = ir.Fold
	Loop     = ir.Loop
	Mixed    = ir.Mixed
	Pair     = ir.Pair
	Sym      = ir.Sym
	Factor   = ir.Factor
	Expr     = ir.Expr
	Env      = ir.Env
)

// Layout kinds, axes, splits, sides and folds.
const (
	Part    = ir.Part
	Pool    = ir.Pool
	C       = ir.C
	S       = ir.S
	T       = ir.T
	L       = ir.L
	H       = ir.H
	D       = ir.D
	Whole   = ir.Whole
	Outer   = ir.Outer
	Inner   = ir.Inner
	Middle  = ir.Middle
	Src     = ir.Src
	Dst     = ir.Dst
	Never   = ir.Never
	Static  = ir.Static
	Runtime = ir.Runtime
)

// The symbols of the IR.
const (
	SymItem         = ir.SymItem
	SymPage         = ir.SymPage
	SymDim          = ir.SymDim
	SymComps        = ir.SymComps
	SymSrcLayers    = ir.SymSrcLayers
	SymDstLayers    = ir.SymDstLayers
	SymSrcHeads     = ir.SymSrcHeads
	SymDstHeads     = ir.SymDstHeads
	SymSrcSlots     = ir.SymSrcSlots
	SymDstSlots     = ir.SymDstSlots
	SymCommonLayers = ir.SymCommonLayers
	SymCommonHeads  = ir.SymCommonHeads
	NumSyms         = ir.NumSyms
)

// Lower is ir.Lower.
func Lower(src, dst *Layout) (*Pair, error) { return ir.Lower(src, dst) }

// LowerIn is ir.LowerIn.
func LowerIn(src, dst *Layout, iter Side) (*Pair, error) { return ir.LowerIn(src, dst, iter) }

// Lit is ir.Lit.
func Lit(n int) Expr { return ir.Lit(n) }

// Of is ir.Of.
func Of(s Sym) Expr { return ir.Of(s) }

// ParseLayout is ir.ParseLayout: one layout from its order text, as a
// manifest stores it.
func ParseLayout(kind Kind, name, order string) (*Layout, error) {
	return ir.ParseLayout(kind, name, order)
}
