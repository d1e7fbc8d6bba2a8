package plan_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/testkit/kerneltest"
)

// fillParts returns the bytes of every part of m for the page with seed,
// placed element by element by the independent layout model.
func fillParts(t *testing.T, m *manifest.Manifest, seed uint64) [][]byte {
	t.Helper()
	src, err := plan.Layout(m)
	require.NoError(t, err)
	d := &m.Descriptor
	g := kerneltest.Shape{ItemSize: d.ItemSize, PageSize: d.PageSize, Dims: d.HeadDims}
	var parts [][]byte
	for i, p := range m.Parts {
		b := &kerneltest.Buffer{Layout: src, Layers: p.Layers, HeadStart: p.HeadStart, Heads: p.HeadCount, Slots: 1, Packed: true,
			CP: p.CPSize, CPRank: p.CPRank, Interleave: p.Interleave}
		buf := make([]byte, m.PartBytes(i))
		require.Equal(t, g.Regions(b)[0], len(buf))
		for c := range d.HeadDims {
			for li, layer := range p.Layers {
				for h := 0; h < p.HeadCount; h++ {
					for tok := 0; tok < d.PageSize; tok++ {
						lt, ok := b.Local(d.PageSize, tok)
						if !ok {
							continue
						}
						for e := 0; e < d.HeadDims[c]; e++ {
							_, off := g.Offset(b, c, li, h, lt, e)
							content.Element(seed, c, layer, p.HeadStart+h, tok, e, buf[off:off+d.ItemSize])
						}
					}
				}
			}
		}
		parts = append(parts, buf)
	}
	return parts
}

// apply copies the ops of a plan placed at slot from parts into regions.
func apply(pl *plan.Planner, tpl *plan.Plan, slot int, parts, regions [][]byte) {
	for _, op := range pl.Instantiate(tpl, slot, nil) {
		copy(regions[op.Region][op.Dst:op.Dst+op.Len], parts[op.Part][op.Src:op.Src+op.Len])
	}
}
