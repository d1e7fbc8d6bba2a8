package plan_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
)

// TestTemplateAcrossSlots reads two pages of one layout into two slots of a
// pool with one template: the template is built once (the same *Plan comes
// back), each page lands at its slot, and the other slots are untouched.
func TestTemplateAcrossSlots(t *testing.T) {
	d := desc(6, 4, []int{8, 4}, "bf16", 4)
	for _, pool := range poolNames {
		t.Run(pool, func(t *testing.T) {
			s := scenario{d: d, src: placement.Topology{TP: 2, PP: 3}, srcL: builtin(t, "HPLD"),
				dst: placement.Topology{TP: 4, PP: 2}, rank: placement.Rank{TP: 3, PP: 1}, dstL: builtin(t, pool), slots: 4}
			m, p := s.build(t)
			g := p.Geometry()
			slots := []int{3, 1}
			require.NoError(t, p.CheckSlots(slots))
			regions := g.NewRegions()
			var tpls []*plan.Plan
			for i, slot := range slots {
				tpl, err := p.Template(m)
				require.NoError(t, err)
				tpls = append(tpls, tpl)
				apply(p, tpl, slot, fillParts(t, m, content.Seed(fmt.Sprint("page", i))), regions)
			}
			require.Same(t, tpls[0], tpls[1])
			for i, slot := range slots {
				require.NoError(t, content.Verify(g, regions, slot, content.Seed(fmt.Sprint("page", i))))
				// The instantiated ops are the template's, moved by the
				// slot's offset in each region, and map exactly what the
				// layout model maps at that slot.
				ops := p.Instantiate(tpls[0], slot, nil)
				for k, op := range ops {
					want := tpls[0].Ops[k]
					want.Dst += slot * g.SlotStride[op.Region]
					require.Equal(t, want, op)
				}
				require.Equal(t, elementMap(t, m, g, slot), expand(p, tpls[0], slot, d.ItemSize))
			}
			// Slots 0 and 2 were never written: every byte the model places
			// there is still zero.
			for _, slot := range []int{0, 2} {
				for _, e := range elementMap(t, m, g, slot) {
					require.Equal(t, make([]byte, d.ItemSize), regions[e.region][e.dst:e.dst+d.ItemSize], "slot %d", slot)
				}
			}
			// Instantiate appends to what it is given.
			out := p.Instantiate(tpls[0], 1, []plan.Op{{Len: 7}})
			require.Len(t, out, 1+len(tpls[0].Ops))
			require.Equal(t, plan.Op{Len: 7}, out[0])
			// The template itself is left relative to slot 0.
			again, err := p.Build(m)
			require.NoError(t, err)
			require.Equal(t, again.Ops, tpls[0].Ops)
		})
	}
}

// TestTemplateLRU bounds the cache to two layouts: a third evicts the least
// recently used, which is rebuilt on its next use.
func TestTemplateLRU(t *testing.T) {
	d := desc(4, 2, []int{8, 8}, "bf16", 4)
	src := placement.Topology{TP: 2, PP: 2}
	model := manifest.Model{Namespace: "test", ModelID: "lru", Descriptor: d}
	var ms []*manifest.Manifest
	for _, name := range partNames {
		m, err := plan.ManifestFor(model.Domain(), &d, src, builtin(t, name))
		require.NoError(t, err)
		ms = append(ms, m)
	}
	b, err := plan.BindingFor(&d, placement.Topology{TP: 1, PP: 1}, placement.Rank{}, builtin(t, "page_first"), 2)
	require.NoError(t, err)
	p, err := plan.NewPlanner(&d, b, plan.Options{Templates: 2})
	require.NoError(t, err)
	get := func(i int) *plan.Plan {
		tpl, err := p.Template(ms[i])
		require.NoError(t, err)
		require.Equal(t, ms[i].ID(), tpl.ManifestID)
		return tpl
	}
	t0, t1 := get(0), get(1)
	require.Same(t, t0, get(0)) // 0 is now the most recent, 1 the least
	t2 := get(2)                // evicts 1
	require.Same(t, t0, get(0))
	require.Same(t, t2, get(2))
	t1b := get(1) // rebuilt; evicts 0, the least recent now
	require.NotSame(t, t1, t1b)
	require.Equal(t, t1.Ops, t1b.Ops)
	require.Same(t, t2, get(2))
	require.Same(t, t1b, get(1))
	require.NotSame(t, t0, get(0))

	// Without a bound, 64 layouts are kept.
	p, err = plan.NewPlanner(&d, b, plan.Options{})
	require.NoError(t, err)
	first := make([]*plan.Plan, len(ms))
	for i, m := range ms {
		first[i], err = p.Template(m)
		require.NoError(t, err)
	}
	for i, m := range ms {
		tpl, err := p.Template(m)
		require.NoError(t, err)
		require.Same(t, first[i], tpl)
	}
}

// TestCheckSlots checks the slots of a request, on the short path (up to 64
// pages) and the long one.
func TestCheckSlots(t *testing.T) {
	d := desc(2, 2, []int{4, 4}, "fp16", 2)
	planner := func(slots int) *plan.Planner {
		b, err := plan.BindingFor(&d, placement.Topology{TP: 1, PP: 1}, placement.Rank{}, builtin(t, "page_head"), slots)
		require.NoError(t, err)
		p, err := plan.NewPlanner(&d, b, plan.Options{})
		require.NoError(t, err)
		return p
	}
	p4, p100 := planner(4), planner(100)
	seq := func(n int) []int {
		s := make([]int, n)
		for i := range s {
			s[i] = n - 1 - i
		}
		return s
	}
	long := seq(80)
	long[70] = long[3] // slot 76 twice
	longOut := seq(80)
	longOut[66] = 100
	for _, c := range []struct {
		p     *plan.Planner
		slots []int
		want  string
	}{
		{p4, nil, ""},
		{p4, []int{3, 0, 2, 1}, ""},
		{p4, []int{0, 4}, "slot 4 of page 1 is outside the pool's 4 slots"},
		{p4, []int{-1}, "slot -1 of page 0 is outside the pool's 4 slots"},
		{p4, []int{1, 3, 1}, "pages 0 and 2 both go to slot 1"},
		{p4, []int{0, 1, 2, 3, 0}, "5 pages do not fit in a pool of 4 slots"},
		{p100, seq(100), ""},
		{p100, long, "pages 3 and 70 both go to slot 76"},
		{p100, longOut, "slot 100 of page 66 is outside the pool's 100 slots"},
		{p100, seq(101), "101 pages do not fit in a pool of 100 slots"},
	} {
		err := c.p.CheckSlots(c.slots)
		if c.want == "" {
			require.NoError(t, err, "%v", c.slots)
		} else {
			require.EqualError(t, err, c.want)
		}
	}

	// A part layout binding is one page.
	b, err := plan.BindingFor(&d, placement.Topology{TP: 1, PP: 1}, placement.Rank{}, builtin(t, "PLHD"), 5)
	require.NoError(t, err)
	p, err := plan.NewPlanner(&d, b, plan.Options{})
	require.NoError(t, err)
	require.NoError(t, p.CheckSlots([]int{0}))
	require.EqualError(t, p.CheckSlots([]int{0, 0}), "2 pages do not fit in a pool of 1 slots")
	require.EqualError(t, p.CheckSlots([]int{1}), "slot 1 of page 0 is outside the pool's 1 slots")
}

// TestMixedLayouts reads, in one request, three pages written in three
// layouts by three topologies into three slots of one pool.
func TestMixedLayouts(t *testing.T) {
	d := desc(6, 4, []int{16, 8}, "fp16", 4)
	model := manifest.Model{Namespace: "test", ModelID: "mixed", Descriptor: d}
	writers := []struct {
		top    placement.Topology
		layout string
	}{
		{placement.Topology{TP: 2, PP: 2}, "PLHD"},
		{placement.Topology{TP: 1, PP: 3, PPLayers: []int{1, 2, 3}}, "LPHD"},
		{placement.Topology{TP: 4, PP: 1}, "HPLD"},
	}
	for _, pool := range poolNames {
		t.Run(pool, func(t *testing.T) {
			b, err := plan.BindingFor(&d, placement.Topology{TP: 2, PP: 2}, placement.Rank{TP: 1, PP: 1}, builtin(t, pool), 5)
			require.NoError(t, err)
			p, err := plan.NewPlanner(&d, b, plan.Options{RequireCompiled: true})
			require.NoError(t, err)
			g := p.Geometry()
			slots := []int{2, 0, 4}
			require.NoError(t, p.CheckSlots(slots))
			regions := g.NewRegions()
			ids := map[string]bool{}
			var ops []plan.Op
			var parts [][][]byte
			var tpls []*plan.Plan
			for i, w := range writers {
				m, err := plan.ManifestFor(model.Domain(), &d, w.top, builtin(t, w.layout))
				require.NoError(t, err)
				ids[m.ID()] = true
				tpl, err := p.Template(m)
				require.NoError(t, err)
				tpls = append(tpls, tpl)
				parts = append(parts, fillParts(t, m, content.Seed(fmt.Sprint("mixed", i))))
				ops = p.Instantiate(tpl, slots[i], ops)
			}
			require.Len(t, ids, 3)
			// One list of ops for the request, each page's ops in turn.
			k := 0
			for i, tpl := range tpls {
				for _, op := range ops[k : k+len(tpl.Ops)] {
					copy(regions[op.Region][op.Dst:op.Dst+op.Len], parts[i][op.Part][op.Src:op.Src+op.Len])
				}
				k += len(tpl.Ops)
			}
			require.Len(t, ops, k)
			for i, slot := range slots {
				require.NoError(t, content.Verify(g, regions, slot, content.Seed(fmt.Sprint("mixed", i))), "page %d", i)
			}
		})
	}
}
