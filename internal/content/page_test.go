package content

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler/ir"
	_ "github.com/kvreshard/kvreshard/layouts"
	"github.com/kvreshard/kvreshard/runtime/kernel"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/testkit/kerneltest"
)

// Fill writes exactly one page's elements, at their places in the slot,
// and Verify passes it and names the first element that differs, in
// component, layer, head, token, element order, when two do.
func TestFillVerify(t *testing.T) {
	d := &manifest.Descriptor{Layers: []int{0, 1, 2}, KVHeads: 2, HeadDims: []int{4, 2}, Dtype: "fp16", ItemSize: 2, PageSize: 2}
	l, err := kernel.LayoutNamed("page_first") // C S T L H D
	require.NoError(t, err)
	g, err := plan.NewGeometry(d, plan.Binding{Layout: l, Layers: []int{1, 2}, HeadStart: 1, Heads: 1, Slots: 3})
	require.NoError(t, err)
	regions := g.NewRegions()
	seed := Seed("page")
	Fill(g, regions, 1, seed)
	require.NoError(t, Verify(g, regions, 1, seed))
	// Slot 1 of each region, and nothing else, was written: per slot,
	// 2 tokens x 2 layers x 1 head x dim elements of 2 bytes.
	for r, dim := range []int{4, 2} {
		slot := 2 * 2 * dim * 2
		require.Len(t, regions[r], 3*slot)
		require.Equal(t, make([]byte, slot), regions[r][:slot])
		require.Equal(t, make([]byte, slot), regions[r][2*slot:])
		require.NotEqual(t, make([]byte, slot), regions[r][slot:2*slot])
	}
	require.Error(t, Verify(g, regions, 0, seed))

	// Break the v element of token 1 layer 2 element 1, then the k element
	// of token 0 layer 2 element 3: k is checked first.
	want := func(c, layer, token, e int) []byte {
		b := make([]byte, 2)
		Element(seed, c, layer, 1, token, e, b)
		return b
	}
	vOff := 16 + (1*2+1)*2*2 + 1*2 // slot 1, token 1, layer 2 (index 1), element 1
	regions[1][vOff] ^= 1
	got := append([]byte(nil), want(1, 2, 1, 1)...)
	got[0] ^= 1
	require.EqualError(t, Verify(g, regions, 1, seed), fmt.Sprintf(
		"component 1 layer 2 head 1 token 1 element 1 (region v offset %d): got %x, want %x", vOff, got, want(1, 2, 1, 1)))
	kOff := 32 + (0*2+1)*4*2 + 3*2 // slot 1, token 0, layer 2, element 3
	regions[0][kOff+1] ^= 0x80
	got = append([]byte(nil), want(0, 2, 0, 3)...)
	got[1] ^= 0x80
	require.EqualError(t, Verify(g, regions, 1, seed), fmt.Sprintf(
		"component 0 layer 2 head 1 token 0 element 3 (region k offset %d): got %x, want %x", kOff, got, want(0, 2, 0, 3)))
}

// TestPlaceAgreesWithModel: Fill's placement of every element equals that
// of kerneltest's model (which places by enumerating the layout's tokens),
// for every built-in pool and part layout, with layers, heads, slots and
// context parallelism of its own.
func TestPlaceAgreesWithModel(t *testing.T) {
	d := &manifest.Descriptor{Layers: []int{3, 4, 5, 7}, KVHeads: 4, HeadDims: []int{8, 4}, Dtype: "bf16", ItemSize: 2, PageSize: 8}
	for _, name := range kernel.LayoutNames() {
		l, err := kernel.LayoutNamed(name)
		require.NoError(t, err)
		for _, ts := range []manifest.TokenSet{{}, {CPSize: 2, CPRank: 1, Interleave: 1}, {CPSize: 2, CPRank: 0, Interleave: 2}, {CPSize: 4, CPRank: 3, Interleave: 2}} {
			slots := 3
			if l.Kind == ir.Part {
				slots = 1
			}
			g, err := plan.NewGeometry(d, plan.Binding{Layout: l, Layers: []int{4, 7}, HeadStart: 1, Heads: 2, Slots: slots, Tokens: ts})
			if err != nil {
				continue // a split the CP share does not allow
			}
			kg := kerneltest.Shape{ItemSize: d.ItemSize, PageSize: d.PageSize, Dims: d.HeadDims}
			b := &kerneltest.Buffer{Layout: l, Layers: g.Layers, HeadStart: g.HeadStart, Heads: g.Heads, Slots: g.Slots, Slot: g.Slots - 1,
				CP: ts.CPSize, CPRank: ts.CPRank, Interleave: ts.Interleave}
			n := 0
			visit(g, g.Slots-1, func(c, layer, head, token, e, region, off int) bool {
				li := slices.Index(g.Layers, layer)
				lt, ok := b.Local(d.PageSize, token)
				require.True(t, ok, "%s %+v: token %d", name, ts, token)
				r, o := kg.Offset(b, c, li, head-g.HeadStart, lt, e)
				require.Equal(t, [2]int{r, o}, [2]int{region, off}, "%s %+v: component %d layer %d head %d token %d element %d", name, ts, c, layer, head, token, e)
				n++
				return true
			})
			require.Equal(t, g.PageBytes/d.ItemSize, n, "%s %+v", name, ts)
		}
	}
}
