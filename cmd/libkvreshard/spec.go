package main

import (
	"fmt"
	"strings"
	"unsafe"

	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/internal/spec"
	_ "github.com/kvreshard/kvreshard/layouts"
	"github.com/kvreshard/kvreshard/runtime/kernel"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
)

// modelArgs is a kvr_model in Go values (NULL strings as "").
type modelArgs struct {
	layers, kvHeads, headDim, vHeadDim, page, mla int
	dtype, name, revision, namespace, fingerprint string
	draftLayers                                   int // the last draftLayers layers are MTP draft layers
}

// maxLayers bounds a model's layers (and so a kvr_placement's pp).
const maxLayers = spec.MaxLayers

// buildModel returns the model a describes by the rules the kvreshard
// command's --model flag shares (package spec); mla is C's 0 or 1.
func buildModel(a modelArgs) (manifest.Model, error) {
	if a.mla != 0 && a.mla != 1 {
		return manifest.Model{}, invalidf("model: mla %d is not 0 or 1", a.mla)
	}
	m, err := spec.Model{
		Layers: a.layers, KVHeads: a.kvHeads, HeadDim: a.headDim, VHeadDim: a.vHeadDim, Page: a.page,
		MLA: a.mla == 1, DraftLayers: a.draftLayers, Dtype: a.dtype,
		Name: a.name, Revision: a.revision, Namespace: a.namespace, Fingerprint: a.fingerprint,
	}.Build()
	if err != nil {
		return manifest.Model{}, invalidf("model: %v", err)
	}
	return m, nil
}

// placementArgs is a kvr_placement in Go values (pp_layers NULL as nil;
// cp and cpInterleave 0 as 1, the placement package's convention).
type placementArgs struct {
	tp, pp, tpRank, ppRank int
	ppLayers               []int
	cp, cpRank             int
	cpInterleave           int
}

// buildPlacement returns the topology and rank a describes, checked
// against d: TP x PP x CP, the CP rank's tokens dealt in runs of
// cpInterleave (placement.Topology).
func buildPlacement(d *manifest.Descriptor, a placementArgs) (placement.Topology, placement.Rank, error) {
	t := placement.Topology{TP: a.tp, PP: a.pp, PPLayers: a.ppLayers, CP: a.cp, Interleave: a.cpInterleave}
	r := placement.Rank{TP: a.tpRank, PP: a.ppRank, CP: a.cpRank}
	if _, err := t.Share(d, r); err != nil {
		return t, r, invalidf("placement: %v", err)
	}
	return t, r, nil
}

// poolArgs is a kvr_pool in Go values. bases and sizes are nil when
// nregions is outside what could be right (then only nregions is checked).
type poolArgs struct {
	layout   string
	nregions int
	bases    []unsafe.Pointer
	sizes    []uint64
	slots    int64
}

// maxRegions bounds the regions of a pool whose addresses are read: a
// binding has one per component at most.
const maxRegions = 8

// poolLayouts lists the pool layouts registered.
func poolLayouts() []string { return kernel.LayoutsOf(ir.Pool) }

// partLayouts lists the part layouts registered.
func partLayouts() []string { return kernel.LayoutsOf(ir.Part) }

// poolLayout returns the pool layout called name.
func poolLayout(name string) (*ir.Layout, error) {
	names := kernel.ListNames(poolLayouts())
	if name == "" {
		return nil, invalidf("pool: layout is required (%s)", names)
	}
	l, err := kernel.LayoutNamed(name)
	if err != nil {
		return nil, invalidf("pool: unknown layout %q; pool layouts are %s", name, names)
	}
	if l.Kind != ir.Pool {
		return nil, invalidf("pool: layout %s is a part layout; a pool needs a pool layout (%s)", name, names)
	}
	return l, nil
}

// partLayout returns the part layout called name, or the one pool writes
// (its .kvl declaration's writes clause) when name is "".
func partLayout(name string, pool *ir.Layout) (*ir.Layout, error) {
	names := kernel.ListNames(partLayouts())
	if name == "" {
		l, err := kernel.DefaultPart(pool)
		if err != nil {
			return nil, invalidf("writer: %v", err)
		}
		return l, nil
	}
	l, err := kernel.LayoutNamed(name)
	if err != nil {
		return nil, invalidf("writer: unknown part layout %q; part layouts are %s", name, names)
	}
	if l.Kind != ir.Part {
		return nil, invalidf("writer: %s is a pool layout; pages are stored in part layouts (%s)", name, names)
	}
	return l, nil
}

// binding returns the binding of rank r of topology t into the pool a
// describes.
func binding(d *manifest.Descriptor, t placement.Topology, r placement.Rank, a *poolArgs) (plan.Binding, error) {
	l, err := poolLayout(a.layout)
	if err != nil {
		return plan.Binding{}, err
	}
	if a.slots < 1 {
		return plan.Binding{}, invalidf("pool: slots is %d; a pool holds at least one page", a.slots)
	}
	if a.slots > plan.MaxPoolBytes {
		return plan.Binding{}, invalidf("pool: slots %d is more than %d", a.slots, int64(plan.MaxPoolBytes))
	}
	b, err := plan.BindingFor(d, t, r, l, int(a.slots))
	if err != nil {
		return plan.Binding{}, invalidf("pool: %v", err)
	}
	return b, nil
}

// regions wraps the caller's pool memory that a describes as the regions
// of geometry g: each as many bytes as the region needs (never more, so
// nothing past them is touched), checked present and not overlapping.
// The slices point to C memory, which Go's collector ignores; they are
// valid as long as the caller keeps the pool.
func regions(g *plan.Geometry, a *poolArgs) ([][]byte, error) {
	if a.nregions != len(g.Regions) {
		return nil, invalidf("pool: nregions is %d; layout %s of this model has %d regions (%s)",
			a.nregions, g.Layout.Name, len(g.Regions), strings.Join(g.RegionNames, ", "))
	}
	if len(a.bases) != a.nregions || len(a.sizes) != a.nregions {
		return nil, invalidf("pool: bases or sizes is NULL")
	}
	out := make([][]byte, a.nregions)
	for i, p := range a.bases {
		need := g.Regions[i]
		if p == nil {
			return nil, invalidf("pool: region %s has a NULL base", g.RegionNames[i])
		}
		if a.sizes[i] < uint64(need) {
			return nil, invalidf("pool: region %s has %d bytes; %d slots of layout %s need %d",
				g.RegionNames[i], a.sizes[i], g.Slots, g.Layout.Name, need)
		}
		out[i] = unsafe.Slice((*byte)(p), need)
	}
	for i := range out {
		for j := range i {
			if overlap(out[i], out[j]) {
				return nil, invalidf("pool: regions %s and %s overlap", g.RegionNames[j], g.RegionNames[i])
			}
		}
	}
	if err := g.CheckRegions(out); err != nil {
		return nil, invalidf("pool: %v", err)
	}
	return out, nil
}

// overlap reports whether two non-empty byte slices share a byte.
func overlap(a, b []byte) bool {
	pa, pb := uintptr(unsafe.Pointer(&a[0])), uintptr(unsafe.Pointer(&b[0]))
	return pa < pb+uintptr(len(b)) && pb < pa+uintptr(len(a))
}

// maxBatch bounds the pages of one call.
const maxBatch = 1 << 24

// checkBatch checks a batch's page count n and that its arrays are given.
func checkBatch(n int64, present ...bool) error {
	if n < 0 || n > maxBatch {
		return invalidf("n is %d; a batch has 0 to %d pages", n, maxBatch)
	}
	for _, ok := range present {
		if n > 0 && !ok {
			return invalidf("keys, offsets, slots or the output array is NULL with n = %d", n)
		}
	}
	return nil
}

// keyLength checks a batch's n+1 key offsets and returns the bytes of the
// key buffer they span, offs[n].
func keyLength(offs []int64) (int64, error) {
	if offs[0] < 0 {
		return 0, invalidf("offsets[0] is %d; offsets are byte offsets into keys", offs[0])
	}
	for i := 1; i < len(offs); i++ {
		if offs[i] <= offs[i-1] {
			if offs[i] == offs[i-1] {
				return 0, invalidf("key %d is empty (offsets[%d] = offsets[%d] = %d)", i-1, i-1, i, offs[i])
			}
			return 0, invalidf("offsets[%d] = %d is less than offsets[%d] = %d", i, offs[i], i-1, offs[i-1])
		}
	}
	if offs[len(offs)-1] > maxKeyBytes {
		return 0, invalidf("keys span %d bytes; at most %d", offs[len(offs)-1], int64(maxKeyBytes))
	}
	return offs[len(offs)-1], nil
}

// maxKeyBytes bounds the key bytes of one batch.
const maxKeyBytes = 1 << 32

// storeKeys returns the store keys of the keys buf[offs[i]:offs[i+1]] of
// the model domain, by the rules of spec.PageKeys.
func storeKeys(buf []byte, offs []int64, domain string) ([]string, error) {
	keys := make([][]byte, len(offs)-1)
	for i := range keys {
		keys[i] = buf[offs[i]:offs[i+1]]
	}
	out, err := spec.PageKeys(spec.KeyPrefix, domain, keys)
	if err != nil {
		return nil, invalidf("%v", err)
	}
	return out, nil
}

// intSlots converts a batch's slots.
func intSlots(s []int64) []int {
	out := make([]int, len(s))
	for i, v := range s {
		out[i] = int(v)
	}
	return out
}

// describe names a write's page for a message.
func describe(i int, key string) string {
	if _, hash, _, ok := manifest.SplitPageKey(key); ok {
		return fmt.Sprintf("page %d (key %q)", i, hash)
	}
	return fmt.Sprintf("page %d", i)
}
