package gen

import (
	"fmt"
	"strings"

	"github.com/dave/jennifer/jen"

	"github.com/kvreshard/kvreshard/compiler/ir"
)

// kernel is the state of generating one kernel function.
type kernel struct {
	p     *ir.Nest
	live  []ir.Loop
	copy  bool
	perC  bool // the outermost loop walks components and sets D
	used  [ir.NumSyms]bool
	flags cond // the run-time conditions the kernel computes in its prologue
	move  bool // a strided copy moves its rows with kernel.Mover's func
	// applied names the rule that emitted each live loop, and the leaf.
	applied []string
	// tok is, in the twin for token lists, the live loop that walks them,
	// the outermost T loop; -1 in the kernel of every token.
	tok int
	// pageUsed marks, in the twin for token lists, the sides whose T
	// extent (pageVar) the kernel reads.
	pageUsed [2]bool
	run      ir.Expr // bytes of the statically folded innermost run
}

func (k *kernel) use(e ir.Expr) *jen.Statement {
	for _, f := range e.Factors {
		k.used[f.Sym] = true
	}
	return expr(e, func(s ir.Sym) string { return symVar[s] })
}

// useSide is use for an expression of side s (a stride, a block size):
// with token lists, T there is that side's T extent.
func (k *kernel) useSide(e ir.Expr, s int) *jen.Statement {
	if k.tok < 0 {
		return k.use(e)
	}
	for _, f := range e.Factors {
		if f.Sym == ir.SymPage {
			k.pageUsed[s] = true
		} else {
			k.used[f.Sym] = true
		}
	}
	return expr(e, func(y ir.Sym) string {
		if y == ir.SymPage {
			return pageVar[s]
		}
		return symVar[y]
	})
}

// passThrough reports whether live loop i generates no code of its own: a
// T loop inside the one that walks token pairs.
func (k *kernel) passThrough(i int) bool { return k.tokenLoop(i) && i != k.tok }

// innermost returns the innermost live loop that generates code.
func (k *kernel) innermost() int {
	n := len(k.live) - 1
	for n >= 0 && k.passThrough(n) {
		n--
	}
	return n
}

// next returns the first live loop inside loop i that generates code, or
// len(live).
func (k *kernel) next(i int) int {
	j := i + 1
	for j < len(k.live) && k.passThrough(j) {
		j++
	}
	return j
}

// aroundInnermost reports whether the loop inside loop i is the innermost
// and is over neither C nor token pairs, so that loop i can stride over it.
func (k *kernel) aroundInnermost(i int) bool {
	j := k.next(i)
	return j == k.innermost() && k.live[j].Mode.Axis != ir.C && !k.tokenLoop(j)
}

// tokenLoop reports whether live loop i walks token pairs, or walks once
// because the outermost T loop placed its digit: a T loop of the twin for
// token lists.
func (k *kernel) tokenLoop(i int) bool {
	return k.tok >= 0 && i < len(k.live) && k.live[i].Mode.Axis == ir.T
}

func sideName(s int) string { return [2]string{"s", "d"}[s] }

// kernelFuncs generates the range or the copy kernel of a pair from its
// loop nest, and its twin for token lists: the range kernel appends runs,
// the copy kernel copies them (its nest follows the destination; see
// ir.LowerIn).
func kernelFuncs(p *ir.Nest, name string, isCopy bool) [2]jen.Code {
	return [2]jen.Code{newKernel(p, isCopy, false).emit(name), newKernel(p, isCopy, true).emit(name)}
}

// newKernel returns the state of generating the kernel of p, or with
// tokens its twin for token lists. The twin's live loops run to the
// innermost T loop at least: every T loop places a digit of the token, so
// none folds, and its run is the loops inside the innermost that fold
// statically.
func newKernel(p *ir.Nest, isCopy, tokens bool) *kernel {
	k := &kernel{p: p, live: p.LiveLoops(), copy: isCopy, tok: -1, run: p.Run}
	if tokens {
		for i, lp := range p.Loops {
			if lp.Mode.Axis != ir.T {
				continue
			}
			if k.tok < 0 {
				k.tok = i
			}
			if i >= len(k.live) {
				k.live = p.Loops[:i+1]
			}
		}
		k.run = ir.Of(ir.SymItem)
		for _, lp := range p.Loops[len(k.live):] {
			k.run = k.run.Mul(lp.Extent)
		}
	}
	k.perC = len(k.live) > 0 && k.live[0].Mode.Axis == ir.C && (k.live[0].CBlock[0] || k.live[0].CBlock[1])
	k.used[ir.SymCommonLayers] = true
	k.used[ir.SymCommonHeads] = true
	return k
}

// names returns the kernel's function name, and that of its twin for
// token lists, for the pair suffix name.
func (k *kernel) names(name string) (self, twin string) {
	kind := map[bool]string{false: "range", true: "copy"}[k.copy]
	twin = "token" + strings.ToUpper(kind[:1]) + kind[1:] + "_" + name
	if k.tok >= 0 {
		return twin, twin
	}
	return kind + "_" + name, twin
}

// emit generates the kernel function.
func (k *kernel) emit(name string) jen.Code {
	p, isCopy := k.p, k.copy

	// Statements that depend on D come inside the component loop when there
	// is one, before the loops otherwise.
	setup := k.setup()
	var body []jen.Code
	if k.perC {
		k.apply(0, componentBlocks)
		body = []jen.Code{k.compLoop(setup)}
	} else {
		body = append(setup, k.loop(0, jen.Id("s0"), jen.Id("d0"), jen.Lit(0), jen.Lit(0))...)
	}

	// Prologue: the symbols the body uses, in a fixed order.
	var pro []jen.Code
	self, twin := k.names(name)
	empty := jen.Len(jen.Id("p").Dot("Layers")).Op("==").Lit(0).Op("||").Id("p").Dot("Heads").Op("==").Lit(0)
	if k.tok < 0 {
		// One test per call hands a token list to the twin.
		call := jen.Id(twin).Call(jen.Id("p"), jen.Id("runs"))
		hand := []jen.Code{jen.Return(call)}
		if isCopy {
			hand = []jen.Code{jen.Id(twin).Call(jen.Id("p"), jen.Id("dst"), jen.Id("src")), jen.Return()}
		}
		pro = append(pro, jen.If(jen.Id("p").Dot("Tokens").Op("!=").Nil()).Block(hand...))
	} else {
		empty = empty.Op("||").Len(jen.Id("p").Dot("Tokens")).Op("==").Lit(0)
	}
	pro = append(pro, jen.If(empty).Block(k.ret()...))
	for s := ir.Sym(0); s < ir.NumSyms; s++ {
		if !k.used[s] || (s == ir.SymDim && k.perC) {
			continue
		}
		pro = append(pro, jen.Id(symVar[s]).Op(":=").Add(symInit[s]))
	}
	for s, side := range []string{"Src", "Dst"} {
		// A side's T extent: its share of the page's tokens.
		if k.pageUsed[s] {
			pro = append(pro,
				jen.Id(pageVar[s]).Op(":=").Id("p").Dot(side).Dot("Tokens"),
				jen.If(jen.Id(pageVar[s]).Op("==").Lit(0)).Block(jen.Id(pageVar[s]).Op("=").Id("p").Dot("PageSize")))
		}
	}
	for _, c := range allConds {
		if k.flags&c != 0 {
			pro = append(pro, jen.Id(c.String()).Op(":=").Add(c.expr()))
		}
	}
	// Both kernels keep a pending run in locals and extend it while the
	// next run continues it on both sides; the range kernel starts from the
	// last run already in runs, so that it merges across calls as Emit does,
	// and writes runs by index into capacity it grew beforehand (an append
	// per run costs several times more).
	pro = append(pro, jen.Var().Defs(
		jen.Id("ps").Op(",").Id("pd").Op(",").Id("pl").Int(),
		jen.Id("psr").Op(",").Id("pdr").Int32(),
	))
	if k.move {
		// Copy2D, or Stream2D for a problem as large as copy() streams.
		pro = append(pro, jen.Id("move").Op(":=").Qual(KernelPkg, "Mover").Call(jen.Id("p")))
	}
	if !k.copy {
		pro = append(pro,
			jen.List(jen.Id("out"), jen.Id("nr")).Op(":=").List(jen.Id("runs").Index(jen.Op(":").Cap(jen.Id("runs"))), jen.Len(jen.Id("runs"))),
			jen.If(jen.Id("nr").Op(">").Lit(0)).Block(
				jen.Id("last").Op(":=").Id("out").Index(jen.Id("nr").Op("-").Lit(1)),
				jen.List(jen.Id("ps"), jen.Id("pd"), jen.Id("psr"), jen.Id("pdr"), jen.Id("pl")).Op("=").List(
					jen.Id("last").Dot("Src"), jen.Id("last").Dot("Dst"), jen.Id("last").Dot("SrcRegion"), jen.Id("last").Dot("DstRegion"), jen.Id("last").Dot("Len")),
				jen.Id("nr").Op("--"),
			))
	}
	body = append(body, k.flush())

	var sig *jen.Statement
	var comment *jen.Statement
	if k.tok < 0 {
		doc := fmt.Sprintf("%s moves %s %s to %s %s.", self, p.Src.Kind, p.Src.Name, p.Dst.Kind, p.Dst.Name)
		comment = jen.Comment(doc).Line().Comment("").Line()
		for _, line := range strings.Split(strings.TrimRight(p.String(), "\n"), "\n") {
			comment.Comment("\t" + line).Line()
		}
	} else {
		plain, _ := newKernel(p, isCopy, false).names(name)
		comment = jen.Comment(fmt.Sprintf("%s is %s with a token list", self, plain)).Line().
			Comment("(Problem.Tokens): it walks the token pairs at the outermost T loop and").Line().
			Comment("places each digit of a token on each side from that side's T extent.").Line()
	}
	if isCopy {
		sig = jen.Func().Id(self).Params(
			jen.Id("p").Op("*").Qual(KernelPkg, "Problem"),
			jen.Id("dst").Op(",").Id("src").Index().Index().Byte())
	} else {
		sig = jen.Func().Id(self).Params(
			jen.Id("p").Op("*").Qual(KernelPkg, "Problem"),
			jen.Id("runs").Index().Qual(KernelPkg, "Run")).Index().Qual(KernelPkg, "Run")
	}
	all := append(pro, body...)
	if k.move {
		// Stream2D's stores are ordered before the kernel returns.
		all = append(all, jen.Qual(KernelPkg, "Fence").Call())
	}
	if !k.copy {
		all = append(all, jen.Return(jen.Id("out").Index(jen.Op(":").Id("nr"))))
	}
	return comment.Add(sig.Block(all...))
}

// cond is a set of the run-time conditions a kernel may test, each a
// local bool its prologue computes.
type cond uint8

const (
	fullLayers  cond = 1 << iota // both sides hold exactly the common layers
	fullHeads                    // both sides hold exactly the common heads
	consecutive                  // the common layers are consecutive on both sides
)

// allConds lists the conditions in the order a prologue computes them.
var allConds = []cond{fullLayers, fullHeads, consecutive}

// String returns the name of the local that holds a single condition, or
// the Go conjunction of a set.
func (c cond) String() string {
	var names []string
	for i, n := range []string{"fullLayers", "fullHeads", "consecutive"} {
		if c&allConds[i] != 0 {
			names = append(names, n)
		}
	}
	return strings.Join(names, " && ")
}

// expr returns how a prologue computes a single condition.
func (c cond) expr() *jen.Statement {
	switch c {
	case fullLayers:
		return jen.Id("nL").Op("==").Id("Ls").Op("&&").Id("nL").Op("==").Id("Ld")
	case fullHeads:
		return jen.Id("nH").Op("==").Id("Hs").Op("&&").Id("nH").Op("==").Id("Hd")
	}
	return jen.Qual(KernelPkg, "ConsecutiveLayers").Call(jen.Id("p").Dot("Layers"))
}

// need marks the conditions c as computed by the prologue, with the symbols
// they read, and returns c.
func (k *kernel) need(c cond) cond {
	if c&fullLayers != 0 {
		k.used[ir.SymSrcLayers], k.used[ir.SymDstLayers] = true, true
	}
	if c&fullHeads != 0 {
		k.used[ir.SymSrcHeads], k.used[ir.SymDstHeads] = true, true
	}
	k.flags |= c
	return c
}

// conds returns the conditions of a run-time fold and marks them needed.
func (k *kernel) conds(f ir.Fold) cond {
	var c cond
	if f.FullLayers {
		c |= fullLayers
	}
	if f.FullHeads {
		c |= fullHeads
	}
	if f.Consecutive {
		c |= consecutive
	}
	return k.need(c)
}

func (k *kernel) ret() []jen.Code {
	if k.copy {
		return []jen.Code{jen.Return()}
	}
	return []jen.Code{jen.Return(jen.Id("runs"))}
}

// setup computes, from D and the other symbols, the strides and counts of
// the live loops, the run length with its run-time folds, and the offset of
// the statically folded loops.
func (k *kernel) setup() []jen.Code {
	p := k.p
	var st []jen.Code
	for i, lp := range k.live {
		for s := 0; s < 2; s++ {
			if m := lp.Mixed[s]; m != nil {
				if !m.Carry {
					st = append(st,
						jen.Id(fmt.Sprintf("%ss%dhi", sideName(s), i)).Op(":=").Add(k.useSide(m.Hi, s)),
						jen.Id(fmt.Sprintf("%ss%dlo", sideName(s), i)).Op(":=").Add(k.useSide(m.Lo, s)))
				}
				continue
			}
			if lp.CBlock[s] {
				continue
			}
			st = append(st, jen.Id(fmt.Sprintf("%ss%d", sideName(s), i)).Op(":=").Add(k.useSide(lp.Stride[s], s)))
		}
		if lp.Fold.Kind == ir.Runtime && !k.tokenLoop(i) {
			st = append(st, jen.Id(fmt.Sprintf("n%d", i)).Op(":=").Add(k.use(lp.Extent)))
		}
	}
	st = append(st, jen.Id("run").Op(":=").Add(k.use(k.run)))
	// Run-time folds: nested ifs from the innermost loop outwards, since
	// a loop folds only when every loop inside it has; a T loop that walks
	// token pairs never does.
	var folds []int
	for i := len(k.live) - 1; i >= 0 && k.live[i].Fold.Kind == ir.Runtime && !k.tokenLoop(i); i-- {
		folds = append(folds, i)
	}
	var nest jen.Code
	for j := len(folds) - 1; j >= 0; j-- {
		i := folds[j]
		n := fmt.Sprintf("n%d", i)
		blk := []jen.Code{jen.Id("run").Op("*=").Id(n), jen.Id(n).Op("=").Lit(1)}
		if nest != nil {
			blk = append(blk, nest)
		}
		// Conditions an enclosing if already checked are not repeated.
		var checked cond
		for _, o := range folds[:j] {
			checked |= k.conds(k.live[o].Fold)
		}
		conds := k.conds(k.live[i].Fold) &^ checked
		if conds == 0 {
			nest = jen.Block(blk...)
			continue
		}
		nest = jen.If(jen.Id(conds.String())).Block(blk...)
	}
	if nest != nil {
		st = append(st, nest)
	}
	// The statically folded loops start at index 0, except H, which starts
	// at the first common head.
	off := [2]*jen.Statement{jen.Lit(0), jen.Lit(0)}
	for _, lp := range p.Loops[len(k.live):] {
		if lp.Mode.Axis != ir.H {
			continue
		}
		off[0] = jen.Id("p").Dot("SrcHead").Op("*").Add(k.useSide(lp.Stride[0], 0))
		off[1] = jen.Id("p").Dot("DstHead").Op("*").Add(k.useSide(lp.Stride[1], 1))
	}
	if !k.copy {
		// Room for every run this setup's loops can emit, and the pending
		// run it may flush first.
		first := 0
		if k.perC {
			first = 1 // setup runs once per component, inside its loop
		}
		var prod *jen.Statement
		for i := first; i < len(k.live); i++ {
			var count *jen.Statement
			switch {
			case i == k.tok:
				count = jen.Len(jen.Id("p").Dot("Tokens"))
			case k.tokenLoop(i):
				continue // walks once
			case k.live[i].Fold.Kind == ir.Runtime:
				count = jen.Id(fmt.Sprintf("n%d", i))
			default:
				count = k.use(k.live[i].Extent)
			}
			if prod == nil {
				prod = count
			} else {
				prod = prod.Op("*").Add(count)
			}
		}
		if prod == nil {
			prod = jen.Lit(1)
		}
		st = append(st, jen.Id("out").Op("=").Qual(KernelPkg, "Grow").Call(jen.Id("out"), jen.Id("nr"), prod.Op("+").Lit(1)))
	}
	if k.perC {
		st = append(st, jen.Id("sf").Op(",").Id("df").Op(":=").Add(off[0]).Op(",").Add(off[1]))
	} else {
		st = append(st, jen.Id("s0").Op(",").Id("d0").Op(":=").Add(off[0]).Op(",").Add(off[1]))
		k.used[ir.SymDim] = true // D is the same for every component here
	}
	return st
}

// compLoop is the outermost loop over components, with D per component and
// each component's block offset or region on the sides whose outermost axis
// is C.
func (k *kernel) compLoop(setup []jen.Code) jen.Code {
	lp := k.live[0]
	var pre []jen.Code
	var body []jen.Code
	sideExpr := [2]*jen.Statement{}
	for s := 0; s < 2; s++ {
		n := sideName(s)
		base, reg := n+"Base", n+"Reg"
		if !lp.CBlock[s] {
			body = append(body, jen.Id(n+"c").Op(":=").Id("c").Op("*").Id(fmt.Sprintf("%ss0", n)))
			sideExpr[s] = jen.Id(n + "c")
			continue
		}
		side := [2]string{"Src", "Dst"}[s]
		pre = append(pre, jen.Id(base).Op(":=").Lit(0))
		body = append(body,
			jen.Var().Id(n+"c").Int(),
			jen.Var().Id(reg).Int32(),
			jen.If(jen.Id("p").Dot(side).Dot("Packed")).Block(
				jen.Id(n+"c").Op("=").Id(base),
				jen.Id(base).Op("+=").Add(k.useSide(k.p.CompSize[s], s)),
			).Else().Block(jen.Id(reg).Op("=").Int32().Call(jen.Id("c"))),
		)
		sideExpr[s] = jen.Id(n + "c")
	}
	regs := [2]*jen.Statement{jen.Lit(0), jen.Lit(0)}
	if lp.CBlock[0] {
		regs[0] = jen.Id("sReg")
	}
	if lp.CBlock[1] {
		regs[1] = jen.Id("dReg")
	}
	inner := append(append(append([]jen.Code{}, setup...), body...),
		k.loop(1, jen.Id("sf").Op("+").Add(sideExpr[0]), jen.Id("df").Op("+").Add(sideExpr[1]), regs[0], regs[1])...)
	return jen.Block(append(pre, jen.For(jen.List(jen.Id("c"), jen.Id("D")).Op(":=").Range().Id("p").Dot("Dims")).Block(inner...))...)
}
