package plan

import (
	"fmt"
	"slices"

	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/runtime/kernel"
	"github.com/kvreshard/kvreshard/runtime/manifest"
)

// Fragment is a span of the writer's pool that forms the next bytes of its
// part: Len bytes at offset Src of region Region, relative to the page's
// slot.
type Fragment struct {
	Region int32
	Src    int
	Len    int
}

// WritePlan is how one writer rank writes its part of a page from its pool:
// fragments in part order, which concatenated are the part.
type WritePlan struct {
	Part      int
	PartBytes int
	Fragments []Fragment
	geo       *Geometry
}

// NewWritePlan plans writing part i of manifest m from the pool of
// binding b, which must hold exactly that part's layers, heads and tokens.
func NewWritePlan(m *manifest.Manifest, i int, b Binding, requireCompiled bool) (*WritePlan, error) {
	d := &m.Descriptor
	g, err := NewGeometry(d, b)
	if err != nil {
		return nil, err
	}
	if i < 0 || i >= len(m.Parts) {
		return nil, fmt.Errorf("part %d is not one of the manifest's %d parts", i, len(m.Parts))
	}
	part := m.Parts[i]
	if !slices.Equal(part.Layers, b.Layers) || part.HeadStart != b.HeadStart || part.HeadCount != b.Heads {
		return nil, fmt.Errorf("the writer holds layers %v heads [%d,%d), not part %d's layers %v heads [%d,%d)",
			b.Layers, b.HeadStart, b.HeadStart+b.Heads, i, part.Layers, part.HeadStart, part.HeadStart+part.HeadCount)
	}
	if bt, pt := b.Tokens.Norm(), part.TokenSet; !bt.Same(pt) {
		return nil, fmt.Errorf("the writer holds the tokens of cp rank %d of %d (interleave %d), not part %d's: cp rank %d of %d (interleave %d)",
			bt.CPRank, bt.CPSize, bt.Interleave, i, pt.CPRank, pt.CPSize, pt.Interleave)
	}
	dst, err := Layout(m)
	if err != nil {
		return nil, err
	}
	k := kernel.Lookup(kernel.Pair{Src: b.Layout.Identity(), Dst: dst.Identity()})
	if k == nil {
		if requireCompiled {
			return nil, fmt.Errorf("%w: %s -> %s", ErrNoKernel, b.Layout.Identity(), dst.Identity())
		}
		ir, err := ir.Lower(b.Layout, dst)
		if err != nil {
			return nil, err
		}
		k = kernel.Interpreter{IR: ir}.Kernels()
	}
	// Both sides hold the part's tokens: the problem of a page of that many.
	prob := kernel.Problem{
		ItemSize: d.ItemSize,
		PageSize: part.Tokens(d.PageSize),
		Dims:     d.HeadDims,
		Src:      kernel.Buffer{Layers: len(b.Layers), Heads: b.Heads, Slots: g.Slots},
		Dst:      kernel.Buffer{Layers: len(part.Layers), Heads: part.HeadCount, Slots: 1, Packed: true},
		Layers:   commonLayers(nil, b.Layers, part.Layers),
		Heads:    b.Heads,
	}
	wp := &WritePlan{Part: i, PartBytes: m.PartBytes(i), geo: g}
	next := 0
	for _, r := range k.Range(&prob, nil) {
		if r.Dst != next {
			return nil, fmt.Errorf("%w: the write runs of part %d skip or repeat part bytes at %d", ErrCoverage, i, next)
		}
		reg := int(r.SrcRegion)
		block, within := r.Src/g.BlockStride[reg], r.Src%g.BlockStride[reg]
		room := g.BlockBytes[reg]
		if g.BlockStride[reg] == g.BlockBytes[reg] {
			// Adjacent blocks (one slot) are one contiguous footprint, and
			// a run may cross from one into the next (as in Verify).
			room *= g.Blocks[reg] - block
		}
		if block >= g.Blocks[reg] || r.Len > room-within {
			return nil, fmt.Errorf("%w: a write run reads [%d,%d) of region %s, outside the page at slot 0", ErrBounds, r.Src, r.Src+r.Len, g.RegionNames[reg])
		}
		wp.Fragments = append(wp.Fragments, Fragment{Region: r.SrcRegion, Src: r.Src, Len: r.Len})
		next += r.Len
	}
	if next != wp.PartBytes {
		return nil, fmt.Errorf("%w: the write runs of part %d give %d of its %d bytes", ErrCoverage, i, next, wp.PartBytes)
	}
	return wp, nil
}

// Geometry returns the writer's pool geometry.
func (w *WritePlan) Geometry() *Geometry { return w.geo }

// Data appends to out the slices of regions that form the part of the page
// at slot: no bytes are copied.
func (w *WritePlan) Data(regions [][]byte, slot int, out [][]byte) [][]byte {
	for _, f := range w.Fragments {
		s := f.Src + slot*w.geo.SlotStride[f.Region]
		out = append(out, regions[f.Region][s:s+f.Len])
	}
	return out
}
