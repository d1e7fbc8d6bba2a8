package plan_test

import (
	"cmp"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler"
	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/internal/content"
	_ "github.com/kvreshard/kvreshard/layouts"
	"github.com/kvreshard/kvreshard/runtime/kernel"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/testkit/kerneltest"
)

var (
	partNames = []string{"PLHD", "LPHD", "HPLD"}
	poolNames = []string{"page_first", "page_first_direct", "layer_first", "page_head"}
)

// builtin returns a built-in layout.
func builtin(t testing.TB, name string) *ir.Layout {
	t.Helper()
	l, err := kernel.LayoutNamed(name)
	require.NoError(t, err)
	return l
}

// desc returns a descriptor with layers 0..layers-1.
func desc(layers, heads int, dims []int, dtype string, page int) manifest.Descriptor {
	d := manifest.Descriptor{KVHeads: heads, HeadDims: dims, Dtype: dtype, PageSize: page}
	d.ItemSize, _ = manifest.ItemSizeOf(dtype)
	for i := range layers {
		d.Layers = append(d.Layers, i)
	}
	return d
}

// scenario is one page written by a topology in a part layout and read by
// one rank of another topology into its binding.
type scenario struct {
	d     manifest.Descriptor
	src   placement.Topology
	srcL  *ir.Layout
	dst   placement.Topology
	rank  placement.Rank
	dstL  *ir.Layout
	slots int // pool pages; 0 means 1
	slot  int
	opts  plan.Options
}

func (s *scenario) String() string {
	return fmt.Sprintf("layers %v heads %d dims %v %s page %d; src tp%d pp%d %v cp%d/%d %s; dst tp%d pp%d %v cp%d/%d rank %d/%d/%d %s slot %d of %d",
		s.d.Layers, s.d.KVHeads, s.d.HeadDims, s.d.Dtype, s.d.PageSize,
		s.src.TP, s.src.PP, s.src.PPLayers, s.src.CP, s.src.Interleave, s.srcL.Name,
		s.dst.TP, s.dst.PP, s.dst.PPLayers, s.dst.CP, s.dst.Interleave, s.rank.TP, s.rank.PP, s.rank.CP, s.dstL.Name, s.slot, max(s.slots, 1))
}

// build returns the manifest of the page and the reader's planner.
func (s *scenario) build(t testing.TB) (*manifest.Manifest, *plan.Planner) {
	t.Helper()
	model := manifest.Model{Namespace: "test", ModelID: "scenario", Descriptor: s.d}
	m, err := plan.ManifestFor(model.Domain(), &s.d, s.src, s.srcL)
	require.NoError(t, err, s.String())
	b, err := plan.BindingFor(&s.d, s.dst, s.rank, s.dstL, max(s.slots, 1))
	require.NoError(t, err, s.String())
	p, err := plan.NewPlanner(&s.d, b, s.opts)
	require.NoError(t, err, s.String())
	return m, p
}

// check plans the scenario's page, moves its bytes and verifies every
// element; compares the plan's byte mapping with the element-level mapping
// of the independent layout model; and checks that the op count is the
// number of maximal runs contiguous on both sides.
func (s *scenario) check(t *testing.T) (*manifest.Manifest, *plan.Planner, *plan.Plan) {
	t.Helper()
	m, p := s.build(t)
	tpl, err := p.Template(m)
	require.NoError(t, err, s.String())
	checkPlan(t, s.String(), m, p, tpl, s.slot)
	return m, p, tpl
}

func checkPlan(t *testing.T, name string, m *manifest.Manifest, p *plan.Planner, tpl *plan.Plan, slot int) {
	t.Helper()
	g := p.Geometry()
	require.Equal(t, m.ID(), tpl.ManifestID, name)
	require.Equal(t, g.PageBytes, tpl.Bytes, name)
	seed := content.Seed("page/" + name)
	parts := fillParts(t, m, seed)
	regions := g.NewRegions()
	apply(p, tpl, slot, parts, regions)
	require.NoError(t, content.Verify(g, regions, slot, seed), name)

	want := elementMap(t, m, g, slot)
	got := expand(p, tpl, slot, m.Descriptor.ItemSize)
	require.Equal(t, len(want), len(got), name)
	require.True(t, slices.Equal(want, got), "%s: the plan's byte mapping differs from the layout model's", name)
	require.Equal(t, maximalRuns(want, m.Descriptor.ItemSize), len(tpl.Ops), "%s: op count", name)
}

// elem is one element moved: from offset src of part to offset dst of region.
type elem struct{ part, src, region, dst int }

func compareElem(a, b elem) int {
	if c := cmp.Compare(a.part, b.part); c != 0 {
		return c
	}
	return cmp.Compare(a.src, b.src)
}

// elementMap places, one element at a time with the independent layout
// model, every element the binding needs from every part of m that holds
// it, for the page at slot. The result is sorted by part and source offset.
func elementMap(t testing.TB, m *manifest.Manifest, g *plan.Geometry, slot int) []elem {
	t.Helper()
	src, err := plan.Layout(m)
	require.NoError(t, err)
	d := &m.Descriptor
	kg := kerneltest.Shape{ItemSize: d.ItemSize, PageSize: d.PageSize, Dims: d.HeadDims}
	dst := &kerneltest.Buffer{Layout: g.Layout, Layers: g.Layers, HeadStart: g.HeadStart, Heads: g.Heads, Slots: g.Slots, Slot: slot,
		CP: g.Tokens.CPSize, CPRank: g.Tokens.CPRank, Interleave: g.Tokens.Interleave}
	var out []elem
	for i, p := range m.Parts {
		sb := &kerneltest.Buffer{Layout: src, Layers: p.Layers, HeadStart: p.HeadStart, Heads: p.HeadCount, Slots: 1, Packed: true,
			CP: p.CPSize, CPRank: p.CPRank, Interleave: p.Interleave}
		h0, h1 := max(p.HeadStart, g.HeadStart), min(p.HeadStart+p.HeadCount, g.HeadStart+g.Heads)
		for c, dim := range d.HeadDims {
			for si, layer := range p.Layers {
				di := slices.Index(g.Layers, layer)
				if di < 0 {
					continue
				}
				for h := h0; h < h1; h++ {
					for tok := range d.PageSize {
						st, ok1 := sb.Local(d.PageSize, tok)
						dt, ok2 := dst.Local(d.PageSize, tok)
						if !ok1 || !ok2 {
							continue
						}
						for e := range dim {
							_, so := kg.Offset(sb, c, si, h-p.HeadStart, st, e)
							r, do := kg.Offset(dst, c, di, h-g.HeadStart, dt, e)
							out = append(out, elem{i, so, r, do})
						}
					}
				}
			}
		}
	}
	slices.SortFunc(out, compareElem)
	return out
}

// expand lists the elements a plan placed at slot moves, sorted by part and
// source offset.
func expand(p *plan.Planner, tpl *plan.Plan, slot, item int) []elem {
	var out []elem
	for _, op := range p.Instantiate(tpl, slot, nil) {
		for k := 0; k < op.Len; k += item {
			out = append(out, elem{int(op.Part), op.Src + k, int(op.Region), op.Dst + k})
		}
	}
	slices.SortFunc(out, compareElem)
	return out
}

// maximalRuns counts the maximal runs of a sorted element mapping that are
// contiguous on both sides: the fewest ops any plan of it can have.
func maximalRuns(es []elem, item int) int {
	n := 0
	for i, e := range es {
		if i > 0 {
			p := es[i-1]
			if p.part == e.part && p.src+item == e.src && p.region == e.region && p.dst+item == e.dst {
				continue
			}
		}
		n++
	}
	return n
}

// TestPartToPart plans every pair of built-in part layouts, the reader's
// destination being one page in a part layout: a rank of another topology,
// and a single rank that reassembles the whole page.
func TestPartToPart(t *testing.T) {
	d := desc(6, 4, []int{8, 8}, "bf16", 4)
	for _, src := range partNames {
		for _, dst := range partNames {
			for _, rd := range []struct {
				top  placement.Topology
				rank placement.Rank
			}{
				{placement.Topology{TP: 4, PP: 3}, placement.Rank{TP: 1, PP: 2}},
				{placement.Topology{TP: 2, PP: 1}, placement.Rank{TP: 1, PP: 0}},
				{placement.Topology{TP: 1, PP: 1}, placement.Rank{}},
			} {
				s := scenario{d: d, src: placement.Topology{TP: 2, PP: 2}, srcL: builtin(t, src),
					dst: rd.top, rank: rd.rank, dstL: builtin(t, dst), opts: plan.Options{RequireCompiled: true}}
				t.Run(fmt.Sprintf("%s-%s/tp%dpp%d", src, dst, rd.top.TP, rd.top.PP), func(t *testing.T) {
					_, p, tpl := s.check(t)
					require.False(t, tpl.Interpreted)
					require.Equal(t, []string{"k", "v"}, p.Geometry().RegionNames)
				})
			}
		}
	}
}

// TestPartToPool plans every built-in part layout into every built-in pool
// layout, at slot 0 of a one-page pool and at a non-zero slot of a pool of
// several pages.
func TestPartToPool(t *testing.T) {
	d := desc(5, 4, []int{8, 8}, "fp16", 4)
	for _, src := range partNames {
		for _, dst := range poolNames {
			for _, at := range []struct{ slots, slot int }{{1, 0}, {3, 2}, {4, 1}} {
				s := scenario{d: d, src: placement.Topology{TP: 2, PP: 2}, srcL: builtin(t, src),
					dst: placement.Topology{TP: 4, PP: 2}, rank: placement.Rank{TP: 2, PP: 1}, dstL: builtin(t, dst),
					slots: at.slots, slot: at.slot, opts: plan.Options{RequireCompiled: true}}
				t.Run(fmt.Sprintf("%s-%s/slot%dof%d", src, dst, at.slot, at.slots), func(t *testing.T) {
					_, p, tpl := s.check(t)
					require.False(t, tpl.Interpreted)
					require.Equal(t, []string{"k", "v"}, p.Geometry().RegionNames)
				})
			}
		}
	}
}

// TestTP1PP3ToTP2PP2 reads what TP 1 x PP 3 wrote at every rank of TP 2 x
// PP 2, and back.
func TestTP1PP3ToTP2PP2(t *testing.T) {
	d := desc(12, 4, []int{8, 8}, "fp32", 16)
	a, b := placement.Topology{TP: 1, PP: 3}, placement.Topology{TP: 2, PP: 2}
	for _, dir := range []struct {
		name     string
		src, dst placement.Topology
	}{{"forward", a, b}, {"back", b, a}} {
		for _, l := range []struct{ src, dst string }{{"PLHD", "page_first"}, {"HPLD", "LPHD"}, {"LPHD", "page_head"}} {
			for _, r := range dir.dst.Ranks() {
				s := scenario{d: d, src: dir.src, srcL: builtin(t, l.src), dst: dir.dst, rank: r, dstL: builtin(t, l.dst), slots: 2, slot: 1}
				t.Run(fmt.Sprintf("%s/%s-%s/rank%d.%d", dir.name, l.src, l.dst, r.TP, r.PP), func(t *testing.T) {
					m, _, tpl := s.check(t)
					require.Len(t, m.Parts, dir.src.TP*dir.src.PP)
					// Every part holding some of the rank's layers and heads is read.
					want := map[int32]bool{}
					sh, err := dir.dst.Share(&d, r)
					require.NoError(t, err)
					for _, layer := range sh.Layers {
						for h := sh.HeadStart; h < sh.HeadStart+sh.HeadCount; h++ {
							want[int32(m.PartOf(layer, h))] = true
						}
					}
					got := map[int32]bool{}
					for _, op := range tpl.Ops {
						got[op.Part] = true
					}
					require.Equal(t, want, got)
				})
			}
		}
	}
}

// TestUnevenPP reads pages written with uneven PP layer splits by readers
// with other uneven splits, every rank, both ways.
func TestUnevenPP(t *testing.T) {
	d := desc(12, 4, []int{8, 8}, "bf16", 4)
	tops := []placement.Topology{
		{TP: 2, PP: 3, PPLayers: []int{5, 4, 3}},
		{TP: 1, PP: 2, PPLayers: []int{3, 9}},
		{TP: 4, PP: 4, PPLayers: []int{1, 2, 4, 5}},
		{TP: 2, PP: 5}, // even split with a remainder: 3, 3, 2, 2, 2
	}
	sh, err := tops[3].Share(&d, placement.Rank{TP: 0, PP: 1})
	require.NoError(t, err)
	require.Equal(t, []int{3, 4, 5}, sh.Layers)
	sh, err = tops[0].Share(&d, placement.Rank{TP: 1, PP: 1})
	require.NoError(t, err)
	require.Equal(t, []int{5, 6, 7, 8}, sh.Layers)
	for i, src := range tops {
		for j, dst := range tops {
			if i == j {
				continue
			}
			for _, r := range dst.Ranks() {
				s := scenario{d: d, src: src, srcL: builtin(t, partNames[(i+j)%3]), dst: dst, rank: r,
					dstL: builtin(t, poolNames[(i+2*j)%4]), slots: 3, slot: (i + j) % 3}
				t.Run(fmt.Sprintf("%d-%d/rank%d.%d", i, j, r.TP, r.PP), func(t *testing.T) { s.check(t) })
			}
		}
	}
}

// TestKVDimsDiffer plans pages whose K and V head dims differ, from every
// part layout into every layout.
func TestKVDimsDiffer(t *testing.T) {
	d := desc(4, 2, []int{24, 8}, "fp32", 4)
	for _, src := range partNames {
		for _, dst := range append(append([]string{}, partNames...), poolNames...) {
			s := scenario{d: d, src: placement.Topology{TP: 2, PP: 2, PPLayers: []int{3, 1}}, srcL: builtin(t, src),
				dst: placement.Topology{TP: 1, PP: 2}, rank: placement.Rank{PP: 1}, dstL: builtin(t, dst), slots: 2, slot: 1}
			t.Run(src+"-"+dst, func(t *testing.T) {
				_, p, _ := s.check(t)
				g := p.Geometry()
				// Layers 2 and 3, heads 0 and 1, 4 tokens: K is three times V.
				require.Equal(t, 2*2*4*24*4+2*2*4*8*4, g.PageBytes)
			})
		}
	}
}

// TestTP3FromTP2 reads at TP 3 what TP 2 wrote: 6 KV heads, so ranks 1 of
// TP 3 need heads 2 and 3, which lie in two parts.
func TestTP3FromTP2(t *testing.T) {
	d := desc(4, 6, []int{8, 8}, "bf16", 4)
	for _, l := range []struct{ src, dst string }{{"PLHD", "page_first"}, {"HPLD", "page_head"}, {"LPHD", "HPLD"}} {
		for _, dst := range []placement.Topology{{TP: 3, PP: 1}, {TP: 3, PP: 2}} {
			for _, r := range dst.Ranks() {
				s := scenario{d: d, src: placement.Topology{TP: 2, PP: 2}, srcL: builtin(t, l.src),
					dst: dst, rank: r, dstL: builtin(t, l.dst), slots: 2, slot: 1}
				t.Run(fmt.Sprintf("%s-%s/pp%d/rank%d.%d", l.src, l.dst, dst.PP, r.TP, r.PP), func(t *testing.T) {
					m, _, tpl := s.check(t)
					parts := map[int32]bool{}
					for _, op := range tpl.Ops {
						parts[op.Part] = true
					}
					// Heads [2r, 2r+2) lie in one part of 3 heads, except
					// rank 1's heads 2 and 3; PP 1 readers span both stages.
					want := 1
					if r.TP == 1 {
						want = 2
					}
					if dst.PP == 1 {
						want *= 2
					}
					require.Len(t, parts, want)
					require.Len(t, m.Parts, 4)
				})
			}
		}
	}
}

// TestReplicatedHeads reads 8 KV heads at TP 16, where each head is on two
// ranks, and reads pages written at TP 16, whose manifest holds each part
// once.
func TestReplicatedHeads(t *testing.T) {
	d := desc(4, 8, []int{16, 16}, "bf16", 4)
	tp16 := placement.Topology{TP: 16, PP: 2}
	t.Run("read", func(t *testing.T) {
		for _, r := range (placement.Topology{TP: 16, PP: 1}).Ranks() {
			s := scenario{d: d, src: placement.Topology{TP: 2, PP: 1}, srcL: builtin(t, "PLHD"),
				dst: placement.Topology{TP: 16, PP: 1}, rank: r, dstL: builtin(t, "page_first"), slots: 2, slot: 1}
			t.Run(fmt.Sprintf("rank%d", r.TP), func(t *testing.T) {
				_, p, tpl := s.check(t)
				g := p.Geometry()
				require.Equal(t, r.TP/2, g.HeadStart)
				require.Equal(t, 1, g.Heads)
				for _, op := range tpl.Ops {
					require.Equal(t, int32(r.TP/8), op.Part)
				}
			})
		}
	})
	t.Run("written", func(t *testing.T) {
		model := manifest.Model{Namespace: "test", ModelID: "replicated", Descriptor: d}
		m, err := plan.ManifestFor(model.Domain(), &d, tp16, builtin(t, "LPHD"))
		require.NoError(t, err)
		require.Len(t, m.Parts, 16)
		for i, p := range m.Parts {
			require.Equal(t, manifest.Part{Layers: []int{i / 8 * 2, i/8*2 + 1}, HeadStart: i % 8, HeadCount: 1, TokenSet: manifest.TokenSet{CPSize: 1, Interleave: 1}}, p)
		}
		for _, dst := range []placement.Topology{tp16, {TP: 4, PP: 1}, {TP: 8, PP: 4}} {
			for _, r := range dst.Ranks() {
				s := scenario{d: d, src: tp16, srcL: builtin(t, "LPHD"), dst: dst, rank: r, dstL: builtin(t, "layer_first"), slots: 3, slot: 2}
				t.Run(fmt.Sprintf("tp%dpp%d/rank%d.%d", dst.TP, dst.PP, r.TP, r.PP), func(t *testing.T) {
					m, p, tpl := s.check(t)
					g := p.Geometry()
					for _, op := range tpl.Ops {
						// Both replicas of a head read the one part that holds it.
						part := m.Parts[op.Part]
						require.True(t, part.HeadStart >= g.HeadStart && part.HeadStart < g.HeadStart+g.Heads)
					}
				})
			}
		}
	})
}

// TestMLA plans pages of one latent component of 576 elements and one KV
// head, replicated on every TP rank, into every layout.
func TestMLA(t *testing.T) {
	d := desc(4, 1, []int{576}, "bf16", 4)
	for _, src := range partNames {
		for _, dst := range append(append([]string{}, partNames...), poolNames...) {
			for _, rd := range []struct {
				top  placement.Topology
				rank placement.Rank
			}{
				{placement.Topology{TP: 8, PP: 1}, placement.Rank{TP: 5}},
				{placement.Topology{TP: 2, PP: 4}, placement.Rank{TP: 1, PP: 2}},
			} {
				s := scenario{d: d, src: placement.Topology{TP: 4, PP: 2}, srcL: builtin(t, src),
					dst: rd.top, rank: rd.rank, dstL: builtin(t, dst), slots: 2, slot: 1, opts: plan.Options{RequireCompiled: true}}
				t.Run(fmt.Sprintf("%s-%s/tp%dpp%d", src, dst, rd.top.TP, rd.top.PP), func(t *testing.T) {
					m, p, _ := s.check(t)
					require.Len(t, m.Parts, 2) // one per PP stage, not one per TP rank
					g := p.Geometry()
					require.Equal(t, []string{"latent"}, g.RegionNames)
					require.Equal(t, len(g.Layers)*4*576*2, g.PageBytes)
				})
			}
		}
	}
}

const customKVL = `
part flash "vLLM flash, per layer" { order L C T H D }
part xblock { order C L H D/4 T D%4 }
part tblock { order C T/2 L H T%2 D }
pool host { order L C S T H D }
pool xpool { order C S L H D/4 T D%4 }
`

// custom compiles customKVL and returns its layouts by name. This test
// binary links no kernels for them, so they run on the interpreter.
func custom(t testing.TB) map[string]*ir.Layout {
	t.Helper()
	f, err := compiler.Compile("custom.kvl", []byte(customKVL))
	require.NoError(t, err)
	out := map[string]*ir.Layout{}
	for _, l := range f.Layouts {
		out[l.Name] = l
	}
	return out
}

// TestCustomLayouts plans layouts compiled at run time: each plan runs on
// the interpreter, says so, is counted, and verifies byte for byte.
func TestCustomLayouts(t *testing.T) {
	cl := custom(t)
	d := desc(4, 4, []int{8, 8}, "fp16", 4)
	cases := []struct{ src, dst *ir.Layout }{
		{cl["flash"], builtin(t, "page_first")},
		{cl["flash"], cl["flash"]},
		{cl["flash"], cl["host"]},
		{builtin(t, "PLHD"), cl["host"]},
		{cl["xblock"], builtin(t, "HPLD")},
		{cl["xblock"], cl["xpool"]},
		{cl["tblock"], builtin(t, "layer_first")},
		{builtin(t, "LPHD"), cl["tblock"]},
	}
	for _, c := range cases {
		s := scenario{d: d, src: placement.Topology{TP: 2, PP: 2}, srcL: c.src,
			dst: placement.Topology{TP: 4, PP: 1}, rank: placement.Rank{TP: 1}, dstL: c.dst, slots: 3, slot: 2}
		t.Run(c.src.Name+"-"+c.dst.Name, func(t *testing.T) {
			m, p := s.build(t)
			require.Zero(t, p.Fallbacks())
			pl, err := p.Build(m)
			require.NoError(t, err)
			require.True(t, pl.Interpreted)
			require.EqualValues(t, 1, p.Fallbacks())
			// The template is built once, so counted once more.
			tpl, err := p.Template(m)
			require.NoError(t, err)
			again, err := p.Template(m)
			require.NoError(t, err)
			require.Same(t, tpl, again)
			require.True(t, tpl.Interpreted)
			require.EqualValues(t, 2, p.Fallbacks())
			require.Equal(t, pl.Ops, tpl.Ops)
			checkPlan(t, s.String(), m, p, tpl, s.slot)
		})
	}

	t.Run("builtin pair is not counted", func(t *testing.T) {
		s := scenario{d: d, src: placement.Topology{TP: 2, PP: 2}, srcL: builtin(t, "PLHD"),
			dst: placement.Topology{TP: 4, PP: 1}, rank: placement.Rank{TP: 1}, dstL: builtin(t, "page_head"), slots: 3, slot: 2}
		m, p := s.build(t)
		pl, err := p.Build(m)
		require.NoError(t, err)
		require.False(t, pl.Interpreted)
		require.Zero(t, p.Fallbacks())
	})

	t.Run("require compiled", func(t *testing.T) {
		for _, c := range []struct {
			src, dst *ir.Layout
			want     string
		}{
			{cl["flash"], builtin(t, "page_first"), "no compiled kernels for the layout pair: part(L C T H D) -> pool(C S T L H D); link a package generated by kvlc for these layouts, or allow the interpreter"},
			{builtin(t, "HPLD"), cl["host"], "no compiled kernels for the layout pair: part(C H T L D) -> pool(L C S T H D); link a package generated by kvlc for these layouts, or allow the interpreter"},
		} {
			s := scenario{d: d, src: placement.Topology{TP: 2, PP: 2}, srcL: c.src,
				dst: placement.Topology{TP: 4, PP: 1}, rank: placement.Rank{TP: 1}, dstL: c.dst, slots: 3,
				opts: plan.Options{RequireCompiled: true}}
			m, p := s.build(t)
			pl, err := p.Build(m)
			require.Nil(t, pl)
			require.ErrorIs(t, err, plan.ErrNoKernel)
			require.EqualError(t, err, c.want)
			_, err = p.Template(m)
			require.EqualError(t, err, c.want)
			require.Zero(t, p.Fallbacks())
		}
	})

	t.Run("split factors differ", func(t *testing.T) {
		pool, err := ir.ParseLayout(ir.Pool, "xpool2", "C S L H D/2 T D%2")
		require.NoError(t, err)
		s := scenario{d: d, src: placement.Topology{TP: 2, PP: 2}, srcL: cl["xblock"],
			dst: placement.Topology{TP: 4, PP: 1}, rank: placement.Rank{TP: 1}, dstL: pool, slots: 3, slot: 2}
		m, p := s.build(t)
		tpl, err := p.Template(m)
		require.NoError(t, err)
		require.True(t, tpl.Interpreted, "xpool2 is not compiled into this binary")
		checkPlan(t, s.String(), m, p, tpl, s.slot)
	})

	t.Run("interleaved components need equal dims", func(t *testing.T) {
		d := desc(4, 4, []int{8, 4}, "fp16", 4)
		model := manifest.Model{Namespace: "test", ModelID: "flash", Descriptor: d}
		_, err := plan.ManifestFor(model.Domain(), &d, placement.Topology{TP: 1, PP: 1}, cl["flash"])
		require.EqualError(t, err, "layout flash interleaves components (C is not outermost), so K and V head dims must be equal, not [8 4]")
	})
}
