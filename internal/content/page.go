package content

import (
	"bytes"
	"fmt"

	"github.com/kvreshard/kvreshard/runtime/plan"
)

// visit calls f with the region and offset of every element of the page at
// slot of a binding, placed by place (not by the kernels that move the
// bytes, so that verification proves them), until f returns false. Tokens
// are the page's (global) token ids, so that a context-parallel rank's
// share of a page has the values the same tokens have in any other rank's.
func visit(g *plan.Geometry, slot int, f func(c, layer, head, token, d, region, off int) bool) {
	desc := g.Desc
	ts := tokens(desc.PageSize, g.Tokens.CPSize, g.Tokens.CPRank, g.Tokens.Interleave)
	p := &place{g: g, slot: slot, tokens: len(ts)}
	for c := range desc.HeadDims {
		for li, layer := range g.Layers {
			for h := 0; h < g.Heads; h++ {
				for lt, t := range ts {
					for d := 0; d < desc.HeadDims[c]; d++ {
						r, off := p.offset(c, li, h, lt, d)
						if !f(c, layer, g.HeadStart+h, t, d, r, off) {
							return
						}
					}
				}
			}
		}
	}
}

// Fill writes the content of the page with seed into the page at slot of a
// binding's regions.
func Fill(g *plan.Geometry, regions [][]byte, slot int, seed uint64) {
	n := g.Desc.ItemSize
	visit(g, slot, func(c, layer, head, token, d, r, off int) bool {
		Element(seed, c, layer, head, token, d, regions[r][off:off+n])
		return true
	})
}

// Verify checks every element of the page at slot of a binding's regions
// against the content of the page with seed, and describes the first
// element that differs.
func Verify(g *plan.Geometry, regions [][]byte, slot int, seed uint64) error {
	n := g.Desc.ItemSize
	want := make([]byte, n)
	var err error
	visit(g, slot, func(c, layer, head, token, d, r, off int) bool {
		Element(seed, c, layer, head, token, d, want)
		if got := regions[r][off : off+n]; !bytes.Equal(got, want) {
			err = fmt.Errorf("component %d layer %d head %d token %d element %d (region %s offset %d): got %x, want %x",
				c, layer, head, token, d, g.RegionNames[r], off, got, want)
			return false
		}
		return true
	})
	return err
}
