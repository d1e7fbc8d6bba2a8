// Package kerneltest is an independent model of the layouts for tests: it
// places every element by evaluating a layout's order directly, one element
// at a time, with no loop nest, folding or merging. Kernels and the
// interpreter must agree with it byte for byte.
package kerneltest

import (
	"fmt"
	"slices"
	"sync"

	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/runtime/kernel"
)

// Buffer is one side of a transfer as the naive model sees it.
type Buffer struct {
	Layout    *ir.Layout
	Layers    []int // global layer ids, ascending
	HeadStart int
	Heads     int
	Slots     int // pool pages (pools only)
	Slot      int // the page's slot (pools only)
	Packed    bool
	// CP, CPRank and Interleave are the buffer's tokens under context
	// parallelism: runs of Interleave tokens dealt round-robin to CP ranks,
	// of which the buffer holds rank CPRank's (page/CP tokens). CP 0 or 1
	// is every token.
	CP, CPRank, Interleave int
}

// tokens returns the page's tokens b holds, in order, by the dealing's
// definition: token p belongs to CP rank (p / Interleave) % CP. They are
// counted, not computed, so that the model does not share the planner's
// arithmetic (manifest.TokenSet).
func (b *Buffer) tokens(page int) []int {
	k := tokenKey{page, max(b.CP, 1), b.CPRank, max(b.Interleave, 1)}
	if v, ok := tokenCache.Load(k); ok {
		return v.([]int)
	}
	var out []int
	for p := range page {
		if (p/k.interleave)%k.cp == k.rank%k.cp {
			out = append(out, p)
		}
	}
	tokenCache.Store(k, out)
	return out
}

type tokenKey struct{ page, cp, rank, interleave int }

var tokenCache sync.Map // tokenKey -> []int

// Tokens returns the tokens of a page of page tokens that b holds.
func (b *Buffer) Tokens(page int) int { return len(b.tokens(page)) }

// Local returns the index in b of the page's token p, and whether b holds
// it: its place among the tokens b holds.
func (b *Buffer) Local(page, p int) (int, bool) {
	ts := b.tokens(page)
	i, ok := slices.BinarySearch(ts, p)
	return i, ok
}

// Shape is what both sides share.
type Shape struct {
	ItemSize int
	PageSize int
	Dims     []int
}

// extent returns how many values mode m of b takes: the indices of its
// axis (component c's for D) counted through the mode's own index rule,
// modeIndex, not computed from the split factor, so that the model does
// not share the planner's arithmetic (plan's extent).
func (g *Shape) extent(b *Buffer, m ir.Mode, c int) int {
	var n int
	switch m.Axis {
	case ir.C:
		n = len(g.Dims)
	case ir.S:
		n = b.Slots
	case ir.L:
		n = len(b.Layers)
	case ir.H:
		n = b.Heads
	case ir.T:
		n = b.Tokens(g.PageSize)
	case ir.D:
		n = g.Dims[c]
	}
	k := extentKey{m.Split, m.Factor, n}
	if v, ok := extentCache.Load(k); ok {
		return v.(int)
	}
	seen := map[int]bool{}
	for i := range n {
		seen[modeIndex(m, i)] = true
	}
	extentCache.Store(k, len(seen))
	return len(seen)
}

type extentKey struct {
	split     ir.Split
	factor, n int
}

var extentCache sync.Map // extentKey -> int

// modeIndex returns the index of mode m of an element whose index along
// m's axis is i: i itself, or its quotient or remainder by the split
// factor.
func modeIndex(m ir.Mode, i int) int {
	switch m.Split {
	case ir.Outer:
		return i / m.Factor
	case ir.Inner:
		return i % m.Factor
	}
	return i
}

// Offset places element (c, layer index, head index, token, d) of b;
// token is b's local index.
func (g *Shape) Offset(b *Buffer, c, li, hi, t, d int) (region int, off int) {
	modes := b.Layout.Modes
	cOuter := b.Layout.COuter()
	if cOuter {
		modes = modes[1:]
	}
	for _, m := range modes {
		var idx int
		switch m.Axis {
		case ir.C:
			idx = c
		case ir.S:
			idx = b.Slot
		case ir.L:
			idx = li
		case ir.H:
			idx = hi
		case ir.T:
			idx = t
		case ir.D:
			idx = d
		}
		off = off*g.extent(b, m, c) + modeIndex(m, idx)
	}
	off *= g.ItemSize
	if cOuter {
		if !b.Packed {
			return c, off
		}
		for c2 := 0; c2 < c; c2++ {
			off += g.CompBytes(b, c2)
		}
	}
	return 0, off
}

// CompBytes is the size of component c's block in b (all of b for a layout
// whose outermost axis is not C).
func (g *Shape) CompBytes(b *Buffer, c int) int {
	n := g.ItemSize
	for _, m := range b.Layout.Modes {
		if m.Axis == ir.C && b.Layout.COuter() {
			continue
		}
		n *= g.extent(b, m, c)
	}
	return n
}

// Regions returns the size of each region of b.
func (g *Shape) Regions(b *Buffer) []int {
	if !b.Layout.COuter() {
		return []int{g.CompBytes(b, 0)}
	}
	if b.Packed {
		n := 0
		for c := range g.Dims {
			n += g.CompBytes(b, c)
		}
		return []int{n}
	}
	r := make([]int, len(g.Dims))
	for c := range g.Dims {
		r[c] = g.CompBytes(b, c)
	}
	return r
}

// Copy moves every common element from src to dst one element at a time,
// and fails if any destination byte would be written twice.
func (g *Shape) Copy(dst, src *Buffer, dstBufs, srcBufs [][]byte) (moved int, err error) {
	written := make([][]bool, len(dstBufs))
	for i := range written {
		written[i] = make([]bool, len(dstBufs[i]))
	}
	g.each(dst, src, func(c, si, di, h, st, dt, d int) {
		if err != nil {
			return
		}
		sr, so := g.Offset(src, c, si, h-src.HeadStart, st, d)
		dr, do := g.Offset(dst, c, di, h-dst.HeadStart, dt, d)
		for k := 0; k < g.ItemSize; k++ {
			if written[dr][do+k] {
				err = fmt.Errorf("destination byte %d of region %d written twice", do+k, dr)
				return
			}
			written[dr][do+k] = true
		}
		copy(dstBufs[dr][do:do+g.ItemSize], srcBufs[sr][so:so+g.ItemSize])
		moved += g.ItemSize
	})
	return moved, err
}

// MinRuns returns the fewest runs that move the common elements of src to
// dst: every moved element is a run of its own, less one for each element
// whose next byte on the source is the first byte of another moved element
// that also follows it on the destination, in the same regions. No run can
// be longer (a run is contiguous on both sides), and runs that continue
// each other on both sides merge, so this is exact, whatever order a kernel
// walks in.
func (g *Shape) MinRuns(dst, src *Buffer) int {
	// Where each element of the source went: the destination region and
	// offset, plus one; 0 for an element not moved.
	type place struct{ region, off int }
	at := make([][]place, 0)
	for _, n := range g.Regions(src) {
		at = append(at, make([]place, n/g.ItemSize))
	}
	n := 0
	g.each(dst, src, func(c, si, di, h, st, dt, d int) {
		sr, so := g.Offset(src, c, si, h-src.HeadStart, st, d)
		dr, do := g.Offset(dst, c, di, h-dst.HeadStart, dt, d)
		at[sr][so/g.ItemSize] = place{dr, do + 1}
		n++
	})
	for _, region := range at {
		for i := 1; i < len(region); i++ {
			a, b := region[i-1], region[i]
			if a.off > 0 && b.off > 0 && a.region == b.region && a.off+g.ItemSize == b.off {
				n--
			}
		}
	}
	return n
}

// each calls f for every element both buffers hold: component, layer index
// on each side, global head, token index on each side and element of the
// head.
func (g *Shape) each(dst, src *Buffer, f func(c, si, di, h, st, dt, d int)) {
	for c := range g.Dims {
		for si, layer := range src.Layers {
			di := slices.Index(dst.Layers, layer)
			if di < 0 {
				continue
			}
			for h := max(src.HeadStart, dst.HeadStart); h < min(src.HeadStart+src.Heads, dst.HeadStart+dst.Heads); h++ {
				for t := 0; t < g.PageSize; t++ {
					st, ok1 := src.Local(g.PageSize, t)
					dt, ok2 := dst.Local(g.PageSize, t)
					if !ok1 || !ok2 {
						continue
					}
					for d := 0; d < g.Dims[c]; d++ {
						f(c, si, di, h, st, dt, d)
					}
				}
			}
		}
	}
}

// Problem builds the kernel problem for the common elements of src and dst,
// with runs relative to slot 0. When either buffer holds a share of the
// tokens, the problem lists the common tokens.
func (g *Shape) Problem(src, dst *Buffer) *kernel.Problem {
	p := &kernel.Problem{
		ItemSize: g.ItemSize,
		PageSize: g.PageSize,
		Dims:     g.Dims,
		Src:      kernel.Buffer{Layers: len(src.Layers), Heads: src.Heads, Slots: max(src.Slots, 1), Packed: src.Packed},
		Dst:      kernel.Buffer{Layers: len(dst.Layers), Heads: dst.Heads, Slots: max(dst.Slots, 1), Packed: dst.Packed},
	}
	for si, layer := range src.Layers {
		if di := slices.Index(dst.Layers, layer); di >= 0 {
			p.Layers = append(p.Layers, kernel.LayerPair{Src: int32(si), Dst: int32(di)})
		}
	}
	h0 := max(src.HeadStart, dst.HeadStart)
	h1 := min(src.HeadStart+src.Heads, dst.HeadStart+dst.Heads)
	if h1 > h0 {
		p.Heads = h1 - h0
		p.SrcHead = h0 - src.HeadStart
		p.DstHead = h0 - dst.HeadStart
	}
	if max(src.CP, dst.CP) > 1 {
		p.Src.Tokens, p.Dst.Tokens = src.Tokens(g.PageSize), dst.Tokens(g.PageSize)
		p.Tokens = []kernel.TokenPair{}
		for t := 0; t < g.PageSize; t++ {
			st, ok1 := src.Local(g.PageSize, t)
			dt, ok2 := dst.Local(g.PageSize, t)
			if ok1 && ok2 {
				p.Tokens = append(p.Tokens, kernel.TokenPair{Src: int32(st), Dst: int32(dt)})
			}
		}
	}
	return p
}
