package kerneltest

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"

	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/runtime/kernel"
)

// Case is one random transfer between two layouts.
type Case struct {
	Shape
	Src, Dst Buffer
}

func (c *Case) String() string {
	s := fmt.Sprintf("%s -> %s: item %d page %d dims %v; src layers %v heads [%d,+%d) slots %d/%d packed %v; dst layers %v heads [%d,+%d) slots %d/%d packed %v",
		c.Src.Layout.Name, c.Dst.Layout.Name, c.ItemSize, c.PageSize, c.Dims,
		c.Src.Layers, c.Src.HeadStart, c.Src.Heads, c.Src.Slot, c.Src.Slots, c.Src.Packed,
		c.Dst.Layers, c.Dst.HeadStart, c.Dst.Heads, c.Dst.Slot, c.Dst.Slots, c.Dst.Packed)
	if max(c.Src.CP, c.Dst.CP) > 1 {
		s += fmt.Sprintf("; tokens: src cp %d rank %d interleave %d, dst cp %d rank %d interleave %d",
			c.Src.CP, c.Src.CPRank, c.Src.Interleave, c.Dst.CP, c.Dst.CPRank, c.Dst.Interleave)
	}
	return s
}

// RandomTokens gives each side of c a random token set (context
// parallelism): a CP size and an interleave whose product divides the page
// and leaves each rank a multiple of its layout's T split, and a random CP
// rank; one side in four keeps every token. The page grows when it must,
// so that most cases share a share of the tokens.
func RandomTokens(r *rand.Rand, c *Case) {
	tsplit := lcm(c.Src.Layout.SplitOf(ir.T), c.Dst.Layout.SplitOf(ir.T))
	// A page of tsplit x 2^a x 3^b tokens, so that CP sizes and interleaves
	// of 1 to 4 and 6 fit often.
	c.PageSize = tsplit * []int{4, 8, 12, 16, 24}[r.IntN(5)]
	for _, b := range []*Buffer{&c.Src, &c.Dst} {
		b.CP, b.CPRank, b.Interleave = 0, 0, 0
		if r.IntN(4) == 0 {
			continue
		}
		for {
			cp := 1 + r.IntN(6)
			il := []int{1, 1, 2, 3, 4, 8}[r.IntN(6)]
			if c.PageSize%(cp*il*tsplit) == 0 {
				b.CP, b.Interleave, b.CPRank = cp, il, r.IntN(cp)
				break
			}
		}
	}
}

// RandomCase draws a geometry for a transfer from src to dst: page sizes 1
// to 128, layer subsets that need not be contiguous, head intervals at any
// offset, odd head dims, item sizes 1, 2 and 4, and K and V head dims that
// differ where both layouts have C outermost. Parts are packed (store
// parts) unless they are the destination of a read, which may be either.
func RandomCase(r *rand.Rand, src, dst *ir.Layout) *Case {
	c := &Case{}
	c.ItemSize = []int{1, 2, 4}[r.IntN(3)]
	c.PageSize = 1 + r.IntN(128)
	if r.IntN(2) == 0 {
		c.PageSize = 1 + r.IntN(16)
	}
	// Both layouts' splits divide the page and the head dims.
	split := lcm(src.SplitOf(ir.D), dst.SplitOf(ir.D))
	tsplit := lcm(src.SplitOf(ir.T), dst.SplitOf(ir.T))
	c.PageSize = (c.PageSize + tsplit - 1) / tsplit * tsplit
	nc := 2
	if r.IntN(8) == 0 {
		nc = 1 // an MLA latent
	}
	c.Dims = make([]int, nc)
	c.Dims[0] = split * (1 + r.IntN(24/split+1))
	for i := 1; i < nc; i++ {
		c.Dims[i] = c.Dims[0]
		if src.COuter() && dst.COuter() && r.IntN(2) == 0 {
			c.Dims[i] = split * (1 + r.IntN(24/split+1))
		}
	}
	layers := 1 + r.IntN(10)
	heads := 1 + r.IntN(8)
	c.Src = randomBuffer(r, src, layers, heads)
	c.Dst = randomBuffer(r, dst, layers, heads)
	c.Src.Packed = src.Kind == ir.Part
	c.Dst.Packed = dst.Kind == ir.Part && (src.Kind == ir.Pool || r.IntN(2) == 0)
	// Make sure there is something in common most of the time.
	if r.IntN(8) != 0 {
		common := c.Src.Layers[r.IntN(len(c.Src.Layers))]
		if !slices.Contains(c.Dst.Layers, common) {
			c.Dst.Layers = append(c.Dst.Layers, common)
			sort.Ints(c.Dst.Layers)
		}
		if c.Dst.HeadStart >= c.Src.HeadStart+c.Src.Heads || c.Src.HeadStart >= c.Dst.HeadStart+c.Dst.Heads {
			c.Dst.HeadStart, c.Dst.Heads = c.Src.HeadStart, 1+r.IntN(c.Src.Heads)
		}
	}
	return c
}

// RandomOrder returns a random valid order of a layout of the given kind:
// the axes in any order (C anywhere, S anywhere in a pool), with T and D
// each split, half of the time, by its factor in factors (none when 0),
// the X%f half somewhere after the X/f half.
func RandomOrder(r *rand.Rand, kind ir.Kind, factors map[string]int) string {
	axes := []string{"C", "T", "L", "H", "D"}
	if kind == ir.Pool {
		axes = append(axes, "S")
	}
	r.Shuffle(len(axes), func(i, j int) { axes[i], axes[j] = axes[j], axes[i] })
	for _, a := range []string{"T", "D"} {
		f := factors[a]
		if f == 0 || r.IntN(2) == 0 {
			continue
		}
		i := slices.Index(axes, a)
		axes[i] = fmt.Sprintf("%s/%d", a, f)
		j := i + 1 + r.IntN(len(axes)-i)
		axes = slices.Insert(axes, j, fmt.Sprintf("%s%%%d", a, f))
	}
	return strings.Join(axes, " ")
}

// lcm returns the least common multiple of the split factors a and b, 0 for
// none.
func lcm(a, b int) int {
	a, b = max(a, 1), max(b, 1)
	g, h := a, b
	for h != 0 {
		g, h = h, g%h
	}
	return a / g * b
}

// MinRuns is the fewest runs of the case (see Geometry.MinRuns).
func (c *Case) MinRuns() int { return c.Shape.MinRuns(&c.Dst, &c.Src) }

// LargeCase is a transfer of kernel.StreamBytes or more, so that copy kernels
// move their rows with kernel.Stream2D: bf16, head dims 128, 64 tokens, 8
// layers, heads 2 to 5 of 8 on the part side; pools have 2 slots.
func LargeCase(src, dst *ir.Layout) *Case {
	// Splits that do not divide 64 tokens or 128 elements round them up.
	tf := lcm(src.SplitOf(ir.T), dst.SplitOf(ir.T))
	df := lcm(src.SplitOf(ir.D), dst.SplitOf(ir.D))
	page, dim := (64+tf-1)/tf*tf, (128+df-1)/df*df
	c := &Case{Shape: Shape{ItemSize: 2, PageSize: page, Dims: []int{dim, dim}}}
	buf := func(l *ir.Layout, headStart, heads int) Buffer {
		b := Buffer{Layout: l, Layers: []int{0, 1, 2, 3, 4, 5, 6, 7}, HeadStart: headStart, Heads: heads, Slots: 1, Packed: l.Kind == ir.Part}
		if l.Kind == ir.Pool {
			b.Slots, b.Slot = 2, 1
		}
		return b
	}
	c.Src, c.Dst = buf(src, 2, 4), buf(dst, 0, 8)
	if src.Kind == ir.Pool {
		c.Src, c.Dst = buf(src, 0, 8), buf(dst, 2, 4)
	}
	return c
}

func randomBuffer(r *rand.Rand, l *ir.Layout, layers, heads int) Buffer {
	b := Buffer{Layout: l, Slots: 1}
	switch r.IntN(3) {
	case 0: // all layers
		for i := 0; i < layers; i++ {
			b.Layers = append(b.Layers, i)
		}
	case 1: // a contiguous stage
		lo := r.IntN(layers)
		hi := lo + 1 + r.IntN(layers-lo)
		for i := lo; i < hi; i++ {
			b.Layers = append(b.Layers, i)
		}
	default: // any subset
		for i := 0; i < layers; i++ {
			if r.IntN(2) == 0 {
				b.Layers = append(b.Layers, i)
			}
		}
		if len(b.Layers) == 0 {
			b.Layers = []int{r.IntN(layers)}
		}
	}
	b.HeadStart = r.IntN(heads)
	b.Heads = 1 + r.IntN(heads-b.HeadStart)
	if l.Kind == ir.Pool {
		b.Slots = 1 + r.IntN(3)
		b.Slot = r.IntN(b.Slots)
	}
	return b
}

// Buffers returns regions of src filled with random bytes and regions of dst
// filled with a sentinel.
func (c *Case) Buffers(r *rand.Rand) (src, dst [][]byte) {
	for _, n := range c.Regions(&c.Src) {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		src = append(src, b)
	}
	return src, c.Blank()
}

// Blank returns destination regions filled with the sentinel 0xEE.
func (c *Case) Blank() [][]byte {
	var dst [][]byte
	for _, n := range c.Regions(&c.Dst) {
		dst = append(dst, bytes.Repeat([]byte{0xEE}, n))
	}
	return dst
}

// SlotOffsets returns, per region, what the slot of each side adds to every
// offset of a run computed for slot 0.
func (c *Case) SlotOffsets(b *Buffer) []int {
	n := len(c.Regions(b))
	out := make([]int, n)
	if b.Layout.Kind != ir.Pool || b.Slot == 0 {
		return out
	}
	at0 := *b
	at0.Slot = 0
	for comp := range c.Dims {
		r, off := c.Offset(b, comp, 0, 0, 0, 0)
		_, off0 := c.Offset(&at0, comp, 0, 0, 0, 0)
		out[r] = off - off0
	}
	return out
}

// Apply moves bytes along runs computed for slot 0, at the case's slots, and
// fails on a run out of bounds or a destination byte written twice.
func (c *Case) Apply(runs []kernel.Run, dst, src [][]byte) (moved int, err error) {
	so, do := c.SlotOffsets(&c.Src), c.SlotOffsets(&c.Dst)
	written := make([][]bool, len(dst))
	for i := range dst {
		written[i] = make([]bool, len(dst[i]))
	}
	for _, r := range runs {
		s, d := r.Src+so[r.SrcRegion], r.Dst+do[r.DstRegion]
		if r.Len <= 0 || s < 0 || d < 0 || s+r.Len > len(src[r.SrcRegion]) || d+r.Len > len(dst[r.DstRegion]) {
			return moved, fmt.Errorf("run %+v out of bounds", r)
		}
		for k := d; k < d+r.Len; k++ {
			if written[r.DstRegion][k] {
				return moved, fmt.Errorf("run %+v writes byte %d twice", r, k)
			}
			written[r.DstRegion][k] = true
		}
		copy(dst[r.DstRegion][d:d+r.Len], src[r.SrcRegion][s:s+r.Len])
		moved += r.Len
	}
	return moved, nil
}

// Naive moves the case's bytes one element at a time.
func (c *Case) Naive(dst, src [][]byte) (int, error) {
	return c.Copy(&c.Dst, &c.Src, dst, src)
}

// Problem is the kernel problem of the case.
func (c *Case) Problem() *kernel.Problem { return c.Shape.Problem(&c.Src, &c.Dst) }

// Shift returns region slices that start at each side's slot, so that a
// copy kernel, which works relative to slot 0, lands on the case's slot.
func (c *Case) Shift(b *Buffer, regions [][]byte) [][]byte {
	offs := c.SlotOffsets(b)
	out := make([][]byte, len(regions))
	for i := range regions {
		out[i] = regions[i][offs[i]:]
	}
	return out
}
