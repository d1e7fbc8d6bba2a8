package plan_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/runtime/content"
	"github.com/kvreshard/kvreshard/runtime/kernel/kerneltest"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/plan"
)

// fillParts returns the bytes of every part of m for the page with seed,
// placed element by element by the independent layout model.
func fillParts(t *testing.T, m *manifest.Manifest, seed uint64) [][]byte {
	t.Helper()
	src, err := plan.Layout(m)
	require.NoError(t, err)
	d := &m.Descriptor
	g := kerneltest.Geometry{ItemSize: d.ItemSize, PageSize: d.PageSize, Dims: d.HeadDims}
	var parts [][]byte
	for i, p := range m.Parts {
		b := &kerneltest.Buffer{Layout: src, Layers: p.Layers, HeadStart: p.HeadStart, Heads: p.HeadCount, Slots: 1, Packed: true}
		buf := make([]byte, m.PartBytes(i))
		require.Equal(t, g.Regions(b)[0], len(buf))
		for c := range d.HeadDims {
			for li, layer := range p.Layers {
				for h := 0; h < p.HeadCount; h++ {
					for tok := 0; tok < d.PageSize; tok++ {
						for e := 0; e < d.HeadDims[c]; e++ {
							_, off := g.Offset(b, c, li, h, tok, e)
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

// verifyPage checks every element of the page at slot of a binding against
// its expected value, and returns the first difference.
func verifyPage(g *plan.Geometry, regions [][]byte, slot int, seed uint64) error {
	d := g.Desc
	kg := kerneltest.Geometry{ItemSize: d.ItemSize, PageSize: d.PageSize, Dims: d.HeadDims}
	b := &kerneltest.Buffer{Layout: g.Layout, Layers: g.Layers, HeadStart: g.HeadStart, Heads: g.Heads, Slots: g.Slots, Slot: slot}
	want := make([]byte, d.ItemSize)
	for c := range d.HeadDims {
		for li, layer := range g.Layers {
			for h := 0; h < g.Heads; h++ {
				for tok := 0; tok < d.PageSize; tok++ {
					for e := 0; e < d.HeadDims[c]; e++ {
						r, off := kg.Offset(b, c, li, h, tok, e)
						content.Element(seed, c, layer, g.HeadStart+h, tok, e, want)
						if !bytes.Equal(regions[r][off:off+d.ItemSize], want) {
							return fmt.Errorf("element c%d layer %d head %d token %d d %d at region %d offset %d: got %x, want %x",
								c, layer, g.HeadStart+h, tok, e, r, off, regions[r][off:off+d.ItemSize], want)
						}
					}
				}
			}
		}
	}
	return nil
}
