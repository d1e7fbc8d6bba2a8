package plan_test

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
)

// ops70B is the op count of the 70B case: 2 components x 64 tokens x 40
// layers x 2 heads, one run of 128 elements each.
const ops70B = 10240

// scenario70B is a 70B-size page (80 layers, 8 KV heads, head dim 128,
// bf16, 64 tokens) written by TP 8 in PLHD and read by rank 0/0 of TP 4 x
// PP 2 into a page_first pool.
func scenario70B(slots, slot int) scenario {
	return scenario{d: desc(80, 8, []int{128, 128}, "bf16", 64), src: placement.Topology{TP: 8, PP: 1}, srcL: nil,
		dst: placement.Topology{TP: 4, PP: 2}, rank: placement.Rank{}, slots: slots, slot: slot,
		opts: plan.Options{RequireCompiled: true}}
}

func setup70B(b *testing.B, slots, slot int) (*manifest.Manifest, *plan.Planner, *plan.Plan) {
	s := scenario70B(slots, slot)
	s.srcL, s.dstL = builtin(b, "PLHD"), builtin(b, "page_first")
	m, p := s.build(b)
	pl, err := p.Build(m)
	require.NoError(b, err)
	require.Len(b, pl.Ops, ops70B)
	require.Equal(b, 40*2*64*128*2*2, pl.Bytes)
	return m, p, pl
}

// reportPer reports the mean time of one iteration in µs and per op of the
// plan in ns, and returns the µs.
func reportPer(b *testing.B, ops int) float64 {
	us := float64(b.Elapsed().Nanoseconds()) / float64(b.N) / 1e3
	b.ReportMetric(us, "µs/plan")
	b.ReportMetric(us*1e3/float64(ops), "ns/plan-op")
	return us
}

// BenchmarkBuild70B builds the 70B case's plan from its manifest, without
// the template cache, proof included.
func BenchmarkBuild70B(b *testing.B) {
	m, p, _ := setup70B(b, 1, 0)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Build(m); err != nil {
			b.Fatal(err)
		}
	}
	reportPer(b, ops70B)
}

// BenchmarkInstantiate70B places the 70B case's template at a slot of a
// pool of four pages: one add per op.
func BenchmarkInstantiate70B(b *testing.B) {
	m, p, _ := setup70B(b, 4, 3)
	tpl, err := p.Template(m)
	require.NoError(b, err)
	out := make([]plan.Op, 0, len(tpl.Ops))
	b.ReportAllocs()
	for b.Loop() {
		out = p.Instantiate(tpl, 3, out[:0])
	}
	require.Len(b, out, ops70B)
	ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N) / ops70B
	b.ReportMetric(ns, "ns/plan-op")
}

// BenchmarkReference builds the plans of the reference planner's small
// cases and reports the reference's median (ref_us) and how many times
// faster this planner is in the same run (x_faster).
func BenchmarkReference(b *testing.B) {
	data, err := os.ReadFile("testdata/reference-plans.json")
	require.NoError(b, err)
	var f struct{ Cases []refCase }
	require.NoError(b, json.Unmarshal(data, &f))
	var medians struct {
		Cases []struct {
			ID     string  `json:"id"`
			Median float64 `json:"reference_plan_median_us"`
		}
	}
	require.NoError(b, json.Unmarshal(data, &medians))
	require.Len(b, f.Cases, 5)
	for i, c := range f.Cases {
		ref := medians.Cases[i].Median
		require.Equal(b, c.ID, medians.Cases[i].ID)
		require.Positive(b, ref)
		b.Run(c.ID, func(b *testing.B) {
			s := c.scenario(b)
			m, p := s.build(b)
			pl, err := p.Build(m)
			require.NoError(b, err)
			require.Equal(b, c.Bytes, pl.Bytes)
			require.LessOrEqual(b, len(pl.Ops), c.OpCount)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := p.Build(m); err != nil {
					b.Fatal(err)
				}
			}
			us := reportPer(b, len(pl.Ops))
			b.ReportMetric(ref, "ref_us")
			b.ReportMetric(ref/us, "x_faster")
		})
	}
}

// scenario returns the reference case as a scenario.
func (c *refCase) scenario(tb testing.TB) scenario {
	d := manifest.Descriptor{
		KVHeads:  c.Descriptor.TotalKVHeads,
		HeadDims: []int{c.Descriptor.KeyHeadDim, c.Descriptor.ValueHeadDim},
		Dtype:    dtypeOf(c.Descriptor.ItemSize),
		ItemSize: c.Descriptor.ItemSize,
		PageSize: c.Descriptor.PageSize,
	}
	for i := range c.Descriptor.NumLayers {
		d.Layers = append(d.Layers, i)
	}
	name, slots, slot := c.Target.Binding.Format, 1, 0
	if c.Target.Binding.Kind == "sglang" {
		name, slots, slot = c.Target.Binding.Layout, c.Target.Binding.PoolPages, c.Target.Binding.Slot
	}
	return scenario{d: d,
		src: placement.Topology{TP: c.Source.TP, PP: c.Source.PP, PPLayers: c.Source.LayerCounts}, srcL: builtin(tb, c.Source.Format),
		dst:  placement.Topology{TP: c.Target.TP, PP: c.Target.PP},
		rank: placement.Rank{TP: c.Target.Rank.TP, PP: c.Target.Rank.PP}, dstL: builtin(tb, name),
		slots: slots, slot: slot, opts: plan.Options{RequireCompiled: true}}
}
