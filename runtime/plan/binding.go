// Package plan turns a page's manifest and a rank's memory binding into the
// exact byte ranges to move, and proves them before any transfer.
//
// Planning is target-driven: the reader's requirement (its layers, its KV-head
// interval, its tokens, every component) is intersected with every part of
// the manifest; each intersection is handed to the generated range kernel of
// the pair (manifest part layout, binding layout), or to the interpreter
// when this binary did not compile that pair. When the part and the
// binding hold different tokens (context parallelism), the kernel walks
// their common tokens: generated kernels of version 4 on, the interpreter
// for older ones. A plan's offsets are relative to the page's slot; a
// template is a plan cached per manifest ID, and instantiating it for a
// request adds the slot's offset to each op.
package plan

import (
	"fmt"
	"slices"

	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/runtime/manifest"
)

// Binding is where a rank's KV memory lives: a pool layout (many pages, one
// per slot) or a part layout (one page), the layers, KV heads and tokens it
// holds, and its slot count. It describes geometry only; the live buffers are
// supplied with each transfer. With C outermost, each component is its own
// region (SGLang keeps separate K and V buffers); otherwise there is one.
type Binding struct {
	Layout    *ir.Layout
	Layers    []int // global layer ids, ascending
	HeadStart int
	Heads     int
	Slots     int // pool pages; 1 for a part layout
	// Tokens is the rank's token set under context parallelism: a pool
	// page then holds page / CPSize tokens (the T extent). The zero
	// TokenSet is every token.
	Tokens manifest.TokenSet
}

// PageTokens returns the tokens of a page the binding holds: its T extent.
func (b *Binding) PageTokens(d *manifest.Descriptor) int { return b.Tokens.Tokens(d.PageSize) }

// Geometry is a binding checked against a descriptor, with its region sizes
// and the footprint of one page.
type Geometry struct {
	Binding
	Desc *manifest.Descriptor
	// Regions has the bytes of each region, RegionNames their names.
	Regions     []int
	RegionNames []string
	// SlotStride is what one slot adds to an offset in each region (0 for
	// a part layout).
	SlotStride []int
	// The bytes of the page at slot 0 in a region are Blocks blocks of
	// BlockBytes bytes, BlockStride apart (a pool with axes outside S, like
	// layer_first, has more than one block).
	Blocks      []int
	BlockBytes  []int
	BlockStride []int
	PageBytes   int // bytes of one page in the binding, all regions
}

// MaxPoolBytes bounds the regions of a binding (1 PiB, past any host's
// memory), so that no offset into them overflows.
const MaxPoolBytes = 1 << 50

// NewGeometry checks b against d.
func NewGeometry(d *manifest.Descriptor, b Binding) (*Geometry, error) {
	l := b.Layout
	if l == nil {
		return nil, fmt.Errorf("binding has no layout")
	}
	if err := checkLayout(d, l); err != nil {
		return nil, err
	}
	if len(b.Layers) == 0 {
		return nil, fmt.Errorf("binding holds no layers")
	}
	for i, x := range b.Layers {
		if !slices.Contains(d.Layers, x) {
			return nil, fmt.Errorf("binding layer %d is not a layer of the model", x)
		}
		if i > 0 && x <= b.Layers[i-1] {
			return nil, fmt.Errorf("binding layers are not strictly ascending at %d", x)
		}
	}
	if b.Heads <= 0 || b.HeadStart < 0 || b.HeadStart+b.Heads > d.KVHeads {
		return nil, fmt.Errorf("binding heads [%d,%d) are not inside the model's %d KV heads", b.HeadStart, b.HeadStart+b.Heads, d.KVHeads)
	}
	if b.Tokens != (manifest.TokenSet{}) {
		if err := b.Tokens.Norm().Check("binding", d.PageSize); err != nil {
			return nil, err
		}
		if f, n := l.SplitOf(ir.T), b.Tokens.Tokens(d.PageSize); f > 0 && n%f != 0 {
			return nil, fmt.Errorf("layout %s splits T by %d, which does not divide the %d tokens a rank of cp %d holds", l.Name, f, n, b.Tokens.CPSize)
		}
	}
	if l.Kind == ir.Part {
		b.Slots = 1
	} else if b.Slots <= 0 {
		return nil, fmt.Errorf("pool %s has %d slots; it needs at least one", l.Name, b.Slots)
	}
	g := &Geometry{Binding: b, Desc: d}
	nc := len(d.HeadDims)
	regions := 1
	if l.COuter() {
		regions = nc
	}
	for r := 0; r < regions; r++ {
		comps := []int{r}
		if !l.COuter() {
			comps = nil
			for c := 0; c < nc; c++ {
				comps = append(comps, c)
			}
		}
		size, slot, blocks, page := 1, 1, 1, 1
		inner := true
		for i := len(l.Modes) - 1; i >= 0; i-- {
			m := l.Modes[i]
			if m.Axis == ir.C && i == 0 {
				continue
			}
			n := extent(d, b, m, comps[0])
			if size > MaxPoolBytes/d.ItemSize/n {
				return nil, fmt.Errorf("pool %s of %d slots is more than %d bytes", l.Name, b.Slots, MaxPoolBytes)
			}
			size *= n
			switch {
			case m.Axis == ir.S:
				inner = false
			case inner:
				slot *= n
				page *= n
			default:
				blocks *= n
				page *= n
			}
		}
		it := d.ItemSize
		g.Regions = append(g.Regions, size*it)
		g.SlotStride = append(g.SlotStride, slot*it)
		g.BlockBytes = append(g.BlockBytes, slot*it)
		g.Blocks = append(g.Blocks, blocks)
		g.BlockStride = append(g.BlockStride, slot*b.Slots*it)
		g.PageBytes += page * it
		g.RegionNames = append(g.RegionNames, regionName(l, r, nc))
	}
	if l.Kind == ir.Part {
		for r := range g.Regions {
			g.SlotStride[r] = 0
			g.Blocks[r] = 1
			g.BlockBytes[r] = g.Regions[r]
			g.BlockStride[r] = g.Regions[r]
		}
	}
	return g, nil
}

// NewRegions allocates zeroed buffers for the binding's regions: a pool (or
// a one-page buffer) laid out as the binding says.
func (g *Geometry) NewRegions() [][]byte {
	out := make([][]byte, len(g.Regions))
	for i, n := range g.Regions {
		out[i] = make([]byte, n)
	}
	return out
}

// CheckRegions returns an error unless regions are buffers of the
// binding: one per region, each at least the region's size.
func (g *Geometry) CheckRegions(regions [][]byte) error {
	if len(regions) != len(g.Regions) {
		return fmt.Errorf("%d pool regions given; the binding has %d", len(regions), len(g.Regions))
	}
	for i, r := range regions {
		if len(r) < g.Regions[i] {
			return fmt.Errorf("pool region %s has %d bytes; the binding needs %d", g.RegionNames[i], len(r), g.Regions[i])
		}
	}
	return nil
}

// regionName names region r: k and v for separate K and V buffers, latent
// for an MLA latent, kv for one region that holds every component.
func regionName(l *ir.Layout, r, comps int) string {
	switch {
	case !l.COuter():
		return "kv"
	case comps == 1:
		return "latent"
	case r == 0:
		return "k"
	}
	return "v"
}

func extent(d *manifest.Descriptor, b Binding, m ir.Mode, c int) int {
	var n int
	switch m.Axis {
	case ir.C:
		return len(d.HeadDims)
	case ir.S:
		return b.Slots
	case ir.L:
		return len(b.Layers)
	case ir.H:
		return b.Heads
	case ir.T:
		n = b.PageTokens(d)
	case ir.D:
		n = d.HeadDims[c]
	}
	switch m.Split {
	case ir.Outer:
		return n / m.Factor
	case ir.Inner:
		return m.Factor
	}
	return n
}

// checkLayout returns why pages of d cannot be laid out in l, or nil.
func checkLayout(d *manifest.Descriptor, l *ir.Layout) error {
	if !l.COuter() {
		for _, dim := range d.HeadDims[1:] {
			if dim != d.HeadDims[0] {
				return fmt.Errorf("layout %s interleaves components (C is not outermost), so K and V head dims must be equal, not %v", l.Name, d.HeadDims)
			}
		}
	}
	if f := l.SplitOf(ir.D); f > 0 {
		for _, dim := range d.HeadDims {
			if dim%f != 0 {
				return fmt.Errorf("layout %s splits D by %d, which does not divide head dim %d", l.Name, f, dim)
			}
		}
	}
	if f := l.SplitOf(ir.T); f > 0 && d.PageSize%f != 0 {
		return fmt.Errorf("layout %s splits T by %d, which does not divide page size %d", l.Name, f, d.PageSize)
	}
	return nil
}
