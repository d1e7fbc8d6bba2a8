package ir

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
	// Mixed, on a side that splits the loop's axis by a factor that does
	// not nest with the other side's (T/4 against T/6), replaces Stride:
	// that side's offset is not affine in the loop's index.
	Mixed [2]*Mixed
	Fold  Fold
}

// Mixed places, on one side, the index of a split axis that the loops
// follow in the other side's split. With the loops' side splitting X by a
// and this side by b, g the greatest common divisor of a and b, and the
// X%g part common to both, the two loops X/a and X%a/g (X%a when g is 1)
// count y = x/g; this side places y as (y/(b/g))*Hi + (y%(b/g))*Lo.
type Mixed struct {
	// Carry marks the loop X/a: it adds nothing to this side's offset; its
	// index carries into the loop that does (Outer).
	Carry bool
	// Outer is the index, in the pair's loops, of the X/a loop whose index
	// combines with this one's.
	Outer int
	Radix int  // a/g: the iterations of this loop per iteration of Outer
	Div   int  // b/g
	Hi    Expr // this side's stride of X/b
	Lo    Expr // this side's stride of X%b/g (X%b when g is 1)
}

func (m *Mixed) String() string {
	if m.Carry {
		return "carry"
	}
	return fmt.Sprintf("y/%d:%s,y%%%d:%s", m.Div, m.Hi, m.Div, m.Lo)
}

// IsMixed reports whether either side places the loop's index through a
// Mixed: such a loop never folds, and kernels walk it one iteration at a
// time.
func (lp *Loop) IsMixed() bool { return lp.Mixed[0] != nil || lp.Mixed[1] != nil }

// Nest is the loop nest of a pair of layouts: the lowered plan for moving
// the common elements of a source layout to a destination layout.
type Nest struct {
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
func (p *Nest) Key() string { return p.Src.Identity() + " -> " + p.Dst.Identity() }

// Digest identifies the lowered pair; generated kernels carry it so that a
// conflicting registration can be told from a repeated one.
func (p *Nest) Digest() string {
	body := p.String()
	body = body[strings.IndexByte(body, '\n')+1:] // without the names
	h := sha256.Sum256([]byte(p.Key() + "\n" + body))
	return hex.EncodeToString(h[:8])
}

// LiveLoops returns the loops that generate code: all but the statically
// folded ones.
func (p *Nest) LiveLoops() []Loop {
	n := len(p.Loops)
	for n > 0 && p.Loops[n-1].Fold.Kind == Static {
		n--
	}
	return p.Loops[:n]
}

func (p *Nest) String() string {
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
	if lp.Mixed[s] != nil {
		return lp.Mixed[s].String()
	}
	if lp.CBlock[s] {
		return "block"
	}
	return lp.Stride[s].String()
}

func (p *Nest) side(s Side) *Layout {
	if s == Dst {
		return p.Dst
	}
	return p.Src
}

// refine returns l's modes with every mode of a split axis (T or D)
// replaced by its digits in the common refinement of l's and other's cuts of
// that axis. When the two factors nest (one divides the other), the cuts
// form a chain and both sides get the same digits: T/2 T%2 against T/4 T%4
// refines to T/4, T%4/2 and T%2. When they do not (4 and 6), only the
// digit X%g of their greatest common divisor g is common: X%a becomes
// X%a/g and X%g, and X/a stays, for the other side to place through a
// Mixed. A whole axis takes the other side's digits.
func refine(l, other *Layout) []Mode {
	var out []Mode
	for _, m := range l.Modes {
		if m.Axis != T && m.Axis != D {
			out = append(out, m)
			continue
		}
		fa, fb := l.SplitOf(m.Axis), other.SplitOf(m.Axis)
		var cuts []int // ascending, each dividing the next
		switch {
		case fa == 0 && fb == 0:
		case fa == 0 || fa == fb:
			cuts = []int{max(fa, fb)}
		case fb == 0:
			cuts = []int{fa}
		case fb%fa == 0:
			cuts = []int{fa, fb}
		case fa%fb == 0:
			cuts = []int{fb, fa}
		default:
			g := gcd(fa, fb)
			if m.Split == Inner && g > 1 {
				out = append(out, digit(m.Axis, fa, g), digit(m.Axis, g, 1))
				continue
			}
			out = append(out, m)
			continue
		}
		out = append(out, digits(m, cuts)...)
	}
	return out
}

// digits returns the digits of the chain of cuts that mode m covers,
// outermost first.
func digits(m Mode, cuts []int) []Mode {
	hi, lo := m.bounds()
	var out []Mode
	// The digits of the chain, outermost first: X/c_n, X%c_n/c_(n-1), ...,
	// X%c_1.
	prev := 0
	for i := len(cuts); i >= 0; i-- {
		dlo := 1
		if i > 0 {
			dlo = cuts[i-1]
		}
		dhi := prev
		prev = dlo
		if dlo >= lo && (hi == 0 || dhi != 0 && dhi <= hi) {
			out = append(out, digit(m.Axis, dhi, dlo))
		}
	}
	return out
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
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
	hi, lo := m.bounds()
	return span(base, hi, lo)
}

// span returns the extent of the digits (x%hi)/lo of an axis of extent
// base: base/lo without a modulus, else the constant hi/lo.
func span(base Sym, hi, lo int) Expr {
	switch {
	case hi > 0:
		return Lit(hi / lo)
	case lo > 1:
		return Expr{Const: 1, Factors: []Factor{{Sym: base, Div: lo}}}
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

// product returns I times the extents on side s of the modes in ms. The
// digits of a split axis that continue each other count as one span, so
// that all of them contribute the whole axis (T, not T/4*4): strides that
// are equal have equal expressions.
func product(ms []Mode, s Side) Expr {
	e := Of(SymItem)
	var spans [2][][2]int // per split axis: (hi, lo) of its digits
	for _, m := range ms {
		switch m.Axis {
		case T:
			hi, lo := m.bounds()
			spans[0] = append(spans[0], [2]int{hi, lo})
		case D:
			hi, lo := m.bounds()
			spans[1] = append(spans[1], [2]int{hi, lo})
		default:
			e = e.Mul(full(m, s))
		}
	}
	for i, ds := range spans {
		base := []Sym{SymPage, SymDim}[i]
		// Outermost digit first: the larger lo.
		slices.SortFunc(ds, func(a, b [2]int) int { return b[1] - a[1] })
		for j := 0; j < len(ds); {
			hi, lo := ds[j][0], ds[j][1]
			for j++; j < len(ds) && ds[j][0] == lo; j++ {
				lo = ds[j][1]
			}
			e = e.Mul(span(base, hi, lo))
		}
	}
	return e
}

// Lower builds the loop nest of a pair, following the part side: the runs
// of a range kernel come in the part's order, so that a read's runs of one
// part are in source order and a write's fill its part front to back. At
// least one side must be a part.
func Lower(src, dst *Layout) (*Nest, error) {
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
func LowerIn(src, dst *Layout, iter Side) (*Nest, error) {
	if src.Kind == Pool && dst.Kind == Pool {
		return nil, fmt.Errorf("no kernel from pool %s to pool %s: one side of a transfer is a store part", src.Name, dst.Name)
	}
	p := &Nest{Src: src, Dst: dst, Iter: iter}
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
			switch {
			case i < 0:
				lp.Mixed[s] = p.mixed(m, s, ms)
			case m.Axis == C && i == 0:
				lp.CBlock[s] = true
			default:
				lp.Stride[s] = product(ms[i+1:], s)
			}
		}
		p.Loops = append(p.Loops, lp)
	}
	p.fold()
	return p, nil
}

// mixed returns how side s, whose refined modes are ms, places loop mode m
// of the other side, a digit it does not have: the two split m's axis by
// factors that do not nest (see refine and Mixed).
func (p *Nest) mixed(m Mode, s Side, ms []Mode) *Mixed {
	a, b := p.side(p.Iter).SplitOf(m.Axis), p.side(s).SplitOf(m.Axis)
	if m.Split == Outer {
		return &Mixed{Carry: true}
	}
	g := gcd(a, b)
	outer := slices.IndexFunc(p.Loops, func(lp Loop) bool { return lp.Mode == Mode{Axis: m.Axis, Split: Outer, Factor: a} })
	hi := slices.Index(ms, Mode{Axis: m.Axis, Split: Outer, Factor: b})
	lo := slices.Index(ms, digit(m.Axis, b, g))
	return &Mixed{Outer: outer, Radix: a / g, Div: b / g, Hi: product(ms[hi+1:], s), Lo: product(ms[lo+1:], s)}
}

// fold marks, from the innermost loop outwards, the loops that join the run
// inside them: a loop folds when, on both sides, its stride equals the bytes
// of the run, that is when the modes inside it are exactly the run's.
func (p *Nest) fold() {
	var run []Mode
	var needLayers, needHeads bool
	p.Run = Of(SymItem)
	static := true
	for i := len(p.Loops) - 1; i >= 0; i-- {
		lp := &p.Loops[i]
		if lp.CBlock[Src] || lp.CBlock[Dst] || lp.IsMixed() {
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
