package gen

import (
	"fmt"

	"github.com/dave/jennifer/jen"

	"github.com/kvreshard/kvreshard/compiler/ir"
)

// rule is one case of the generator: a shape of a loop of a pair's nest
// (its axis, how each side places it, its place in the nest, range or copy
// kernel) and the code it emits for that loop and everything inside it.
// The first rule of rules that matches a loop emits it, the way Go's SSA
// rule generator takes the first rule that matches an op.
type rule struct {
	name  string
	match func(k *kernel, i int) bool
	emit  func(k *kernel, i int, count, s, d, sr, dr *jen.Statement) []jen.Code
}

// rules is the ordered table of the generator's cases for live loop i of a
// kernel (i == len(live) is the run inside the innermost loop). The outer
// loop over components, when a side has a block per component, is the
// rule componentBlocks, applied before these.
var rules []rule

// The table is filled in init: its rules refer to the emitters, which
// refer back to it for the loops inside theirs.
func init() {
	rules = []rule{
		// Inside the innermost loop: extend the pending run or flush it.
		{"leaf", func(k *kernel, i int) bool { return i == len(k.live) },
			func(k *kernel, i int, _, s, d, sr, dr *jen.Statement) []jen.Code { return k.leaf(s, d, sr, dr) }},
		// The outermost T loop of the twin for token lists: a loop over the
		// token pairs, which places every T digit of each token on each side.
		{"tokens", func(k *kernel, i int) bool { return k.tok >= 0 && i == k.tok }, (*kernel).tokenPairs},
		// Another T loop of the twin for token lists: the loop over the token
		// pairs placed its digit; it walks once.
		{"token-digit", func(k *kernel, i int) bool { return k.tokenLoop(i) },
			func(k *kernel, i int, _, s, d, sr, dr *jen.Statement) []jen.Code { return k.loop(i+1, s, d, sr, dr) }},
		// A loop over C inside other loops: every component has the same D;
		// a side with a block per component steps by block or region.
		{"components", func(k *kernel, i int) bool { return k.live[i].Mode.Axis == ir.C },
			(*kernel).forLoop},
		// A loop whose index a side places through a Mixed has no stride on
		// that side: it is walked one iteration at a time, and so is the loop
		// around it, which would stride over it.
		{"mixed", func(k *kernel, i int) bool {
			return k.live[i].IsMixed() || k.next(i) == k.innermost() && k.live[k.next(i)].IsMixed()
		}, (*kernel).forLoop},
		// The two innermost loops of a copy kernel: one row mover call for all
		// their rows when the outer steps over the inner's rows on both sides.
		{"copy-rows", func(k *kernel, i int) bool {
			return k.copy && k.aroundInnermost(i)
		}, (*kernel).collapse},
		// The innermost loop: its runs have one stride on each side, written
		// (range) or moved (copy) in one call; a layer loop only when the
		// common layers are consecutive.
		{"strided", func(k *kernel, i int) bool { return i == k.innermost() }, (*kernel).strided},
		// The loop around an innermost loop not over C nor over token pairs:
		// strided over the inner loop's first iteration when the inner loop
		// has one iteration.
		{"strided-outer", func(k *kernel, i int) bool {
			return k.aroundInnermost(i)
		}, (*kernel).strided},
		// Any other loop: a for loop over its iterations.
		{"loop", func(k *kernel, i int) bool { return true }, (*kernel).forLoop}}
}

// componentBlocks names the rule of the outermost loop over components
// when a side has a block per component (see compLoop).
const componentBlocks = "component-blocks"

// Rules returns the names of the generator's rules, in the order they are
// tried, after component-blocks, which applies to an outermost C loop.
func Rules() []string {
	names := []string{componentBlocks}
	for _, r := range rules {
		names = append(names, r.name)
	}
	return names
}

// RulesFor returns the rule that emits each live loop of p, and the leaf,
// in the range kernel or, with isCopy, the copy kernel (whose nest follows
// the destination: pass ir.LowerIn(src, dst, ir.Dst)); with tokens, in
// their twin for token lists, whose live loops run to the innermost T loop.
func RulesFor(p *ir.Nest, isCopy, tokens bool) []string {
	k := newKernel(p, isCopy, tokens)
	k.emit("x")
	return k.applied
}

// loop generates live loop i and everything inside it, starting at offsets
// s and d in regions sr and dr, by the first rule that matches it.
func (k *kernel) loop(i int, s, d, sr, dr *jen.Statement) []jen.Code {
	var count *jen.Statement
	if i < len(k.live) && !k.tokenLoop(i) {
		count = k.use(k.live[i].Extent)
		if k.live[i].Fold.Kind == ir.Runtime {
			count = jen.Id(fmt.Sprintf("n%d", i))
		}
	}
	for _, r := range rules {
		if r.match(k, i) {
			k.apply(i, r.name)
			return r.emit(k, i, count, s, d, sr, dr)
		}
	}
	panic("gen: no rule matches") // the last rule matches every loop
}

// apply records that rule name emits live loop i (the leaf when i is
// len(live)); only the first rule applied to a loop counts, since a rule
// may emit a loop again as its fallback.
func (k *kernel) apply(i int, name string) {
	for len(k.applied) <= i {
		k.applied = append(k.applied, "")
	}
	if k.applied[i] == "" {
		k.applied[i] = name
	}
}

// collapse generates the two innermost loops of a copy kernel, i and the
// innermost j, as one strided loop when loop i steps exactly over the rows
// of loop j on both sides (its stride is j's count times j's stride: all
// layers of a layer loop, say), so that Copy2D moves all their rows in one
// call and not a short row list per iteration of i; otherwise as strided
// does.
func (k *kernel) collapse(i int, count, s, d, sr, dr *jen.Statement) []jen.Code {
	j := k.next(i)
	in := k.live[j]
	inCount := k.use(in.Extent)
	if in.Fold.Kind == ir.Runtime {
		inCount = jen.Id(fmt.Sprintf("n%d", j))
	}
	ss, ds := jen.Id(fmt.Sprintf("ss%d", i)), jen.Id(fmt.Sprintf("ds%d", i))
	iss, ids := jen.Id(fmt.Sprintf("ss%d", j)), jen.Id(fmt.Sprintf("ds%d", j))
	when := ss.Clone().Op("==").Add(inCount.Clone()).Op("*").Add(iss.Clone()).Op("&&").
		Add(ds.Clone()).Op("==").Add(inCount.Clone()).Op("*").Add(ids.Clone())
	if k.live[i].Mode.Axis == ir.L || in.Mode.Axis == ir.L {
		k.need(consecutive)
		when = jen.Id("consecutive").Op("&&").Add(when)
	}
	s1, d1 := k.firstOffset(i, s, d)
	var first [2]*jen.Statement
	first[0], first[1] = k.firstOffset(j, s1, d1)
	sv, dv := jen.Id(fmt.Sprintf("s%d", i+2)), jen.Id(fmt.Sprintf("d%d", i+2))
	rows := k.stridedCopy(iss, ids, sv, dv, first, jen.Id("cnt"), count.Clone().Op("*").Add(inCount.Clone()), sr, dr)
	return []jen.Code{jen.If(when).Block(rows...).Else().Block(k.strided(i, count, s, d, sr, dr)...)}
}

// strided generates live loop i, not over C, and everything inside it.
func (k *kernel) strided(i int, count, s, d, sr, dr *jen.Statement) []jen.Code {
	lp := k.live[i]
	// The runs of the innermost loop have one stride on each side: range
	// kernels write them, and copy kernels move them, in one call
	// (stridedLoop). Layers consecutive on both sides are one stride apart
	// too. When the innermost loop has a single iteration (one common head,
	// say), the loop around it is the one to stride.
	var strided func() []jen.Code
	var when *jen.Statement
	switch {
	case i == k.innermost():
		strided = func() []jen.Code { return k.stridedLoop(i, count, s, d, sr, dr) }
	case k.aroundInnermost(i):
		j := k.next(i)
		in := k.live[j]
		inCount := k.use(in.Extent)
		if in.Fold.Kind == ir.Runtime {
			inCount = jen.Id(fmt.Sprintf("n%d", j))
		}
		when = inCount.Op("==").Lit(1)
		if in.Mode.Axis == ir.L {
			when = jen.Id("consecutive").Op("&&").Add(when)
			k.need(consecutive)
		}
		strided = func() []jen.Code {
			s1, d1 := k.firstOffset(j, s, d)
			return k.stridedLoop(i, count, s1, d1, sr, dr)
		}
	default:
		panic("gen: strided applied to a loop neither innermost nor around it")
	}
	if lp.Mode.Axis == ir.L {
		k.need(consecutive)
		if when == nil {
			when = jen.Id("consecutive")
		} else {
			when = jen.Id("consecutive").Op("&&").Add(when)
		}
	}
	if when == nil {
		return strided()
	}
	return []jen.Code{jen.If(when).Block(strided()...).Else().Block(k.forLoop(i, count, s, d, sr, dr)...)}
}

// firstOffset returns the offsets of the first iteration of live loop i
// from s and d: its first common head or layer, or index 0.
func (k *kernel) firstOffset(i int, s, d *jen.Statement) (*jen.Statement, *jen.Statement) {
	ss, ds := jen.Id(fmt.Sprintf("ss%d", i)), jen.Id(fmt.Sprintf("ds%d", i))
	switch k.live[i].Mode.Axis {
	case ir.H:
		return s.Clone().Op("+").Id("p").Dot("SrcHead").Op("*").Add(ss), d.Clone().Op("+").Id("p").Dot("DstHead").Op("*").Add(ds)
	case ir.L:
		return s.Clone().Op("+").Int().Call(jen.Id("p").Dot("Layers").Index(jen.Lit(0)).Dot("Src")).Op("*").Add(ss),
			d.Clone().Op("+").Int().Call(jen.Id("p").Dot("Layers").Index(jen.Lit(0)).Dot("Dst")).Op("*").Add(ds)
	}
	return s.Clone(), d.Clone()
}

// tokenPairs generates live loop i, the outermost T loop of the twin for
// token lists, as a loop over the token pairs: each side's offset of a
// token is the sum over the T loops of its digit in that loop's mode times
// that side's stride, or, on a side that places the loop through a Mixed,
// y = t/g placed as (y/Div)*Hi + (y%Div)*Lo (a carry loop adds nothing).
func (k *kernel) tokenPairs(i int, _, s, d, sr, dr *jen.Statement) []jen.Code {
	tv := [2]string{"ts", "td"}
	offs := [2]*jen.Statement{s.Clone(), d.Clone()}
	pre := []jen.Code{jen.List(jen.Id(tv[0]), jen.Id(tv[1])).Op(":=").List(
		jen.Int().Call(jen.Id("tp").Dot("Src")), jen.Int().Call(jen.Id("tp").Dot("Dst")))}
	for j := i; j < len(k.live); j++ {
		lp := k.live[j]
		if lp.Mode.Axis != ir.T {
			continue
		}
		for s2 := 0; s2 < 2; s2++ {
			n := sideName(s2)
			m := lp.Mixed[s2]
			switch {
			case m == nil:
				offs[s2] = offs[s2].Op("+").Add(tokenDigit(lp.Mode, tv[s2])).Op("*").Id(fmt.Sprintf("%ss%d", n, j))
			case !m.Carry:
				y := fmt.Sprintf("y%s%d", n, j)
				var yv *jen.Statement
				switch lp.Mode.Split {
				case ir.Middle:
					yv = jen.Id(tv[s2]).Op("/").Lit(lp.Mode.Unit)
				case ir.Outer:
					yv = jen.Id(tv[s2]).Op("/").Lit(lp.Mode.Factor)
				default:
					yv = jen.Id(tv[s2])
				}
				pre = append(pre, jen.Id(y).Op(":=").Add(yv))
				offs[s2] = offs[s2].Op("+").Parens(jen.Id(y).Op("/").Lit(m.Div)).Op("*").Id(fmt.Sprintf("%ss%dhi", n, j)).
					Op("+").Parens(jen.Id(y).Op("%").Lit(m.Div)).Op("*").Id(fmt.Sprintf("%ss%dlo", n, j))
			}
		}
	}
	sv, dv := fmt.Sprintf("s%d", i+1), fmt.Sprintf("d%d", i+1)
	body := append(pre, jen.Id(sv).Op(":=").Add(offs[0]), jen.Id(dv).Op(":=").Add(offs[1]))
	body = append(body, k.loop(i+1, jen.Id(sv), jen.Id(dv), sr, dr)...)
	return []jen.Code{jen.For(jen.List(jen.Id("_"), jen.Id("tp")).Op(":=").Range().Id("p").Dot("Tokens")).Block(body...)}
}

// tokenDigit returns the digit of token t (a local) that mode m of the T
// axis is.
func tokenDigit(m ir.Mode, t string) *jen.Statement {
	switch m.Split {
	case ir.Outer:
		return jen.Parens(jen.Id(t).Op("/").Lit(m.Factor))
	case ir.Inner:
		return jen.Parens(jen.Id(t).Op("%").Lit(m.Factor))
	case ir.Middle:
		return jen.Parens(jen.Id(t).Op("%").Lit(m.Factor).Op("/").Lit(m.Unit))
	}
	return jen.Id(t)
}

// forLoop generates live loop i as a for loop over its iterations.
func (k *kernel) forLoop(i int, count, s, d, sr, dr *jen.Statement) []jen.Code {
	lp := k.live[i]
	iv := fmt.Sprintf("i%d", i)
	sv, dv := fmt.Sprintf("s%d", i+1), fmt.Sprintf("d%d", i+1)
	var idx [2]*jen.Statement
	var pre []jen.Code
	switch lp.Mode.Axis {
	case ir.L:
		pre = append(pre, jen.Id("lp").Op(":=").Id("p").Dot("Layers").Index(jen.Id(iv)))
		idx[0] = jen.Int().Call(jen.Id("lp").Dot("Src"))
		idx[1] = jen.Int().Call(jen.Id("lp").Dot("Dst"))
	case ir.H:
		idx[0] = jen.Parens(jen.Id("p").Dot("SrcHead").Op("+").Id(iv))
		idx[1] = jen.Parens(jen.Id("p").Dot("DstHead").Op("+").Id(iv))
	default:
		idx[0], idx[1] = jen.Id(iv), jen.Id(iv)
	}
	var regs [2]*jen.Statement
	regs[0], regs[1] = sr, dr
	if lp.Mode.Axis == ir.C && (lp.CBlock[0] || lp.CBlock[1]) {
		// C is inside other loops here: every component has the same D.
		for s2 := 0; s2 < 2; s2++ {
			if !lp.CBlock[s2] {
				continue
			}
			side := [2]string{"Src", "Dst"}[s2]
			n := sideName(s2)
			// Packed blocks are all CompSize apart; unpacked ones are regions.
			pre = append(pre,
				jen.Id(n+"b").Op(",").Id(n+"r").Op(":=").Id(iv).Op("*").Add(k.useSide(k.p.CompSize[s2], s2)).Op(",").Int32().Call(jen.Lit(0)),
				jen.If(jen.Op("!").Id("p").Dot(side).Dot("Packed")).Block(
					jen.Id(n+"b").Op(",").Id(n+"r").Op("=").Lit(0).Op(",").Int32().Call(jen.Id(iv))),
			)
			idx[s2] = nil
			regs[s2] = jen.Id(n + "r")
		}
	}
	var offs []jen.Code
	for s2, base := range []*jen.Statement{s, d} {
		v := []string{sv, dv}[s2]
		var e *jen.Statement
		m := lp.Mixed[s2]
		switch {
		case m != nil && m.Carry:
			e = base.Clone() // the inner loop of the axis places this index
		case m != nil:
			// y counts the blocks of the digit both sides share, across
			// this loop and the outer one of the same axis.
			y := fmt.Sprintf("y%d", i)
			pre = append(pre, jen.Id(y).Op(":=").Id(fmt.Sprintf("i%d", m.Outer)).Op("*").Lit(m.Radix).Op("+").Id(iv))
			e = base.Clone().Op("+").Parens(jen.Id(y).Op("/").Lit(m.Div)).Op("*").Id(fmt.Sprintf("%ss%dhi", sideName(s2), i)).
				Op("+").Parens(jen.Id(y).Op("%").Lit(m.Div)).Op("*").Id(fmt.Sprintf("%ss%dlo", sideName(s2), i))
		case idx[s2] == nil:
			e = base.Clone().Op("+").Id(sideName(s2) + "b")
		default:
			e = base.Clone().Op("+").Add(idx[s2]).Op("*").Id(fmt.Sprintf("%ss%d", sideName(s2), i))
		}
		offs = append(offs, jen.Id(v).Op(":=").Add(e))
	}
	body := append(append(pre, offs...), k.loop(i+1, jen.Id(sv), jen.Id(dv), regs[0], regs[1])...)
	return []jen.Code{jen.For(jen.Id(iv).Op(":=").Lit(0), jen.Id(iv).Op("<").Add(count), jen.Id(iv).Op("++")).Block(body...)}
}

// stridedLoop is the innermost loop when it has one stride on each side.
// In a range kernel its first run may continue the pending run; if the
// strides equal the run, every run continues the one before; otherwise no
// two of its runs touch, so the ones between the first and the last are
// written in one call with nothing to merge, and the last becomes pending.
func (k *kernel) stridedLoop(i int, count, s, d, sr, dr *jen.Statement) []jen.Code {
	ss, ds := jen.Id(fmt.Sprintf("ss%d", i)), jen.Id(fmt.Sprintf("ds%d", i))
	var first [2]*jen.Statement
	first[0], first[1] = k.firstOffset(i, s, d)
	sv, dv := jen.Id(fmt.Sprintf("s%d", i+1)), jen.Id(fmt.Sprintf("d%d", i+1))
	cnt := jen.Id("cnt")
	if k.copy {
		return k.stridedCopy(ss, ds, sv, dv, first, cnt, count, sr, dr)
	}
	return []jen.Code{jen.If(cnt.Clone().Op(":=").Add(count), cnt.Clone().Op(">").Lit(0)).Block(
		sv.Clone().Op(",").Add(dv.Clone()).Op(":=").Add(first[0]).Op(",").Add(first[1]),
		jen.If(jen.Id("pl").Op(">").Lit(0).Op("&&").Id("ps").Op("+").Id("pl").Op("==").Add(sv.Clone()).Op("&&").
			Id("pd").Op("+").Id("pl").Op("==").Add(dv.Clone()).Op("&&").Id("psr").Op("==").Add(sr).Op("&&").Id("pdr").Op("==").Add(dr)).Block(
			jen.Id("pl").Op("+=").Id("run"),
		).Else().Block(
			k.flush(),
			jen.List(jen.Id("ps"), jen.Id("pd"), jen.Id("psr"), jen.Id("pdr"), jen.Id("pl")).Op("=").List(sv.Clone(), dv.Clone(), sr, dr, jen.Id("run")),
		),
		jen.If(cnt.Clone().Op(">").Lit(1)).Block(
			jen.If(ss.Clone().Op("==").Id("run").Op("&&").Add(ds.Clone()).Op("==").Id("run")).Block(
				jen.Id("pl").Op("+=").Parens(cnt.Clone().Op("-").Lit(1)).Op("*").Id("run"),
			).Else().Block(
				k.flush(),
				jen.Id("nr").Op("=").Qual(KernelPkg, "EmitStrided").Call(jen.Id("out"), jen.Id("nr"),
					sv.Clone().Op("+").Add(ss.Clone()), dv.Clone().Op("+").Add(ds.Clone()), ss.Clone(), ds.Clone(),
					cnt.Clone().Op("-").Lit(2), jen.Id("run"), sr, dr),
				jen.List(jen.Id("ps"), jen.Id("pd"), jen.Id("psr"), jen.Id("pdr"), jen.Id("pl")).Op("=").List(
					sv.Clone().Op("+").Parens(cnt.Clone().Op("-").Lit(1)).Op("*").Add(ss.Clone()),
					dv.Clone().Op("+").Parens(cnt.Clone().Op("-").Lit(1)).Op("*").Add(ds.Clone()), sr, dr, jen.Id("run")),
			),
		),
	)}
}

// stridedCopy is stridedLoop in a copy kernel. A copy need not merge runs to
// be right, only to be fast, so when the runs do not continue each other
// they all go to kernel.Copy2D in one call, and only a loop of contiguous
// runs (or of one) joins the pending run.
func (k *kernel) stridedCopy(ss, ds, sv, dv *jen.Statement, first [2]*jen.Statement, cnt, count, sr, dr *jen.Statement) []jen.Code {
	k.move = true
	return []jen.Code{jen.If(cnt.Clone().Op(":=").Add(count), cnt.Clone().Op(">").Lit(0)).Block(
		sv.Clone().Op(",").Add(dv.Clone()).Op(":=").Add(first[0]).Op(",").Add(first[1]),
		jen.If(cnt.Clone().Op("==").Lit(1).Op("||").Add(ss.Clone()).Op("==").Id("run").Op("&&").Add(ds.Clone()).Op("==").Id("run")).Block(
			jen.Id("n").Op(":=").Add(cnt.Clone()).Op("*").Id("run"),
			jen.If(jen.Id("pl").Op(">").Lit(0).Op("&&").Id("ps").Op("+").Id("pl").Op("==").Add(sv.Clone()).Op("&&").
				Id("pd").Op("+").Id("pl").Op("==").Add(dv.Clone()).Op("&&").Id("psr").Op("==").Add(sr).Op("&&").Id("pdr").Op("==").Add(dr)).Block(
				jen.Id("pl").Op("+=").Id("n"),
			).Else().Block(
				k.flush(),
				jen.List(jen.Id("ps"), jen.Id("pd"), jen.Id("psr"), jen.Id("pdr"), jen.Id("pl")).Op("=").List(sv.Clone(), dv.Clone(), sr, dr, jen.Id("n")),
			),
		).Else().Block(
			k.flush(),
			jen.Id("pl").Op("=").Lit(0),
			jen.Id("move").Call(
				jen.Id("dst").Index(dr).Index(dv.Clone().Op(":")), ds.Clone(),
				jen.Id("src").Index(sr).Index(sv.Clone().Op(":")), ss.Clone(), jen.Id("run"), cnt.Clone()),
		),
	)}
}

// leaf extends the pending run with one run, or flushes the pending run (the
// range kernel appends it, the copy kernel copies it) and starts a new one.
func (k *kernel) leaf(s, d, sr, dr *jen.Statement) []jen.Code {
	return []jen.Code{
		jen.If(jen.Id("pl").Op(">").Lit(0).Op("&&").Id("ps").Op("+").Id("pl").Op("==").Add(s).Op("&&").
			Id("pd").Op("+").Id("pl").Op("==").Add(d).Op("&&").Id("psr").Op("==").Add(sr).Op("&&").Id("pdr").Op("==").Add(dr)).Block(
			jen.Id("pl").Op("+=").Id("run"),
			jen.Continue(),
		),
		k.flush(),
		jen.List(jen.Id("ps"), jen.Id("pd"), jen.Id("psr"), jen.Id("pdr"), jen.Id("pl")).Op("=").List(s, d, sr, dr, jen.Id("run")),
	}
}

func (k *kernel) flush() jen.Code {
	if !k.copy {
		// Field by field, for the reason kernel.EmitStrided gives.
		return jen.If(jen.Id("pl").Op(">").Lit(0)).Block(
			jen.Id("r").Op(":=").Op("&").Id("out").Index(jen.Id("nr")),
			jen.List(jen.Id("r").Dot("SrcRegion"), jen.Id("r").Dot("DstRegion"), jen.Id("r").Dot("Src"), jen.Id("r").Dot("Dst"), jen.Id("r").Dot("Len")).Op("=").
				List(jen.Id("psr"), jen.Id("pdr"), jen.Id("ps"), jen.Id("pd"), jen.Id("pl")),
			jen.Id("nr").Op("++"),
		)
	}
	return jen.If(jen.Id("pl").Op(">").Lit(0)).Block(
		jen.Copy(
			jen.Id("dst").Index(jen.Id("pdr")).Index(jen.Id("pd").Op(":").Id("pd").Op("+").Id("pl")),
			jen.Id("src").Index(jen.Id("psr")).Index(jen.Id("ps").Op(":").Id("ps").Op("+").Id("pl")),
		),
	)
}
