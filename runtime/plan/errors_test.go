package plan_test

import (
	"errors"
	"math"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
)

// smallPool is one part of 128 bytes (2 layers, 2 heads, head dim 4, fp16,
// 2 tokens, PLHD) read whole into a layer_first pool of slots pages. Each of
// the regions k and v holds, per layer, a block of 32 bytes per slot: the
// page at slot 0 is [0,32) and [32*slots, 32*slots+32).
func smallPool(t *testing.T, slots int, opts plan.Options) (*manifest.Manifest, *plan.Planner) {
	t.Helper()
	s := scenario{d: desc(2, 2, []int{4, 4}, "fp16", 2), src: placement.Topology{TP: 1, PP: 1}, srcL: builtin(t, "PLHD"),
		dst: placement.Topology{TP: 1, PP: 1}, dstL: builtin(t, "layer_first"), slots: slots, opts: opts}
	m, p := s.build(t)
	require.Equal(t, 128, m.PartBytes(0))
	g := p.Geometry()
	require.Equal(t, []int{2, 2}, g.Blocks)
	require.Equal(t, []int{32, 32}, g.BlockBytes)
	require.Equal(t, []int{32 * slots, 32 * slots}, g.BlockStride)
	require.Equal(t, 128, g.PageBytes)
	return m, p
}

// TestVerifyErrors hands Verify plans written by hand, each wrong in one
// way, and checks the sentinel and the exact text of each error.
func TestVerifyErrors(t *testing.T) {
	m, p := smallPool(t, 3, plan.Options{})
	good, err := p.Build(m)
	require.NoError(t, err)
	require.NoError(t, p.Verify(good))
	one := func(op plan.Op) []plan.Op { return []plan.Op{op} }
	for _, c := range []struct {
		name string
		ops  []plan.Op
		is   error
		want string
	}{
		{"odd src", one(plan.Op{Src: 1, Len: 2}), plan.ErrAlignment,
			"plan op not aligned to the item size: op 0 (part 0, src 1, dst 0, len 2) with item size 2"},
		{"odd dst", one(plan.Op{Dst: 3, Len: 2}), plan.ErrAlignment,
			"plan op not aligned to the item size: op 0 (part 0, src 0, dst 3, len 2) with item size 2"},
		{"odd len", []plan.Op{{Len: 2}, {Src: 2, Dst: 2, Len: 3}}, plan.ErrAlignment,
			"plan op not aligned to the item size: op 1 (part 0, src 2, dst 2, len 3) with item size 2"},
		{"empty op", one(plan.Op{Len: 0}), plan.ErrAlignment,
			"plan op not aligned to the item size: op 0 (part 0, src 0, dst 0, len 0) with item size 2"},
		{"negative len", one(plan.Op{Src: 4, Len: -2}), plan.ErrAlignment,
			"plan op not aligned to the item size: op 0 (part 0, src 4, dst 0, len -2) with item size 2"},
		{"part index", one(plan.Op{Part: 1, Len: 2}), plan.ErrBounds,
			"plan op out of bounds: op 0 reads part 1 of 1"},
		{"negative part", one(plan.Op{Part: -1, Len: 2}), plan.ErrBounds,
			"plan op out of bounds: op 0 reads part -1 of 1"},
		{"past part end", one(plan.Op{Src: 126, Len: 4}), plan.ErrBounds,
			"plan op out of bounds: op 0 reads [126,130) of part 0, which has 128 bytes"},
		{"before part start", one(plan.Op{Src: -2, Len: 2}), plan.ErrBounds,
			"plan op out of bounds: op 0 reads [-2,0) of part 0, which has 128 bytes"},
		{"src end overflows", one(plan.Op{Src: math.MaxInt - 1, Len: 2}), plan.ErrBounds,
			"plan op out of bounds: op 0 reads [9223372036854775806,-9223372036854775808) of part 0, which has 128 bytes"},
		{"len overflows", one(plan.Op{Src: 4, Dst: 4, Len: math.MaxInt - 3}), plan.ErrBounds,
			"plan op out of bounds: op 0 reads [4,-9223372036854775808) of part 0, which has 128 bytes"},
		{"region index", one(plan.Op{Region: 2, Len: 2}), plan.ErrBounds,
			"plan op out of bounds: op 0 writes region 2 of 2"},
		{"negative region", one(plan.Op{Region: -1, Len: 2}), plan.ErrBounds,
			"plan op out of bounds: op 0 writes region -1 of 2"},
		{"slot 1", one(plan.Op{Dst: 32, Len: 2}), plan.ErrBounds,
			"plan op out of bounds: op 0 writes [32,34) of region k, outside the page at slot 0"},
		{"across a block end", one(plan.Op{Dst: 30, Len: 4}), plan.ErrBounds,
			"plan op out of bounds: op 0 writes [30,34) of region k, outside the page at slot 0"},
		{"across layer blocks", one(plan.Op{Region: 1, Src: 64, Dst: 100, Len: 30}), plan.ErrBounds,
			"plan op out of bounds: op 0 writes [100,130) of region v, outside the page at slot 0"},
		{"past the last block", one(plan.Op{Dst: 192, Len: 2}), plan.ErrBounds,
			"plan op out of bounds: op 0 writes [192,194) of region k, outside the page at slot 0"},
		{"before the region", one(plan.Op{Dst: -2, Len: 2}), plan.ErrBounds,
			"plan op out of bounds: op 0 writes [-2,0) of region k, outside the page at slot 0"},
		{"overlap", []plan.Op{{Len: 4}, {Src: 4, Dst: 2, Len: 4}}, plan.ErrOverlap,
			"plan writes a destination byte twice: op 1 writes byte 2 of region k again"},
		{"overlap in layer 1 of v", []plan.Op{{Region: 1, Dst: 96, Len: 8}, {Region: 1, Src: 8, Dst: 104, Len: 4}, {Region: 1, Src: 12, Dst: 102, Len: 4}}, plan.ErrOverlap,
			"plan writes a destination byte twice: op 2 writes byte 102 of region v again"},
		{"same op twice", []plan.Op{{Len: 32}, {Len: 32}}, plan.ErrOverlap,
			"plan writes a destination byte twice: op 1 writes byte 0 of region k again"},
		{"short", one(plan.Op{Len: 2}), plan.ErrCoverage,
			"plan does not cover the requirement: the ops write 2 of the page's 128 bytes"},
		{"no ops", nil, plan.ErrCoverage,
			"plan does not cover the requirement: the ops write 0 of the page's 128 bytes"},
		{"a byte missing", append(append([]plan.Op{}, good.Ops[1:]...), plan.Op{Len: good.Ops[0].Len - 2}), plan.ErrCoverage,
			"plan does not cover the requirement: the ops write 126 of the page's 128 bytes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			bytes := 0
			for _, op := range c.ops {
				bytes += op.Len
			}
			err := p.Verify(&plan.Plan{ManifestID: m.ID(), Manifest: m, Ops: c.ops, Bytes: bytes})
			require.ErrorIs(t, err, c.is)
			require.EqualError(t, err, c.want)
			for _, other := range []error{plan.ErrAlignment, plan.ErrBounds, plan.ErrOverlap, plan.ErrCoverage, plan.ErrLimit} {
				if other != c.is {
					require.False(t, errors.Is(err, other), "also %v", other)
				}
			}
		})
	}

	t.Run("a plan that claims fewer bytes than its ops write", func(t *testing.T) {
		_, p := smallPool(t, 3, plan.Options{MaxBytes: 64})
		lie := &plan.Plan{ManifestID: m.ID(), Manifest: m, Ops: good.Ops, Bytes: 64}
		err := p.Verify(lie)
		require.ErrorIs(t, err, plan.ErrCoverage)
		require.EqualError(t, err, "plan does not cover the requirement: the plan says 64 bytes but its ops write 128")
	})
}

// TestVerifyOneSlot checks that a run may cross adjacent blocks of a pool
// of one slot, and not of a pool of three.
func TestVerifyOneSlot(t *testing.T) {
	ops := []plan.Op{{Len: 64}, {Src: 64, Region: 1, Len: 64}}
	m, p := smallPool(t, 1, plan.Options{})
	require.NoError(t, p.Verify(&plan.Plan{Manifest: m, Ops: ops, Bytes: 128}))
	m, p = smallPool(t, 3, plan.Options{})
	err := p.Verify(&plan.Plan{Manifest: m, Ops: ops, Bytes: 128})
	require.ErrorIs(t, err, plan.ErrBounds)
	require.EqualError(t, err, "plan op out of bounds: op 0 writes [0,64) of region k, outside the page at slot 0")

	// A whole page in one run per component: LPHD read whole into
	// layer_first with one slot, and with page size 1 from PLHD.
	for _, s := range []scenario{
		{d: desc(4, 2, []int{8, 8}, "bf16", 4), srcL: builtin(t, "LPHD"), dstL: builtin(t, "layer_first")},
		{d: desc(4, 2, []int{8, 4}, "fp32", 1), srcL: builtin(t, "PLHD"), dstL: builtin(t, "layer_first")},
	} {
		s.src, s.dst, s.slots = placement.Topology{TP: 1, PP: 1}, placement.Topology{TP: 1, PP: 1}, 1
		_, _, tpl := s.check(t)
		require.Len(t, tpl.Ops, 2)
	}
}

// TestLimits checks MaxOps and MaxBytes, through Build and Verify, at and
// just under the plan's size.
func TestLimits(t *testing.T) {
	m, p := smallPool(t, 3, plan.Options{})
	pl, err := p.Build(m)
	require.NoError(t, err)
	n := len(pl.Ops)
	require.Greater(t, n, 1)
	for _, c := range []struct {
		opts plan.Options
		want string
	}{
		{plan.Options{MaxOps: n}, ""},
		{plan.Options{MaxOps: n - 1}, "plan over its limits: " + strconv.Itoa(n) + " ops; the limit is " + strconv.Itoa(n-1)},
		{plan.Options{MaxBytes: 128}, ""},
		{plan.Options{MaxBytes: 127}, "plan over its limits: 128 bytes; the limit is 127"},
		{plan.Options{MaxOps: 1, MaxBytes: 1}, "plan over its limits: " + strconv.Itoa(n) + " ops; the limit is 1"},
	} {
		_, p := smallPool(t, 3, c.opts)
		got, err := p.Build(m)
		verr := p.Verify(pl)
		if c.want == "" {
			require.NoError(t, err)
			require.NoError(t, verr)
			require.Equal(t, pl.Ops, got.Ops)
			continue
		}
		require.Nil(t, got)
		require.ErrorIs(t, err, plan.ErrLimit)
		require.EqualError(t, err, c.want)
		require.ErrorIs(t, verr, plan.ErrLimit)
		require.EqualError(t, verr, c.want)
		_, err = p.Template(m)
		require.EqualError(t, err, c.want)
	}
}

// TestIncompatibleManifest reads a page of another geometry.
func TestIncompatibleManifest(t *testing.T) {
	_, p := smallPool(t, 3, plan.Options{})
	tokens := desc(2, 2, []int{4, 4}, "fp16", 4) // 4 tokens, not 2
	draft := desc(2, 2, []int{4, 4}, "fp16", 2)
	draft.DraftLayers = 1 // layer 1 a draft layer
	for _, d := range []manifest.Descriptor{tokens, draft} {
		model := manifest.Model{Namespace: "test", ModelID: "other", Descriptor: d}
		other, err := plan.ManifestFor(model.Domain(), &d, placement.Topology{TP: 1, PP: 1}, builtin(t, "PLHD"))
		require.NoError(t, err)
		for _, build := range []func(*manifest.Manifest) (*plan.Plan, error){p.Build, p.Template} {
			pl, err := build(other)
			require.Nil(t, pl)
			require.ErrorIs(t, err, plan.ErrIncompatible)
			require.EqualError(t, err, "manifest does not match the reader's model: manifest "+other.ID()+" describes another page geometry")
		}
	}
}

// TestBindingErrors checks every reason NewGeometry and NewPlanner refuse a
// binding, with its exact text.
func TestBindingErrors(t *testing.T) {
	cl := custom(t)
	pf := builtin(t, "page_first")
	lf := builtin(t, "layer_first")
	d := desc(4, 4, []int{8, 8}, "bf16", 4)
	kv := desc(4, 4, []int{8, 4}, "bf16", 4)
	odd := desc(4, 4, []int{6, 6}, "bf16", 3)
	for _, c := range []struct {
		name string
		d    manifest.Descriptor
		b    plan.Binding
		want string
	}{
		{"no layout", d, plan.Binding{Layers: []int{0}, Heads: 1, Slots: 1}, "binding has no layout"},
		{"no layers", d, plan.Binding{Layout: pf, Heads: 1, Slots: 1}, "binding holds no layers"},
		{"layer not in model", d, plan.Binding{Layout: pf, Layers: []int{2, 4}, Heads: 1, Slots: 1}, "binding layer 4 is not a layer of the model"},
		{"negative layer", d, plan.Binding{Layout: pf, Layers: []int{-1}, Heads: 1, Slots: 1}, "binding layer -1 is not a layer of the model"},
		{"layers descending", d, plan.Binding{Layout: pf, Layers: []int{1, 0}, Heads: 1, Slots: 1}, "binding layers are not strictly ascending at 0"},
		{"layer twice", d, plan.Binding{Layout: pf, Layers: []int{1, 2, 2}, Heads: 1, Slots: 1}, "binding layers are not strictly ascending at 2"},
		{"heads past the end", d, plan.Binding{Layout: pf, Layers: []int{0}, HeadStart: 3, Heads: 2, Slots: 1}, "binding heads [3,5) are not inside the model's 4 KV heads"},
		{"no heads", d, plan.Binding{Layout: pf, Layers: []int{0}, HeadStart: 1, Slots: 1}, "binding heads [1,1) are not inside the model's 4 KV heads"},
		{"negative head start", d, plan.Binding{Layout: pf, Layers: []int{0}, HeadStart: -1, Heads: 2, Slots: 1}, "binding heads [-1,1) are not inside the model's 4 KV heads"},
		{"zero slots", d, plan.Binding{Layout: pf, Layers: []int{0}, Heads: 1}, "pool page_first has 0 slots; it needs at least one"},
		{"negative slots", d, plan.Binding{Layout: cl["host"], Layers: []int{0}, Heads: 1, Slots: -2}, "pool host has -2 slots; it needs at least one"},
		{"pool past MaxPoolBytes", d, plan.Binding{Layout: pf, Layers: []int{0}, Heads: 1, Slots: math.MaxInt}, "pool page_first of 9223372036854775807 slots is more than 1125899906842624 bytes"},
		{"pool past MaxPoolBytes, layer_first", d, plan.Binding{Layout: lf, Layers: []int{0, 1}, Heads: 2, Slots: 1 << 48}, "pool layer_first of 281474976710656 slots is more than 1125899906842624 bytes"},
		{"k and v dims differ, C inside", kv, plan.Binding{Layout: cl["host"], Layers: []int{0}, Heads: 1, Slots: 1},
			"layout host interleaves components (C is not outermost), so K and V head dims must be equal, not [8 4]"},
		{"k and v dims differ, part", kv, plan.Binding{Layout: cl["flash"], Layers: []int{0}, Heads: 1},
			"layout flash interleaves components (C is not outermost), so K and V head dims must be equal, not [8 4]"},
		{"D split does not divide", odd, plan.Binding{Layout: cl["xpool"], Layers: []int{0}, Heads: 1, Slots: 1},
			"layout xpool splits D by 4, which does not divide head dim 6"},
		{"T split does not divide", odd, plan.Binding{Layout: cl["tblock"], Layers: []int{0}, Heads: 1},
			"layout tblock splits T by 2, which does not divide page size 3"},
	} {
		t.Run(c.name, func(t *testing.T) {
			g, err := plan.NewGeometry(&c.d, c.b)
			require.Nil(t, g)
			require.EqualError(t, err, c.want)
			p, err := plan.NewPlanner(&c.d, c.b, plan.Options{})
			require.Nil(t, p)
			require.EqualError(t, err, c.want)
		})
	}

	t.Run("valid", func(t *testing.T) {
		// A part binding ignores Slots; K and V dims may differ with C outermost.
		g, err := plan.NewGeometry(&kv, plan.Binding{Layout: builtin(t, "HPLD"), Layers: []int{1, 3}, HeadStart: 1, Heads: 3})
		require.NoError(t, err)
		require.Equal(t, 1, g.Slots)
		require.Equal(t, []int{2 * 3 * 4 * 8 * 2, 2 * 3 * 4 * 4 * 2}, g.Regions)
		require.Equal(t, []int{0, 0}, g.SlotStride)
		g, err = plan.NewGeometry(&d, plan.Binding{Layout: cl["host"], Layers: []int{0, 1, 2}, Heads: 4, Slots: 5})
		require.NoError(t, err)
		require.Equal(t, []string{"kv"}, g.RegionNames)
		require.Equal(t, []int{4 * 4 * 8 * 2}, g.SlotStride)
	})

	t.Run("descriptor", func(t *testing.T) {
		bad := d
		bad.KVHeads = 0
		p, err := plan.NewPlanner(&bad, plan.Binding{Layout: pf, Layers: []int{0}, Heads: 1, Slots: 1}, plan.Options{})
		require.Nil(t, p)
		require.EqualError(t, err, "descriptor kv_heads is 0; it must be positive")
	})

	t.Run("pool as a part layout", func(t *testing.T) {
		model := manifest.Model{Namespace: "test", ModelID: "pool", Descriptor: d}
		_, err := plan.ManifestFor(model.Domain(), &d, placement.Topology{TP: 1, PP: 1}, pf)
		require.EqualError(t, err, "layout page_first is a pool layout; pages are stored in part layouts")
		_, err = plan.ManifestFor(model.Domain(), &odd, placement.Topology{TP: 1, PP: 1}, cl["xblock"])
		require.EqualError(t, err, "layout xblock splits D by 4, which does not divide head dim 6")
	})

	t.Run("binding of a rank", func(t *testing.T) {
		_, err := plan.BindingFor(&d, placement.Topology{TP: 2, PP: 2}, placement.Rank{TP: 2}, pf, 1)
		require.EqualError(t, err, "rank tp 2 pp 0 is outside tp 2 x pp 2")
		_, err = plan.BindingFor(&d, placement.Topology{TP: 3, PP: 1}, placement.Rank{}, pf, 1)
		require.EqualError(t, err, "kv-heads 4 is not divisible by tp 3")
	})
}
