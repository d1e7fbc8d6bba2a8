package main

import (
	"bytes"
	"fmt"
	"strings"
	"unsafe"

	"github.com/kvreshard/kvreshard/compiler/ir"
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

// maxLayers bounds a model's layers, which are listed one by one: far past
// the deepest models' (about 130), as the kvreshard command's --model.
const maxLayers = 1 << 12

// buildModel returns the model a describes, as the kvreshard command's
// --model flag builds it.
func buildModel(a modelArgs) (manifest.Model, error) {
	var d manifest.Descriptor
	if a.layers < 1 || a.layers > maxLayers {
		return manifest.Model{}, invalidf("model: layers %d is not from 1 to %d", a.layers, maxLayers)
	}
	for i := range a.layers {
		d.Layers = append(d.Layers, i)
	}
	d.KVHeads = a.kvHeads
	d.HeadDims = []int{a.headDim}
	switch {
	case a.mla != 0 && a.mla != 1:
		return manifest.Model{}, invalidf("model: mla %d is not 0 or 1", a.mla)
	case a.mla == 1 && a.vHeadDim != 0:
		return manifest.Model{}, invalidf("model: an mla model has one latent component; v_head_dim must be 0, not %d", a.vHeadDim)
	case a.vHeadDim < 0:
		return manifest.Model{}, invalidf("model: v_head_dim %d is negative; 0 means head_dim", a.vHeadDim)
	case a.mla == 0 && a.vHeadDim == 0:
		d.HeadDims = append(d.HeadDims, a.headDim)
	case a.mla == 0:
		d.HeadDims = append(d.HeadDims, a.vHeadDim)
	}
	d.Dtype = a.dtype
	if d.Dtype == "" {
		return manifest.Model{}, invalidf("model: dtype is required (fp32, bf16, fp16 or fp8)")
	}
	var err error
	if d.ItemSize, err = manifest.ItemSizeOf(d.Dtype); err != nil {
		return manifest.Model{}, invalidf("model: %v", err)
	}
	d.PageSize = a.page
	if a.draftLayers < 0 || a.draftLayers > a.layers {
		return manifest.Model{}, invalidf("model: draft_layers %d is not from 0 to the %d layers", a.draftLayers, a.layers)
	}
	d.DraftLayers = a.draftLayers
	m := manifest.Model{Namespace: a.namespace, ModelID: a.name, Revision: a.revision, Fingerprint: a.fingerprint, Descriptor: d}
	if err := m.Validate(); err != nil {
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
	names := strings.Join(poolLayouts(), ", ")
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
	names := strings.Join(partLayouts(), ", ")
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
// the model domain, manifest.PageKey("kvreshard", key, domain), rejecting
// keys with a NUL byte (a C string ends there: messages naming the key
// would be cut) or '_' (the separator of a page key's fields). Any other
// byte may be in a key: every store takes any bytes, and messages quote
// keys or escape their NULs (putMsg).
func storeKeys(buf []byte, offs []int64, domain string) ([]string, error) {
	out := make([]string, len(offs)-1)
	for i := range out {
		k := buf[offs[i]:offs[i+1]]
		if bytes.IndexByte(k, 0) >= 0 {
			return nil, invalidf("key %d contains a NUL byte", i)
		}
		if bytes.IndexByte(k, '_') >= 0 {
			return nil, invalidf("key %d %q contains '_'; a key is the page's hash, without '_'", i, k)
		}
		out[i] = manifest.PageKey(keyPrefix, string(k), domain)
	}
	return out, nil
}

// keyPrefix is the prefix of every page key the library stores, the
// kvreshard command's default, so that its read finds the library's pages.
const keyPrefix = "kvreshard"

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
