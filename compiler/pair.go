package compiler

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
)

// Side indexes the two sides of a pair.
type Side uint8

const (
	Src Side = iota
	Dst
)

func (s Side) String() string {
	if s == Dst {
		return "dst"
	}
	return "src"
}

// FoldKind says how a loop joins the run inside it.
type FoldKind uint8

const (
	// Never: the loop stays a loop; runs of its iterations may still merge
	// at emission when they happen to continue each other on both sides.
	Never FoldKind = iota
	// Static: the loop is always contiguous with the run inside it on both
	// sides; it is part of the innermost run and generates no loop.
	Static
	// Runtime: the loop folds into the run when the conditions in its Fold
	// hold for the problem at hand.
	Runtime
)

// Fold describes whether and when a loop folds into the run inside it.
type Fold struct {
	Kind FoldKind
	// Conditions of a Runtime fold.
	FullLayers  bool // both sides hold exactly the common layers
	FullHeads   bool // both sides hold exactly the common heads
	Consecutive bool // the common layers are consecutive on both sides
}

func (f Fold) String() string {
	switch f.Kind {
	case Static:
		return "fold"
	case Runtime:
		var c []string
		if f.FullLayers {
			c = append(c, "nL==Ls==Ld")
		}
		if f.FullHeads {
			c = append(c, "nH==Hs==Hd")
		}
		if f.Consecutive {
			c = append(c, "layers consecutive")
		}
		return "fold if " + strings.Join(c, " && ")
	}
	return "loop"
}

// Loop is one level of a pair's loop nest.
type Loop struct {
	Mode   Mode
	Extent Expr // iterations: common layers and heads, or the full axis
	// Stride on each side. A side whose outermost axis is C has no C stride:
	// there each component starts a block (CBlock).
	Stride [2]Expr
	CBlock [2]bool
	Fold   Fold
}

// Pair is the lowered plan for moving the common elements of a source
// layout to a destination layout.
type Pair struct {
	Src, Dst *Layout
	Iter     Side   // whose order the loops follow (see Lower and LowerIn)
	Loops    []Loop // outermost first; statically folded loops are last
	Run      Expr   // bytes of the statically folded innermost run
	// CompSize is the bytes of one component block on each side whose
	// outermost axis is C (a part packs its blocks: K region then V region).
	CompSize [2]Expr
	// SlotStride is the S stride of each side that is a pool, 0 otherwise.
	SlotStride [2]Expr
}

// Key is the runtime identity of the pair.
func (p *Pair) Key() string { return p.Src.Identity() + " -> " + p.Dst.Identity() }

// Digest identifies the lowered pair; generated kernels carry it so that a
// conflicting registration can be told from a repeated one.
func (p *Pair) Digest() string {
	body := p.String()
	body = body[strings.IndexByte(body, '\n')+1:] // without the names
	h := sha256.Sum256([]byte(p.Key() + "\n" + body))
	return hex.EncodeToString(h[:8])
}

// LiveLoops returns the loops that generate code: all but the statically
// folded ones.
func (p *Pair) LiveLoops() []Loop {
	n := len(p.Loops)
	for n > 0 && p.Loops[n-1].Fold.Kind == Static {
		n--
	}
	return p.Loops[:n]
}

func (p *Pair) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pair %s -> %s: %s, loops follow the %s\n", p.Src.Name, p.Dst.Name, p.Key(), p.Iter)
	for s := Src; s <= Dst; s++ {
		l := p.side(s)
		if l.COuter() {
			fmt.Fprintf(&b, "  %s C block: %s\n", s, p.CompSize[s])
		}
		if l.Kind == Pool {
			fmt.Fprintf(&b, "  %s S stride: %s\n", s, p.SlotStride[s])
		}
	}
	for _, lp := range p.Loops {
		fmt.Fprintf(&b, "  %-4s x %-5s src %-12s dst %-12s %s\n", lp.Mode, lp.Extent,
			strideString(lp, Src), strideString(lp, Dst), lp.Fold)
	}
	fmt.Fprintf(&b, "  run %s\n", p.Run)
	return b.String()
}

func strideString(lp Loop, s Side) string {
	if lp.CBlock[s] {
		return "block"
	}
	return lp.Stride[s].String()
}

func (p *Pair) side(s Side) *Layout {
	if s == Dst {
		return p.Dst
	}
	return p.Src
}

// refine returns l's modes, excluding nothing, with each whole axis that the
// other layout splits replaced by its two halves.
func refine(l, other *Layout) []Mode {
	var out []Mode
	for _, m := range l.Modes {
		if f := other.SplitOf(m.Axis); m.Split == Whole && f > 0 {
			out = append(out, Mode{m.Axis, Outer, f}, Mode{m.Axis, Inner, f})
			continue
		}
		out = append(out, m)
	}
	return out
}

// full returns the extent of mode m on side s.
func full(m Mode, s Side) Expr {
	switch m.Axis {
	case C:
		return Of(SymComps)
	case S:
		return Of(SymSrcSlots + Sym(s))
	case L:
		return Of(SymSrcLayers + Sym(s))
	case H:
		return Of(SymSrcHeads + Sym(s))
	}
	base := SymPage
	if m.Axis == D {
		base = SymDim
	}
	switch m.Split {
	case Outer:
		return Expr{Const: 1, Factors: []Factor{{Sym: base, Div: m.Factor}}}
	case Inner:
		return Lit(m.Factor)
	}
	return Of(base)
}

// common returns the loop extent of mode m: the common layers or heads, or
// the full axis.
func common(m Mode) Expr {
	switch m.Axis {
	case L:
		return Of(SymCommonLayers)
	case H:
		return Of(SymCommonHeads)
	}
	return full(m, Src)
}

// product returns I times the extents on side s of the modes in ms. A split
// axis whose two halves are both present contributes the whole axis.
func product(ms []Mode, s Side) Expr {
	e := Of(SymItem)
	for _, m := range ms {
		if m.Split == Outer && slices.Contains(ms, Mode{m.Axis, Inner, m.Factor}) {
			e = e.Mul(full(Mode{Axis: m.Axis}, s))
			continue
		}
		if m.Split == Inner && slices.Contains(ms, Mode{m.Axis, Outer, m.Factor}) {
			continue
		}
		e = e.Mul(full(m, s))
	}
	return e
}

// Lower builds the loop nest of a pair, following the part side: the runs
// of a range kernel come in the part's order, so that a read's runs of one
// part are in source order and a write's fill its part front to back. At
// least one side must be a part.
func Lower(src, dst *Layout) (*Pair, error) {
	iter := Src
	if src.Kind == Pool {
		iter = Dst
	}
	return LowerIn(src, dst, iter)
}

// LowerIn builds the loop nest of a pair following the order of side iter.
// Copy kernels follow the destination (Dst), whatever its kind: their
// writes then go front to back, so a copy into a pool that spills the
// caches streams, where following a part scattered its rows (the rows of
// PLHD into page_head land 512 KiB apart) at half the speed.
func LowerIn(src, dst *Layout, iter Side) (*Pair, error) {
	if src.Kind == Pool && dst.Kind == Pool {
		return nil, fmt.Errorf("no kernel from pool %s to pool %s: one side of a transfer is a store part", src.Name, dst.Name)
	}
	for _, a := range []Axis{T, D} {
		if fs, fd := src.SplitOf(a), dst.SplitOf(a); fs > 0 && fd > 0 && fs != fd {
			return nil, fmt.Errorf("layouts %s and %s split %s by different factors (%d and %d); no kernel joins them",
				src.Name, dst.Name, a, fs, fd)
		}
	}
	p := &Pair{Src: src, Dst: dst, Iter: iter}
	modes := [2][]Mode{refine(src, dst), refine(dst, src)}
	for s := Src; s <= Dst; s++ {
		ms := modes[s]
		if p.side(s).COuter() {
			p.CompSize[s] = product(ms[1:], s)
		}
		if i := slices.Index(ms, Mode{Axis: S}); i >= 0 {
			p.SlotStride[s] = product(ms[i+1:], s)
		}
	}
	for _, m := range modes[p.Iter] {
		if m.Axis == S {
			continue // the slot is fixed: runs are relative to slot 0
		}
		lp := Loop{Mode: m, Extent: common(m)}
		for s := Src; s <= Dst; s++ {
			ms := modes[s]
			i := slices.Index(ms, m)
			if m.Axis == C && i == 0 {
				lp.CBlock[s] = true
				continue
			}
			lp.Stride[s] = product(ms[i+1:], s)
		}
		p.Loops = append(p.Loops, lp)
	}
	p.fold()
	return p, nil
}

// fold marks, from the innermost loop outwards, the loops that join the run
// inside them: a loop folds when, on both sides, its stride equals the bytes
// of the run, that is when the modes inside it are exactly the run's.
func (p *Pair) fold() {
	var run []Mode
	var needLayers, needHeads bool
	p.Run = Of(SymItem)
	static := true
	for i := len(p.Loops) - 1; i >= 0; i-- {
		lp := &p.Loops[i]
		if lp.CBlock[Src] || lp.CBlock[Dst] {
			return
		}
		for s := Src; s <= Dst; s++ {
			if !lp.Stride[s].Equal(product(run, s)) {
				return
			}
		}
		f := Fold{Kind: Static, FullLayers: needLayers, FullHeads: needHeads, Consecutive: lp.Mode.Axis == L}
		if f.FullLayers || f.FullHeads || f.Consecutive {
			f.Kind = Runtime
			static = false
		}
		if static {
			p.Run = p.Run.Mul(lp.Extent)
		}
		lp.Fold = f
		run = append(run, lp.Mode)
		needLayers = needLayers || lp.Mode.Axis == L
		needHeads = needHeads || lp.Mode.Axis == H
	}
}
