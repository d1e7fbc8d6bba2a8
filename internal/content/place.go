package content

import (
	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/runtime/plan"
)

// place is where the elements of a binding's page at one slot lie: the
// layout's order evaluated for each element, with the extents the
// binding holds. It is verification's own placement, not the planner's
// or the kernels' (the tests check it against kerneltest's model, which
// places elements by enumeration).
type place struct {
	g      *plan.Geometry
	slot   int
	tokens int // tokens of a page the binding holds
}

// extent returns how many values mode m takes in component c.
func (p *place) extent(m ir.Mode, c int) int {
	var n int
	switch m.Axis {
	case ir.C:
		return len(p.g.Desc.HeadDims)
	case ir.S:
		return p.g.Slots
	case ir.L:
		return len(p.g.Layers)
	case ir.H:
		return p.g.Heads
	case ir.T:
		n = p.tokens
	case ir.D:
		n = p.g.Desc.HeadDims[c]
	}
	switch m.Split {
	case ir.Outer:
		return n / m.Factor
	case ir.Inner:
		return m.Factor
	}
	return n
}

// offset returns the region and byte offset of element (c, layer index
// li, head index h, local token t, d).
func (p *place) offset(c, li, h, t, d int) (region, off int) {
	l := p.g.Layout
	split := l.COuter() // each component a region of its own
	if split {
		region = c
	}
	off = l.ElementOffset(func(m ir.Mode) int {
		if split && m.Axis == ir.C {
			return 1
		}
		return p.extent(m, c)
	}, func(a ir.Axis) int {
		switch a {
		case ir.C:
			if split {
				return 0
			}
			return c
		case ir.S:
			return p.slot
		case ir.L:
			return li
		case ir.H:
			return h
		case ir.T:
			return t
		}
		return d
	})
	return region, off * p.g.Desc.ItemSize
}

// tokens returns the page's tokens a token set holds, in order: token p
// belongs to CP rank (p / interleave) % cp (the dealing's definition,
// counted here rather than computed).
func tokens(page, cp, rank, interleave int) []int {
	cp, interleave = max(cp, 1), max(interleave, 1)
	var out []int
	for p := range page {
		if (p/interleave)%cp == rank%cp {
			out = append(out, p)
		}
	}
	return out
}
