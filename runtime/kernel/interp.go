package kernel

import (
	"github.com/kvreshard/kvreshard/compiler/ir"
)

// Interpreter runs a lowered pair straight from the IR. It is the oracle of
// the generated kernels and the fallback for layouts a binary did not
// compile. It produces exactly the runs of the generated range kernel.
type Interpreter struct {
	IR *ir.Nest
}

// Kernels returns interpreter-backed kernels for the pair.
func (in Interpreter) Kernels() *Kernels {
	return &Kernels{
		Pair:   Pair{Src: in.IR.Src.Identity(), Dst: in.IR.Dst.Identity()},
		Range:  in.Range,
		Copy:   in.Copy,
		Digest: in.IR.Digest(),
		Origin: "interpreter",
		Tokens: true,
	}
}

// walker is the state of one interpreted problem.
//
// With a token list (Problem.Tokens), every T loop is live and the
// outermost one walks the token pairs, placing each token on each side
// from that side's own T extent; the other T loops walk once. The runs are
// then those of the same nest with the T loops gathered at the outermost
// one's level: the same bytes, in another order when a layout puts other
// axes between its T digits.
type walker struct {
	ir    *ir.Nest
	p     *Problem
	loops []ir.Loop
	tok   int // with a token list: the level that walks it; -1 without
	// per component: loop counts, strides per loop and side, run bytes,
	// component offset and region per side
	comps []compTables
	emit  func(Run)
	idx   []int // the index of each loop being walked
}

type compTables struct {
	counts  []int
	strides [][2]int
	mixed   [][2][2]int // per loop and side with a Mixed: its Hi and Lo strides
	run     int
	fold    [2]int // offset of the statically folded loops' first index
	off     [2]int
	region  [2]int32
	tokOff  [2][]int // with a token list: each pair's offset per side
}

// tokenDigit returns the digit of token t that mode m is.
func tokenDigit(m ir.Mode, t int) int {
	switch m.Split {
	case ir.Outer:
		return t / m.Factor
	case ir.Inner:
		return t % m.Factor
	case ir.Middle:
		return t % m.Factor / m.Unit
	}
	return t
}

// tokenUnit returns the tokens one step of mode m covers.
func tokenUnit(m ir.Mode) int {
	switch m.Split {
	case ir.Outer:
		return m.Factor
	case ir.Middle:
		return m.Unit
	}
	return 1
}

func newWalker(pr *ir.Nest, p *Problem, emit func(Run)) *walker {
	w := &walker{ir: pr, p: p, loops: pr.LiveLoops(), emit: emit, tok: -1}
	tokens := p.Tokens != nil
	if tokens {
		// Every T loop is live: the static fold stops inside the innermost.
		for i, lp := range pr.Loops {
			if lp.Mode.Axis == ir.T {
				if i >= len(w.loops) {
					w.loops = pr.Loops[:i+1]
				}
				if w.tok < 0 {
					w.tok = i
				}
			}
		}
	}
	w.idx = make([]int, len(w.loops))
	var env ir.Env
	env[ir.SymItem] = p.ItemSize
	env[ir.SymPage] = p.PageSize
	env[ir.SymComps] = len(p.Dims)
	env[ir.SymSrcLayers] = p.Src.Layers
	env[ir.SymDstLayers] = p.Dst.Layers
	env[ir.SymSrcHeads] = p.Src.Heads
	env[ir.SymDstHeads] = p.Dst.Heads
	env[ir.SymSrcSlots] = p.Src.Slots
	env[ir.SymDstSlots] = p.Dst.Slots
	env[ir.SymCommonLayers] = len(p.Layers)
	env[ir.SymCommonHeads] = p.Heads
	fullLayers := len(p.Layers) == p.Src.Layers && len(p.Layers) == p.Dst.Layers
	fullHeads := p.Heads == p.Src.Heads && p.Heads == p.Dst.Heads
	consecutive := ConsecutiveLayers(p.Layers)
	sides := [2]Buffer{p.Src, p.Dst}
	// Each side's strides follow its own T extent; they differ only with a
	// token list.
	var envs [2]ir.Env
	for s := range 2 {
		envs[s] = env
		if tokens && sides[s].Tokens > 0 {
			envs[s][ir.SymPage] = sides[s].Tokens
		}
	}
	var packedBase [2]int
	w.comps = make([]compTables, len(p.Dims))
	for c, dim := range p.Dims {
		env[ir.SymDim] = dim
		envs[0][ir.SymDim], envs[1][ir.SymDim] = dim, dim
		t := &w.comps[c]
		if tokens {
			// The run is the statically folded loops inside the last T loop.
			t.run = p.ItemSize
			for _, lp := range pr.Loops[len(w.loops):] {
				t.run *= lp.Extent.Eval(&env)
			}
		} else {
			t.run = pr.Run.Eval(&env)
		}
		t.counts = make([]int, len(w.loops))
		t.strides = make([][2]int, len(w.loops))
		t.mixed = make([][2][2]int, len(w.loops))
		for i, lp := range w.loops {
			t.counts[i] = lp.Extent.Eval(&env)
			for s := range 2 {
				switch {
				case lp.Mixed[s] != nil:
					t.mixed[i][s] = [2]int{lp.Mixed[s].Hi.Eval(&envs[s]), lp.Mixed[s].Lo.Eval(&envs[s])}
				case !lp.CBlock[s]:
					t.strides[i][s] = lp.Stride[s].Eval(&envs[s])
				}
			}
		}
		if tokens {
			t.tokOff = tokenOffsets(w.loops, t, p.Tokens)
		}
		// A statically folded loop starts at index 0, except H, which starts
		// at the first common head.
		for _, lp := range pr.Loops[len(w.loops):] {
			if lp.Mode.Axis == ir.H {
				t.fold[0] += p.SrcHead * lp.Stride[0].Eval(&envs[0])
				t.fold[1] += p.DstHead * lp.Stride[1].Eval(&envs[1])
			}
		}
		folding := true
		for i := len(w.loops) - 1; i >= 0 && folding; i-- {
			f := w.loops[i].Fold
			folding = f.Kind == ir.Runtime && !(tokens && w.loops[i].Mode.Axis == ir.T) &&
				(!f.FullLayers || fullLayers) && (!f.FullHeads || fullHeads) && (!f.Consecutive || consecutive)
			if folding {
				t.run *= t.counts[i]
				t.counts[i] = 1
			}
		}
		for s := range 2 {
			l := w.ir.Src
			if s == 1 {
				l = w.ir.Dst
			}
			if !l.COuter() {
				continue
			}
			if sides[s].Packed {
				t.off[s] = packedBase[s]
				packedBase[s] += pr.CompSize[s].Eval(&envs[s])
			} else {
				t.region[s] = int32(c)
			}
		}
	}
	return w
}

// tokenOffsets returns, per side, the offset of each token pair: the sum
// over the T loops of the token's digit times that side's stride, or, for
// a loop the side places through a Mixed, its digits y = t/g placed as
// (y/Div)*Hi + (y%Div)*Lo (a carry loop adds nothing there).
func tokenOffsets(loops []ir.Loop, t *compTables, pairs []TokenPair) [2][]int {
	var out [2][]int
	for s := range 2 {
		out[s] = make([]int, len(pairs))
		for i, lp := range loops {
			if lp.Mode.Axis != ir.T {
				continue
			}
			m := lp.Mixed[s]
			for k, pr := range pairs {
				tok := int(pr.Src)
				if s == 1 {
					tok = int(pr.Dst)
				}
				switch {
				case m == nil:
					out[s][k] += tokenDigit(lp.Mode, tok) * t.strides[i][s]
				case !m.Carry:
					y := tok / tokenUnit(lp.Mode)
					out[s][k] += y/m.Div*t.mixed[i][s][0] + y%m.Div*t.mixed[i][s][1]
				}
			}
		}
	}
	return out
}

func (w *walker) walk(level, c, so, do int, sr, dr int32) {
	if level == len(w.loops) {
		t := &w.comps[c]
		w.emit(Run{SrcRegion: sr, DstRegion: dr, Src: so + t.fold[0], Dst: do + t.fold[1], Len: t.run})
		return
	}
	lp := &w.loops[level]
	t := &w.comps[c]
	if w.tok >= 0 && lp.Mode.Axis == ir.T {
		if level != w.tok {
			w.walk(level+1, c, so, do, sr, dr) // placed by the first T loop
			return
		}
		for k := range w.p.Tokens {
			w.walk(level+1, c, so+t.tokOff[0][k], do+t.tokOff[1][k], sr, dr)
		}
		return
	}
	n := t.counts[level]
	st := t.strides[level]
	for i := 0; i < n; i++ {
		w.idx[level] = i
		if lp.IsMixed() {
			var off [2]int
			for s := range 2 {
				off[s] = i * st[s]
				if m := lp.Mixed[s]; m != nil {
					off[s] = 0
					if !m.Carry {
						y := w.idx[m.Outer]*m.Radix + i
						off[s] = y/m.Div*t.mixed[level][s][0] + y%m.Div*t.mixed[level][s][1]
					}
				}
			}
			w.walk(level+1, c, so+off[0], do+off[1], sr, dr)
			continue
		}
		switch lp.Mode.Axis {
		case ir.C:
			ct := &w.comps[i]
			s, d, r0, r1 := so+i*st[0], do+i*st[1], sr, dr
			if lp.CBlock[0] {
				s, r0 = so+ct.off[0], ct.region[0]
			}
			if lp.CBlock[1] {
				d, r1 = do+ct.off[1], ct.region[1]
			}
			w.walk(level+1, i, s, d, r0, r1)
		case ir.L:
			lpair := w.p.Layers[i]
			w.walk(level+1, c, so+int(lpair.Src)*st[0], do+int(lpair.Dst)*st[1], sr, dr)
		case ir.H:
			w.walk(level+1, c, so+(w.p.SrcHead+i)*st[0], do+(w.p.DstHead+i)*st[1], sr, dr)
		default:
			w.walk(level+1, c, so+i*st[0], do+i*st[1], sr, dr)
		}
	}
}

// start runs the walk over the live loops.
func (w *walker) start() {
	if len(w.p.Layers) == 0 || w.p.Heads == 0 || len(w.p.Dims) == 0 || w.p.Tokens != nil && len(w.p.Tokens) == 0 {
		return
	}
	w.walk(0, 0, 0, 0, 0, 0)
}

// Range appends the runs of p, merged as the generated kernels merge them.
func (in Interpreter) Range(p *Problem, runs []Run) []Run {
	newWalker(in.IR, p, func(r Run) { runs = Emit(runs, r) }).start()
	return runs
}

// Copy moves the bytes of p between local buffers.
func (in Interpreter) Copy(p *Problem, dst, src [][]byte) {
	newWalker(in.IR, p, func(r Run) {
		copy(dst[r.DstRegion][r.Dst:r.Dst+r.Len], src[r.SrcRegion][r.Src:r.Src+r.Len])
	}).start()
}
