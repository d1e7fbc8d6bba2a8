package plan_test

import (
	"encoding/json"
	"os"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/content"
	_ "github.com/kvreshard/kvreshard/layouts"
	"github.com/kvreshard/kvreshard/runtime/kernel"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
)

// refCase is one plan of the original proposal's reference planner
// (testdata/reference-plans.json).
type refCase struct {
	ID         string `json:"id"`
	Descriptor struct {
		NumLayers    int `json:"num_layers"`
		TotalKVHeads int `json:"total_kv_heads"`
		KeyHeadDim   int `json:"key_head_dim"`
		ValueHeadDim int `json:"value_head_dim"`
		ItemSize     int `json:"itemsize"`
		PageSize     int `json:"page_size"`
	} `json:"descriptor"`
	Source struct {
		TP, PP      int
		Format      string `json:"format"`
		LayerCounts []int  `json:"layer_counts"`
	} `json:"source"`
	Target struct {
		TP, PP  int
		Rank    struct{ TP, PP int } `json:"rank"`
		Binding struct {
			Kind      string `json:"kind"`
			Format    string `json:"format"`
			Layout    string `json:"layout"`
			PoolPages int    `json:"pool_pages"`
			Slot      int    `json:"slot"`
		} `json:"binding"`
	} `json:"target"`
	OpCount int `json:"op_count"`
	Bytes   int `json:"bytes"`
	Parts   []struct {
		Index     int   `json:"index"`
		Layers    []int `json:"layers"`
		HeadStart int   `json:"head_start"`
		HeadCount int   `json:"head_count"`
		Bytes     int   `json:"bytes"`
	} `json:"parts"`
	Ops []struct {
		Part   int    `json:"part"`
		Src    int    `json:"src"`
		Region string `json:"region"`
		Dst    int    `json:"dst"`
		Len    int    `json:"len"`
	} `json:"ops"`
}

func loadReference(t *testing.T) []refCase {
	data, err := os.ReadFile("testdata/reference-plans.json")
	require.NoError(t, err)
	var f struct{ Cases []refCase }
	require.NoError(t, json.Unmarshal(data, &f))
	require.Len(t, f.Cases, 5)
	return f.Cases
}

func dtypeOf(item int) string { return map[int]string{1: "fp8", 2: "bf16", 4: "fp32"}[item] }

// setup builds the manifest and the reader's planner of a reference case.
func (c *refCase) setup(t *testing.T, opts plan.Options) (*manifest.Manifest, *plan.Planner, int) {
	d := manifest.Descriptor{
		KVHeads:  c.Descriptor.TotalKVHeads,
		HeadDims: []int{c.Descriptor.KeyHeadDim, c.Descriptor.ValueHeadDim},
		Dtype:    dtypeOf(c.Descriptor.ItemSize),
		ItemSize: c.Descriptor.ItemSize,
		PageSize: c.Descriptor.PageSize,
	}
	for i := 0; i < c.Descriptor.NumLayers; i++ {
		d.Layers = append(d.Layers, i)
	}
	src, err := kernel.LayoutNamed(c.Source.Format)
	require.NoError(t, err)
	model := manifest.Model{Namespace: "test", ModelID: c.ID, Descriptor: d}
	m, err := plan.ManifestFor(model.Domain(), &d, placement.Topology{TP: c.Source.TP, PP: c.Source.PP, PPLayers: c.Source.LayerCounts}, src)
	require.NoError(t, err)
	name, slots, slot := c.Target.Binding.Format, 1, 0
	if c.Target.Binding.Kind == "sglang" {
		name, slots, slot = c.Target.Binding.Layout, c.Target.Binding.PoolPages, c.Target.Binding.Slot
	}
	dst, err := kernel.LayoutNamed(name)
	require.NoError(t, err)
	b, err := plan.BindingFor(&d, placement.Topology{TP: c.Target.TP, PP: c.Target.PP},
		placement.Rank{TP: c.Target.Rank.TP, PP: c.Target.Rank.PP}, dst, slots)
	require.NoError(t, err)
	p, err := plan.NewPlanner(&d, b, opts)
	require.NoError(t, err)
	return m, p, slot
}

type item struct {
	part, src int
	region    string
	dst       int
}

// TestReferencePlans plans the five cases of the reference planner: the same
// parts, the same bytes, no more ops, the same byte-to-byte mapping where
// the reference lists its ops, and every byte verified.
func TestReferencePlans(t *testing.T) {
	for _, c := range loadReference(t) {
		t.Run(c.ID, func(t *testing.T) {
			m, p, slot := c.setup(t, plan.Options{RequireCompiled: true})
			require.Len(t, m.Parts, len(c.Parts))
			for i, rp := range c.Parts {
				require.Equal(t, rp.Index, i)
				require.Equal(t, rp.Layers, m.Parts[i].Layers)
				require.Equal(t, rp.HeadStart, m.Parts[i].HeadStart)
				require.Equal(t, rp.HeadCount, m.Parts[i].HeadCount)
				require.Equal(t, rp.Bytes, m.PartBytes(i))
			}
			tpl, err := p.Template(m)
			require.NoError(t, err)
			require.False(t, tpl.Interpreted)
			require.Equal(t, c.Bytes, tpl.Bytes)
			require.LessOrEqual(t, len(tpl.Ops), c.OpCount)
			t.Logf("%s: %d ops (reference %d), %d bytes", c.ID, len(tpl.Ops), c.OpCount, tpl.Bytes)

			if len(c.Ops) > 0 {
				g := p.Geometry()
				var want, got []item
				for _, op := range c.Ops {
					for k := 0; k < op.Len; k += m.Descriptor.ItemSize {
						want = append(want, item{op.Part, op.Src + k, op.Region, op.Dst + k})
					}
				}
				for _, op := range p.Instantiate(tpl, slot, nil) {
					for k := 0; k < op.Len; k += m.Descriptor.ItemSize {
						got = append(got, item{int(op.Part), op.Src + k, g.RegionNames[op.Region], op.Dst + k})
					}
				}
				less := func(s []item) func(i, j int) bool {
					return func(i, j int) bool {
						a, b := s[i], s[j]
						if a.part != b.part {
							return a.part < b.part
						}
						return a.src < b.src
					}
				}
				sort.Slice(want, less(want))
				sort.Slice(got, less(got))
				require.Equal(t, want, got)
			}

			seed := content.Seed("page-" + c.ID)
			parts := fillParts(t, m, seed)
			regions := p.Geometry().NewRegions()
			apply(p, tpl, slot, parts, regions)
			require.NoError(t, content.Verify(p.Geometry(), regions, slot, seed))
		})
	}
}
