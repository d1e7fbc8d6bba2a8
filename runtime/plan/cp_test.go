package plan_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler"
	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
)

// cpKVL declares layouts that split T by 4 with other axes between the
// digits, on both kinds, so that token lists meet split T on each side.
const cpKVL = `
part t4 { order C T/4 L H T%4 D }
pool t4pool { order C S T/4 H L T%4 D }
`

func lcm(a, b int) int {
	g, h := a, b
	for h != 0 {
		g, h = h, g%h
	}
	return a / g * b
}

// randomCP gives t a CP size and interleave that leave each CP rank of a
// page of page tokens a multiple of split tokens; one time in four none.
func randomCP(r *rand.Rand, t *placement.Topology, page, split int) {
	t.CP, t.Interleave = 0, 0
	if r.IntN(4) == 0 {
		return
	}
	for {
		cp, il := 1+r.IntN(6), []int{1, 1, 2, 3, 4, 8}[r.IntN(6)]
		if page%(cp*il*split) == 0 {
			t.CP, t.Interleave = cp, il
			return
		}
	}
}

// TestRandomCPPlans plans random TP x PP x CP topologies and interleaves on
// both sides, MHA and MLA, in built-in and custom layouts (split T among
// them): every plan verifies element by element against the independent
// model, token sets included, and moves exactly the elements it maps.
func TestRandomCPPlans(t *testing.T) {
	var parts, all []*ir.Layout
	for _, n := range partNames {
		parts = append(parts, builtin(t, n))
	}
	for _, n := range poolNames {
		all = append(all, builtin(t, n))
	}
	f, err := compiler.Compile("cp.kvl", []byte(cpKVL))
	require.NoError(t, err)
	layouts := f.Layouts
	for _, l := range custom(t) {
		layouts = append(layouts, l)
	}
	for _, l := range layouts {
		if l.Kind == ir.Part {
			parts = append(parts, l)
		} else {
			all = append(all, l)
		}
	}
	all = append(all, parts...)
	n := 600
	switch {
	case testing.Short():
		n = 60
	case raceEnabled:
		n = 100
	}
	r := rand.New(rand.NewPCG(15, 15))
	lists, mla := 0, 0
	for i := range n {
		s := randomScenario(r, parts, all)
		split := lcm(max(s.srcL.SplitOf(ir.T), 1), max(s.dstL.SplitOf(ir.T), 1))
		s.d.PageSize = split * []int{4, 8, 12, 16, 24}[r.IntN(5)]
		randomCP(r, &s.src, s.d.PageSize, split)
		randomCP(r, &s.dst, s.d.PageSize, split)
		ranks := s.dst.Ranks()
		s.rank = ranks[r.IntN(len(ranks))]
		// Any strategy, with scatter lists short enough to split reads
		// (a staging bound below a run would split ops, which the op
		// count check below does not allow for).
		s.opts = plan.Options{Strategy: plan.Strategy(r.IntN(int(plan.Auto) + 1)), MaxSegments: 1 + r.IntN(4), MaxGap: r.IntN(64)}
		_, _, tpl := s.check(t)
		// Staged through a small staging buffer, as a reader runs it.
		st := s
		st.opts = plan.Options{Strategy: plan.Staged, StageBytes: 64 << r.IntN(6), MaxGap: r.IntN(256)}
		m, p := st.build(t)
		staged, err := p.Template(m)
		require.NoError(t, err, st.String())
		seed := content.Seed(st.String())
		regions := p.Geometry().NewRegions()
		execute(t, p, staged, st.slot, fillParts(t, m, seed), regions, st.opts.StageBytes)
		require.NoError(t, content.Verify(p.Geometry(), regions, st.slot, seed), st.String())
		if tpl.TokenLists {
			lists++
		}
		if len(s.d.HeadDims) == 1 {
			mla++
		}
		if t.Failed() {
			t.Fatalf("case %d: %s", i, s.String())
		}
	}
	require.Greater(t, lists, n/2)
	require.Greater(t, mla, n/20)
	t.Logf("%d plans, %d with token lists, %d mla", n, lists, mla)
}

// The cases: a CP 1 reader gathers a page from every CP part; a
// CP 2 reader with interleave 16 reads a CP 4 writer with interleave 1;
// TP, PP and CP change at once. Parts of tokens a reader does not hold are
// not read.
func TestCPPlans(t *testing.T) {
	mlaDesc := desc(4, 1, []int{16}, "bf16", 64)
	mha := desc(4, 4, []int{8, 8}, "fp16", 32)
	for _, tc := range []struct {
		name     string
		d        manifest.Descriptor
		src, dst placement.Topology
		rank     placement.Rank
		dstL     string
		parts    []int // the parts the plan reads
	}{
		{"cp1 reader of tp2 cp2", mlaDesc, placement.Topology{TP: 2, PP: 1, CP: 2, Interleave: 1}, placement.Topology{TP: 1, PP: 1},
			placement.Rank{}, "page_first", []int{0, 1}},
		{"cp2/16 reader of cp4/1", mlaDesc, placement.Topology{TP: 1, PP: 1, CP: 4, Interleave: 1}, placement.Topology{TP: 1, PP: 1, CP: 2, Interleave: 16},
			placement.Rank{CP: 1}, "page_head", []int{0, 1, 2, 3}},
		{"cp4/4 reader of tp2 cp2", mlaDesc, placement.Topology{TP: 2, PP: 1, CP: 2, Interleave: 1}, placement.Topology{TP: 1, PP: 1, CP: 4, Interleave: 4},
			placement.Rank{CP: 2}, "layer_first", []int{0, 1}},
		{"contiguous slices", mlaDesc, placement.Topology{TP: 1, PP: 2, CP: 4, Interleave: 16}, placement.Topology{TP: 1, PP: 1, CP: 2, Interleave: 32},
			placement.Rank{CP: 1}, "page_first", []int{2, 3, 6, 7}},
		{"tp pp cp at once", mha, placement.Topology{TP: 2, PP: 2, CP: 2, Interleave: 2}, placement.Topology{TP: 4, PP: 1, CP: 4, Interleave: 1},
			placement.Rank{TP: 3, CP: 1}, "page_first_direct", []int{2, 6}}, // tokens 1, 5, 9, ... are all of CP rank 0
		{"same cp", mha, placement.Topology{TP: 1, PP: 1, CP: 2, Interleave: 4}, placement.Topology{TP: 1, PP: 1, CP: 2, Interleave: 4},
			placement.Rank{CP: 1}, "page_first", []int{1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := scenario{d: tc.d, src: tc.src, srcL: builtin(t, "PLHD"), dst: tc.dst, rank: tc.rank, dstL: builtin(t, tc.dstL), slots: 3, slot: 2}
			m, p, tpl := s.check(t)
			read := map[int]bool{}
			for _, op := range tpl.Ops {
				read[int(op.Part)] = true
			}
			var got []int
			for i := range m.Parts {
				if read[i] {
					got = append(got, i)
				}
			}
			require.Equal(t, tc.parts, got)
			// Same tokens on both sides run on the compiled kernels.
			require.Equal(t, tc.name != "same cp", tpl.TokenLists)
			require.False(t, tpl.Interpreted)
			require.Equal(t, int64(0), p.Fallbacks())
			if tpl.TokenLists {
				require.Equal(t, int64(1), p.TokenPlans())
			}
			// Every strategy proves and moves the same bytes.
			for _, st := range []plan.Strategy{plan.Scatter, plan.Staged, plan.Auto} {
				s.opts = plan.Options{Strategy: st}
				_, _, other := s.check(t)
				require.Equal(t, tpl.Bytes, other.Bytes)
			}
		})
	}
}

// A CP writer's pool holds its tokens only; its write plan gives its part,
// and a reader of another CP verifies what it wrote, element by element.
func TestCPWriteRead(t *testing.T) {
	d := desc(2, 2, []int{8, 8}, "bf16", 16)
	src := placement.Topology{TP: 2, PP: 1, CP: 2, Interleave: 1}
	model := manifest.Model{Namespace: "test", ModelID: "cp", Descriptor: d}
	m, err := plan.ManifestFor(model.Domain(), &d, src, builtin(t, "PLHD"))
	require.NoError(t, err)
	seed := content.Seed("cp page")
	parts := make([][]byte, len(m.Parts))
	for _, r := range src.Ranks() {
		part, _, err := src.Writer(&d, r)
		require.NoError(t, err)
		b, err := plan.BindingFor(&d, src, r, builtin(t, "page_first"), 2)
		require.NoError(t, err)
		wp, err := plan.NewWritePlan(m, part, b, true)
		require.NoError(t, err)
		require.Equal(t, 8, b.PageTokens(&d))
		regions := wp.Geometry().NewRegions()
		content.Fill(wp.Geometry(), regions, 1, seed)
		for _, frag := range wp.Data(regions, 1, nil) {
			parts[part] = append(parts[part], frag...)
		}
		require.Len(t, parts[part], m.PartBytes(part))
		// Another CP rank's part is refused.
		_, err = plan.NewWritePlan(m, part^1, b, true)
		require.EqualError(t, err, fmt.Sprintf("the writer holds the tokens of cp rank %d of 2 (interleave 1), not part %d's: cp rank %d of 2 (interleave 1)",
			r.CP, part^1, 1-r.CP))
	}
	for _, dst := range []placement.Topology{{TP: 1, PP: 1}, {TP: 1, PP: 1, CP: 4, Interleave: 4}} {
		for _, r := range dst.Ranks() {
			b, err := plan.BindingFor(&d, dst, r, builtin(t, "page_head"), 1)
			require.NoError(t, err)
			p, err := plan.NewPlanner(&d, b, plan.Options{})
			require.NoError(t, err)
			tpl, err := p.Template(m)
			require.NoError(t, err)
			regions := p.Geometry().NewRegions()
			apply(p, tpl, 0, parts, regions)
			require.NoError(t, content.Verify(p.Geometry(), regions, 0, seed), "%+v rank %+v", dst, r)
		}
	}
}

// A binding of every token is every token, whatever its interleave says:
// it plans on the compiled kernels like the zero token set.
func TestCPAllTokens(t *testing.T) {
	d := desc(2, 2, []int{8, 8}, "bf16", 16)
	model := manifest.Model{Namespace: "test", ModelID: "cp", Descriptor: d}
	m, err := plan.ManifestFor(model.Domain(), &d, placement.Topology{TP: 1, PP: 1}, builtin(t, "PLHD"))
	require.NoError(t, err)
	for _, ts := range []manifest.TokenSet{{}, {CPSize: 1, Interleave: 1}, {CPSize: 1, Interleave: 4}} {
		b := plan.Binding{Layout: builtin(t, "page_first"), Layers: []int{0, 1}, Heads: 2, Slots: 1, Tokens: ts}
		p, err := plan.NewPlanner(&d, b, plan.Options{})
		require.NoError(t, err)
		tpl, err := p.Template(m)
		require.NoError(t, err)
		require.False(t, tpl.TokenLists, "%+v", ts)
		require.Len(t, tpl.Ops, 2, "%+v", ts) // PLHD into page_first: one run a component
		_, err = plan.NewWritePlan(m, 0, b, true)
		require.NoError(t, err, "%+v", ts)
	}
}

func TestCPBindingErrors(t *testing.T) {
	d := desc(2, 1, []int{8}, "bf16", 16)
	for _, tc := range []struct {
		tokens manifest.TokenSet
		layout string
		err    string
	}{
		{manifest.TokenSet{CPSize: 2, CPRank: 2, Interleave: 1}, "page_first", "binding cp_rank 2 is outside cp_size 2"},
		{manifest.TokenSet{CPSize: 2, Interleave: 3}, "page_first", "binding interleave 3 does not divide the page's 16 tokens"},
		{manifest.TokenSet{CPSize: 32, Interleave: 1}, "page_first", "binding cp_size 32 is more than the page's 16 tokens"},
	} {
		_, err := plan.NewGeometry(&d, plan.Binding{Layout: builtin(t, tc.layout), Layers: []int{0, 1}, Heads: 1, Slots: 1, Tokens: tc.tokens})
		require.EqualError(t, err, tc.err)
	}
	f, err := compiler.Compile("cp.kvl", []byte(cpKVL))
	require.NoError(t, err)
	var t4 *ir.Layout
	for _, l := range f.Layouts {
		if l.Name == "t4pool" {
			t4 = l
		}
	}
	_, err = plan.NewGeometry(&d, plan.Binding{Layout: t4, Layers: []int{0, 1}, Heads: 1, Slots: 1, Tokens: manifest.TokenSet{CPSize: 8, CPRank: 1, Interleave: 1}})
	require.EqualError(t, err, "layout t4pool splits T by 4, which does not divide the 2 tokens a rank of cp 8 holds")
}

// A staged read of a CP part whose tokens are the reader's reads the part
// whole and moves it with the pair's copy kernel, on a page of the tokens
// both hold; a part of other tokens is copied run by run. Either way the
// pool gets every element.
func TestCPStagedWholeParts(t *testing.T) {
	mha := desc(4, 4, []int{8, 8}, "fp16", 32)
	for _, tc := range []struct {
		name   string
		dst    placement.Topology
		rank   placement.Rank
		kernel bool
	}{
		{"same tokens", placement.Topology{TP: 1, PP: 1, CP: 2, Interleave: 4}, placement.Rank{CP: 1}, true},
		{"other tokens", placement.Topology{TP: 1, PP: 1, CP: 4, Interleave: 1}, placement.Rank{CP: 3}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := scenario{d: mha, src: placement.Topology{TP: 1, PP: 1, CP: 2, Interleave: 4}, srcL: builtin(t, "PLHD"),
				dst: tc.dst, rank: tc.rank, dstL: builtin(t, "page_head"), slots: 3, slot: 1,
				opts: plan.Options{Strategy: plan.Staged, MaxGap: 1 << 20}}
			m, p := s.build(t)
			tpl, err := p.Template(m)
			require.NoError(t, err)
			require.Equal(t, plan.Staged, tpl.Strategy)
			kernel := false
			for _, r := range tpl.Reads {
				kernel = kernel || r.Kernel
			}
			require.Equal(t, tc.kernel, kernel, "a read moved by the copy kernel")
			seed := content.Seed("page/" + tc.name)
			parts := fillParts(t, m, seed)
			g := p.Geometry()
			regions := g.NewRegions()
			execute(t, p, tpl, s.slot, parts, regions, p.StageBound())
			require.NoError(t, content.Verify(g, regions, s.slot, seed))
		})
	}
}
