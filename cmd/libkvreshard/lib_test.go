package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime/cgo"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/internal/spec"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/partsum"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/reshard"
	"github.com/kvreshard/kvreshard/runtime/store"
)

// These tests run the library's Go side without cgo's boundary (test files
// cannot use cgo): pools are Go memory here. clib_test.go runs the library
// as C sees it.

var testModel = modelArgs{layers: 6, kvHeads: 4, headDim: 8, vHeadDim: 4, page: 4, dtype: "bf16",
	name: "m", revision: "1", namespace: "ns"}

func TestBuildModel(t *testing.T) {
	m, err := buildModel(testModel)
	require.NoError(t, err)
	require.Equal(t, manifest.Descriptor{Layers: []int{0, 1, 2, 3, 4, 5}, KVHeads: 4, HeadDims: []int{8, 4},
		Dtype: "bf16", ItemSize: 2, PageSize: 4}, m.Descriptor)
	require.Equal(t, "ns/m/1", m.Namespace+"/"+m.ModelID+"/"+m.Revision)

	same := testModel
	same.vHeadDim = 0
	m, err = buildModel(same)
	require.NoError(t, err)
	require.Equal(t, []int{8, 8}, m.Descriptor.HeadDims, "v_head_dim 0 is head_dim")
	mla := same
	mla.mla = 1
	m, err = buildModel(mla)
	require.NoError(t, err)
	require.Equal(t, []int{8}, m.Descriptor.HeadDims)

	for _, c := range []struct {
		edit func(*modelArgs)
		msg  string
	}{
		{func(a *modelArgs) { a.layers = 0 }, "model: layers 0 is not from 1 to 4096"},
		{func(a *modelArgs) { a.layers = 4097 }, "model: layers 4097 is not from 1 to 4096"},
		{func(a *modelArgs) { a.mla = 2 }, "model: mla 2 is not 0 or 1"},
		{func(a *modelArgs) { a.mla = 1 }, "model: v_head_dim 4 is not allowed: an mla model has one latent component"},
		{func(a *modelArgs) { a.vHeadDim = -1 }, "model: v_head_dim -1 is negative; 0 means head_dim"},
		{func(a *modelArgs) { a.dtype = "" }, "model: dtype is required (fp32, bf16, fp16 or fp8)"},
		{func(a *modelArgs) { a.dtype = "int8" }, `model: dtype "int8" is unknown; dtypes are fp32, bf16, fp16 and fp8`},
		{func(a *modelArgs) { a.headDim = 0 }, "model: head_dim 0 must be positive"},
		{func(a *modelArgs) { a.page = -1 }, "model: page -1 must be positive"},
		{func(a *modelArgs) { a.name = "\xff" }, `model: model model id "\xff" is not valid UTF-8`},
	} {
		a := testModel
		c.edit(&a)
		_, err := buildModel(a)
		require.EqualError(t, err, c.msg)
		require.Equal(t, kvrEInval, codeOf(err))
	}
}

func TestModelDomain(t *testing.T) {
	m, err := buildModel(testModel)
	require.NoError(t, err)
	// The domain the kvreshard command computes for the same fields.
	want := manifest.Model{Namespace: "ns", ModelID: "m", Revision: "1", Descriptor: m.Descriptor}
	require.Equal(t, want.Domain(), m.Domain())
	for _, edit := range []func(*modelArgs){
		func(a *modelArgs) { a.dtype = "fp16" },
		func(a *modelArgs) { a.namespace = "other" },
		func(a *modelArgs) { a.fingerprint = "rope=2" },
	} {
		a := testModel
		edit(&a)
		o, err := buildModel(a)
		require.NoError(t, err)
		require.NotEqual(t, m.Domain(), o.Domain())
	}
}

func TestBuildPlacement(t *testing.T) {
	m, err := buildModel(testModel)
	require.NoError(t, err)
	d := &m.Descriptor
	_, _, err = buildPlacement(d, placementArgs{tp: 2, pp: 2, tpRank: 1, ppRank: 1, ppLayers: []int{4, 2}})
	require.NoError(t, err)
	// cp, cp_rank and cp_interleave reach the topology and the rank; 0
	// means no context parallelism.
	top, r, err := buildPlacement(d, placementArgs{tp: 2, pp: 1, tpRank: 1, cp: 2, cpRank: 1, cpInterleave: 2})
	require.NoError(t, err)
	require.Equal(t, placement.Topology{TP: 2, PP: 1, CP: 2, Interleave: 2}, top)
	require.Equal(t, placement.Rank{TP: 1, CP: 1}, r)
	sh, err := top.Share(d, r)
	require.NoError(t, err)
	require.Equal(t, manifest.TokenSet{CPSize: 2, CPRank: 1, Interleave: 2}, sh.Tokens)
	top, _, err = buildPlacement(d, placementArgs{tp: 1, pp: 1})
	require.NoError(t, err)
	sh, err = top.Share(d, placement.Rank{})
	require.NoError(t, err)
	require.True(t, sh.Tokens.All())
	for _, c := range []struct {
		a   placementArgs
		msg string
	}{
		{placementArgs{tp: 0, pp: 1}, "placement: tp 0 is not positive"},
		{placementArgs{tp: 3, pp: 1}, "placement: kv-heads 4 is not divisible by tp 3"},
		{placementArgs{tp: 1, pp: 7}, "placement: pp 7 is more than the 6 layers"},
		{placementArgs{tp: 1, pp: 2, ppLayers: []int{4, 1}}, "placement: pp-layers sum to 5, not the 6 layers"},
		{placementArgs{tp: 2, pp: 2, ppRank: 2}, "placement: rank tp 0 pp 2 is outside tp 2 x pp 2"},
		{placementArgs{tp: 2, pp: 2, tpRank: -1}, "placement: rank tp -1 pp 0 is outside tp 2 x pp 2"},
		{placementArgs{tp: 1, pp: 1, cp: 2, cpInterleave: 3}, "placement: cp interleave 3 does not divide the page's 4 tokens"},
		{placementArgs{tp: 1, pp: 1, cp: 8}, "placement: cp 8 is more than the page's 4 tokens"},
		{placementArgs{tp: 1, pp: 1, cp: 4, cpInterleave: 2}, "placement: cp 4 x cp interleave 2 is 8 tokens, which does not divide the page's 4 tokens"},
		{placementArgs{tp: 2, pp: 1, cp: 2, cpRank: 2}, "placement: rank tp 0 pp 0 cp 2 is outside tp 2 x pp 1 x cp 2"},
		{placementArgs{tp: 1, pp: 1, cpRank: 1}, "placement: rank tp 0 pp 0 cp 1 is outside tp 1 x pp 1 x cp 1"},
		{placementArgs{tp: 1, pp: 1, cp: -1}, "placement: cp -1 is not positive"},
	} {
		_, _, err := buildPlacement(d, c.a)
		require.EqualError(t, err, c.msg)
		require.Equal(t, kvrEInval, codeOf(err))
	}
}

// testPool is a pool in Go memory for rank r's binding: its args and its
// regions.
func testPool(t testing.TB, layout string, d *manifest.Descriptor, p placementArgs, slots int) (*poolArgs, [][]byte) {
	t.Helper()
	tp, r, err := buildPlacement(d, p)
	require.NoError(t, err)
	a := &poolArgs{layout: layout, slots: int64(slots)}
	b, err := binding(d, tp, r, a)
	require.NoError(t, err)
	g, err := plan.NewGeometry(d, b)
	require.NoError(t, err)
	regs := g.NewRegions()
	a.nregions = len(regs)
	for _, reg := range regs {
		a.bases = append(a.bases, unsafe.Pointer(&reg[0]))
		a.sizes = append(a.sizes, uint64(len(reg)))
	}
	return a, regs
}

func TestPool(t *testing.T) {
	m, err := buildModel(testModel)
	require.NoError(t, err)
	d := &m.Descriptor
	pa := placementArgs{tp: 2, pp: 2, tpRank: 1}
	good, regs := testPool(t, "layer_first", d, pa, 3)
	tp, r, err := buildPlacement(d, pa)
	require.NoError(t, err)
	b, err := binding(d, tp, r, good)
	require.NoError(t, err)
	g, err := plan.NewGeometry(d, b)
	require.NoError(t, err)
	out, err := regions(g, good)
	require.NoError(t, err)
	require.Equal(t, unsafe.Pointer(&regs[1][0]), unsafe.Pointer(&out[1][0]))
	require.Equal(t, g.Regions[1], len(out[1]))

	// Binding errors.
	for _, c := range []struct {
		layout string
		slots  int64
		msg    string
	}{
		{"", 3, "pool: layout is required (page_first, page_first_direct, layer_first, page_head)"},
		{"LPHD", 3, "pool: layout LPHD is a part layout; a pool needs a pool layout (page_first, page_first_direct, layer_first, page_head)"},
		{"paged", 3, `pool: unknown layout "paged"; pool layouts are page_first, page_first_direct, layer_first, page_head`},
		{"layer_first", 0, "pool: slots is 0; a pool holds at least one page"},
		{"layer_first", 1 << 51, "pool: slots 2251799813685248 is more than 1125899906842624"},
		{"layer_first", 1 << 45, "pool: pool layer_first of 35184372088832 slots is more than 1125899906842624 bytes"},
	} {
		a := *good
		a.layout, a.slots = c.layout, c.slots
		b, err := binding(d, tp, r, &a)
		if err == nil {
			_, err = plan.NewGeometry(d, b)
			err = invalidf("pool: %v", err)
		}
		require.EqualError(t, err, c.msg)
		require.Equal(t, kvrEInval, codeOf(err))
	}

	// Region errors; one holds both regions, for overlaps.
	one := make([]byte, g.Regions[0]+g.Regions[1])
	for _, c := range []struct {
		edit func(a *poolArgs)
		msg  string
	}{
		{func(a *poolArgs) { a.nregions = 1 }, "pool: nregions is 1; layout layer_first of this model has 2 regions (k, v)"},
		{func(a *poolArgs) { a.bases = nil }, "pool: bases or sizes is NULL"},
		{func(a *poolArgs) { a.bases = []unsafe.Pointer{a.bases[0], nil} }, "pool: region v has a NULL base"},
		{func(a *poolArgs) { a.sizes = []uint64{a.sizes[0] - 1, a.sizes[1]} },
			fmt.Sprintf("pool: region k has %d bytes; 3 slots of layout layer_first need %d", g.Regions[0]-1, g.Regions[0])},
		{func(a *poolArgs) {
			a.bases = []unsafe.Pointer{unsafe.Pointer(&one[0]), unsafe.Pointer(&one[g.Regions[0]-1])}
		}, "pool: regions k and v overlap"},
		{func(a *poolArgs) {
			a.bases = []unsafe.Pointer{unsafe.Pointer(&one[g.Regions[1]-2]), unsafe.Pointer(&one[0])}
		}, "pool: regions k and v overlap"},
	} {
		a := *good
		c.edit(&a)
		_, err := regions(g, &a)
		require.EqualError(t, err, c.msg)
		require.Equal(t, kvrEInval, codeOf(err))
	}
	// Adjacent regions do not overlap; larger ones are cut to the need.
	buf := make([]byte, g.Regions[0]+g.Regions[1]+64)
	a := *good
	a.bases = []unsafe.Pointer{unsafe.Pointer(&buf[0]), unsafe.Pointer(&buf[g.Regions[0]])}
	a.sizes = []uint64{uint64(g.Regions[0]), uint64(len(buf) - g.Regions[0])}
	out, err = regions(g, &a)
	require.NoError(t, err)
	require.Equal(t, g.Regions[1], len(out[1]))
}

func TestPartLayout(t *testing.T) {
	for pool, part := range map[string]string{"page_first": "PLHD", "page_first_direct": "LPHD", "layer_first": "LPHD", "page_head": "HPLD"} {
		p, err := poolLayout(pool)
		require.NoError(t, err)
		l, err := partLayout("", p)
		require.NoError(t, err)
		require.Equal(t, part, l.Name)
		l, err = partLayout("HPLD", p)
		require.NoError(t, err)
		require.Equal(t, "HPLD", l.Name)
	}
	p, err := poolLayout("page_first")
	require.NoError(t, err)
	_, err = partLayout("page_head", p)
	require.EqualError(t, err, "writer: page_head is a pool layout; pages are stored in part layouts (PLHD, LPHD, HPLD)")
	_, err = partLayout("XYZ", p)
	require.EqualError(t, err, `writer: unknown part layout "XYZ"; part layouts are PLHD, LPHD, HPLD`)
	// The default part is the one a pool layout's declaration writes;
	// every built-in pool layout has one.
	for _, n := range []string{"page_first", "page_first_direct", "layer_first", "page_head"} {
		p, err := poolLayout(n)
		require.NoError(t, err)
		l, err := partLayout("", p)
		require.NoError(t, err, n)
		require.Equal(t, p.Writes, l.Name)
	}
}

func TestKeys(t *testing.T) {
	buf := []byte("abcdefgh")
	n, err := keyLength([]int64{0, 3, 8})
	require.NoError(t, err)
	require.Equal(t, int64(8), n)
	ks, err := storeKeys(buf, []int64{0, 3, 8}, "dom")
	require.NoError(t, err)
	require.Equal(t, []string{"kvreshard_abc_dom", "kvreshard_defgh_dom"}, ks)
	ks, err = storeKeys(buf, []int64{2, 3}, "dom")
	require.NoError(t, err)
	require.Equal(t, []string{"kvreshard_c_dom"}, ks, "offsets need not start at 0")

	for _, c := range []struct {
		offs []int64
		msg  string
	}{
		{[]int64{-1, 3}, "offsets[0] is -1; offsets are byte offsets into keys"},
		{[]int64{0, 3, 3}, "key 1 is empty (offsets[1] = offsets[2] = 3)"},
		{[]int64{0, 3, 2}, "offsets[2] = 2 is less than offsets[1] = 3"},
		{[]int64{0, 1 << 33}, "keys span 8589934592 bytes; at most 4294967296"},
	} {
		_, err := keyLength(c.offs)
		require.EqualError(t, err, c.msg)
		require.Equal(t, kvrEInval, codeOf(err))
	}
	_, err = storeKeys([]byte("ab_c"), []int64{0, 1, 4}, "dom")
	require.EqualError(t, err, `key 1 "b_c" contains '_'; a key is the page's hash, without '_'`)
	require.EqualError(t, checkBatch(-1), "n is -1; a batch has 0 to 16777216 pages")
	require.EqualError(t, checkBatch(1<<24+1), "n is 16777217; a batch has 0 to 16777216 pages")
	require.EqualError(t, checkBatch(2, true, false), "keys, offsets, slots or the output array is NULL with n = 2")
	require.NoError(t, checkBatch(0, false, false))
}

func TestStopCode(t *testing.T) {
	for _, c := range []struct {
		err  error
		want int
	}{
		{nil, kvrStopNone},
		{fmt.Errorf("%w: k", reshard.ErrMiss), kvrStopMiss},
		// A part gone between the query and the read: the reader wraps it.
		{fmt.Errorf("page k: %w: %w", reshard.ErrMiss, &store.RangeError{Key: "k", Err: store.ErrNotFound}), kvrStopMiss},
		{fmt.Errorf("%w: 2 pages", reshard.ErrBudget), kvrStopBudget},
		{context.Canceled, kvrStopCanceled},
		{fmt.Errorf("page k: %w", context.DeadlineExceeded), kvrStopCanceled},
		// A manifest rejected for a store error wraps it.
		{fmt.Errorf("page k: %w: m: %w", reshard.ErrManifest, errors.New("connection refused")), kvrStopManifest},
		// A corrupt part is the page's, not a store failure (KVR_OK).
		{fmt.Errorf("page k: %w", partsum.ErrMismatch), kvrStopChecksum},
		{errors.New("connection refused"), kvrStopFailed},
	} {
		require.Equal(t, c.want, stopCode(c.err), "%v", c.err)
	}
	for s, want := range map[reshard.Status]uint8{reshard.Written: kvrWritten, reshard.Complete: kvrComplete,
		reshard.Refused: kvrRefused, reshard.Replica: kvrReplica, reshard.Failed: kvrFailed} {
		require.Equal(t, want, statusCode(s))
	}
}

// memStore opens a mem:// store, closed when the test ends, and builds
// model ma.
func memStore(t testing.TB, ma modelArgs) (uint64, manifest.Model) {
	t.Helper()
	sh, err := openStore("mem://")
	require.NoError(t, err)
	t.Cleanup(func() { closeStore(sh) })
	model, err := buildModel(ma)
	require.NoError(t, err)
	return sh, model
}

// testWriter opens the writer of rank pa of model ma from pool a on store
// handle sh (openWriter), closed when the test ends.
func testWriter(t testing.TB, sh uint64, ma modelArgs, pa placementArgs, a *poolArgs, part string) *writerHandle {
	t.Helper()
	w, err := openWriter(sh, ma, pa, a, part)
	require.NoError(t, err)
	wh, err := lookup[*writerHandle](w, "writer")
	require.NoError(t, err)
	t.Cleanup(func() { wh.close(w, "writer") })
	return wh
}

// writeStatuses writes pages keys from slots and returns their statuses
// (each 9, no status, unless the write sets it).
func writeStatuses(t testing.TB, wh *writerHandle, keys []string, slots []int) []uint8 {
	t.Helper()
	st := bytes.Repeat([]byte{9}, len(keys))
	_, err := wh.write(keys, slots, st)
	require.NoError(t, err)
	return st
}

// storeKeysOf returns the store keys of pages 0..n-1 named as the
// kvreshard command names them.
func storeKeysOf(t *testing.T, domain string, n int) ([]byte, []int64, []string) {
	var buf []byte
	offs := []int64{0}
	for i := range n {
		buf = fmt.Appendf(buf, "%016x", uint64(i)*0x9e3779b97f4a7c15)
		offs = append(offs, int64(len(buf)))
	}
	ks, err := storeKeys(buf, offs, domain)
	require.NoError(t, err)
	require.Equal(t, content.PageKeys(spec.KeyPrefix, domain, n), ks)
	return buf, offs, ks
}

// TestWriteRead writes pages from TP1/PP2 page_first pools and reads them
// into a TP2/PP1 page_head pool through handles, as the C functions do.
func TestWriteRead(t *testing.T) {
	sh, err := openStore("mem://")
	require.NoError(t, err)
	model, err := buildModel(testModel)
	require.NoError(t, err)
	d := &model.Descriptor
	const pages = 5
	_, _, keys := storeKeysOf(t, model.Domain(), pages)
	slots := []int{0, 1, 2, 3, 4}

	var ws []uint64
	for pp := range 2 {
		pa := placementArgs{tp: 1, pp: 2, ppRank: pp}
		a, regs := testPool(t, "page_first", d, pa, pages)
		wh, err := openWriter(sh, testModel, pa, a, "")
		require.NoError(t, err)
		ws = append(ws, wh)
		w, err := lookup[*writerHandle](wh, "writer")
		require.NoError(t, err)
		require.Equal(t, "PLHD", w.man.Layout.Name)
		for i, k := range keys {
			content.Fill(w.w.Geometry(), regs, i, content.Seed(k))
		}
		st := make([]uint8, pages)
		msg, err := w.write(keys, slots, st)
		require.NoError(t, err)
		require.Empty(t, msg)
		require.Equal(t, []uint8{0, 0, 0, 0, 0}, st)
		_, err = w.write(keys[:2], []int{0, 5}, st)
		require.EqualError(t, err, "slot 5 of page 1 is outside the pool's 5 slots")
		require.Equal(t, kvrEInval, codeOf(err))
	}
	// Every part is written: the pages are complete.
	for pp, h := range ws {
		w, err := lookup[*writerHandle](h, "writer")
		require.NoError(t, err)
		st := make([]uint8, 2)
		msg, err := w.write(keys[:2], slots[:2], st)
		require.NoError(t, err)
		require.Empty(t, msg)
		require.Equal(t, []uint8{kvrComplete, kvrComplete}, st, "rank %d", pp)
		require.Equal(t, reshard.WriterStats{Requests: 2, Pages: pages + 2, Written: pages, Complete: 2,
			Bytes: int64(pages * w.w.Geometry().PageBytes)}, w.w.Stats())
	}

	pa := placementArgs{tp: 2, pp: 1, tpRank: 1}
	a, regs := testPool(t, "page_head", d, pa, pages)
	rhv, err := openReader(sh, testModel, pa, a)
	require.NoError(t, err)
	rh, err := lookup[*readerHandle](rhv, "reader")
	require.NoError(t, err)
	n, msg, err := rh.exists(keys)
	require.NoError(t, err)
	require.Equal(t, pages, n)
	require.Empty(t, msg)
	n, msg, err = rh.exists(append(keys[:2:2], "kvreshard_x_"+model.Domain(), keys[3]))
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Empty(t, msg, "a miss is no error")
	res, err := rh.read(keys, []int{4, 3, 2, 1, 0})
	require.NoError(t, err)
	require.Equal(t, pages, res.Hit)
	require.NoError(t, res.Stop)
	for i, k := range keys {
		require.NoError(t, content.Verify(rh.r.Geometry(), regs, 4-i, content.Seed(k)))
	}
	_, err = rh.read(keys[:2], []int{1, 1})
	require.EqualError(t, err, "pages 0 and 1 both go to slot 1")
	require.Equal(t, kvrEInval, codeOf(err))

	// Wrong kinds, then closed handles.
	_, err = lookup[*readerHandle](ws[0], "reader")
	require.EqualError(t, err, fmt.Sprintf("handle %d is a writer, not a reader", ws[0]))
	require.Equal(t, kvrEInval, codeOf(err))
	_, err = lookup[*writerHandle](sh, "writer")
	require.EqualError(t, err, fmt.Sprintf("handle %d is a store, not a writer", sh))

	require.NoError(t, closeStore(sh))
	err = closeStore(sh)
	require.EqualError(t, err, fmt.Sprintf("store handle %d is closed or was never opened", sh))
	require.Equal(t, kvrEClosed, codeOf(err))
	_, err = openReader(sh, testModel, pa, a)
	require.Equal(t, kvrEClosed, codeOf(err))
	// The store stays open for its reader.
	res, err = rh.read(keys[:1], []int{0})
	require.NoError(t, err)
	require.Equal(t, 1, res.Hit)

	require.NoError(t, rh.close(rhv, "reader"))
	err = rh.close(rhv, "reader")
	require.EqualError(t, err, fmt.Sprintf("reader handle %d is closed", rhv))
	require.Equal(t, kvrEClosed, codeOf(err))
	_, err = lookup[*readerHandle](rhv, "reader")
	require.EqualError(t, err, fmt.Sprintf("reader handle %d is closed or was never opened", rhv))
	_, err = lookup[*readerHandle](0, "reader")
	require.EqualError(t, err, "reader is NULL")
	require.Equal(t, kvrEInval, codeOf(err))
	for _, w := range ws {
		wh, err := lookup[*writerHandle](w, "writer")
		require.NoError(t, err)
		require.NoError(t, wh.close(w, "writer"))
	}
}

// TestCloseWaitsForCalls closes a reader while goroutines read through it:
// close returns only when no call uses the pool, and every later call gets
// KVR_ECLOSED. Run with -race.
func TestCloseWaitsForCalls(t *testing.T) {
	sh, model := memStore(t, testModel)
	d := &model.Descriptor
	_, _, keys := storeKeysOf(t, model.Domain(), 4)
	pa := placementArgs{tp: 1, pp: 1}
	wa, wregs := testPool(t, "page_first", d, pa, 4)
	w, err := openWriter(sh, testModel, pa, wa, "HPLD")
	require.NoError(t, err)
	wh, _ := lookup[*writerHandle](w, "writer")
	for i, k := range keys {
		content.Fill(wh.w.Geometry(), wregs, i, content.Seed(k))
	}
	_, err = wh.write(keys, []int{0, 1, 2, 3}, make([]uint8, 4))
	require.NoError(t, err)

	ra, _ := testPool(t, "layer_first", d, pa, 16)
	r, err := openReader(sh, testModel, pa, ra)
	require.NoError(t, err)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for range 200 {
				rh, err := enterHandle[*readerHandle](r, "reader")
				if err != nil {
					assert.Equal(t, kvrEClosed, codeOf(err), "%v", err)
					return
				}
				res, err := rh.read(keys, []int{4 * g, 4*g + 1, 4*g + 2, 4*g + 3})
				rh.leave()
				assert.NoError(t, err)
				assert.Equal(t, 4, res.Hit)
			}
		})
	}
	rh, _ := lookup[*readerHandle](r, "reader")
	require.NoError(t, rh.close(r, "reader"))
	require.Nil(t, rh.regions, "close forgets the pool")
	wg.Wait()
	require.NoError(t, wh.close(w, "writer"))
}

// TestPublish tells the store's failures from a manifest read back as
// other bytes.
func TestPublish(t *testing.T) {
	sh, model := memStore(t, testModel)
	pa := placementArgs{tp: 1, pp: 1}
	a, _ := testPool(t, "page_first", &model.Descriptor, pa, 1)
	wh := testWriter(t, sh, testModel, pa, a, "")
	require.NoError(t, wh.publish(context.Background()))
	require.True(t, wh.published.Load())

	s, _ := lookup[*storeHandle](sh, "store")
	real := s.st
	defer func() { s.st = real }()
	s.st = &metaStore{Store: real, back: []byte("{}")}
	err := wh.publish(context.Background())
	require.EqualError(t, err, fmt.Sprintf("manifest %s reads back as other bytes", wh.man.Key()))
	require.Equal(t, kvrEManifest, codeOf(err))
	s.st = &metaStore{Store: real, putErr: store.ErrMetaConflict}
	err = wh.publish(context.Background())
	require.Equal(t, kvrEManifest, codeOf(err))
	s.st = &metaStore{Store: real, putErr: errors.New("connection reset")}
	err = wh.publish(context.Background())
	require.EqualError(t, err, fmt.Sprintf("publish manifest %s: connection reset", wh.man.Key()))
	require.Equal(t, kvrEStore, codeOf(err))
}

// metaStore is a store whose metadata calls fail or return other bytes.
type metaStore struct {
	store.Store
	putErr error
	back   []byte
}

func (m *metaStore) PutMeta(ctx context.Context, key string, val []byte) error {
	if m.putErr != nil {
		return m.putErr
	}
	return m.Store.PutMeta(ctx, key, val)
}

func (m *metaStore) GetMeta(ctx context.Context, key string) ([]byte, error) {
	if m.back != nil {
		return m.back, nil
	}
	return m.Store.GetMeta(ctx, key)
}

// BenchmarkEmptyRead is the Go side of an empty kvr_reader_read: finding
// the handle, entering it and reading no page.
func BenchmarkEmptyRead(b *testing.B) {
	sh, model := memStore(b, testModel)
	pa := placementArgs{tp: 1, pp: 1}
	a, _ := testPool(b, "page_first", &model.Descriptor, pa, 1)
	r, err := openReader(sh, testModel, pa, a)
	require.NoError(b, err)
	for b.Loop() {
		rh, err := enterHandle[*readerHandle](r, "reader")
		if err != nil {
			b.Fatal(err)
		}
		if _, err := rh.read(nil, nil); err != nil {
			b.Fatal(err)
		}
		rh.leave()
	}
}

// TestRejectedAndFailed reads and checks pages whose manifest is missing
// (KVR_STOP_MANIFEST, and a message with KVR_OK from exists) through a
// store whose queries fail (KVR_ESTORE from exists, KVR_STOP_FAILED).
func TestRejectedAndFailed(t *testing.T) {
	model, err := buildModel(testModel)
	require.NoError(t, err)
	_, _, keys := storeKeysOf(t, model.Domain(), 2)
	mem, err := store.Open(context.Background(), "mem://")
	require.NoError(t, err)
	fs := &failStore{Store: mem}
	sh := uint64(cgo.NewHandle(&storeHandle{url: "mem://", st: fs}))
	defer closeStore(sh)

	// Page 1 is complete, under a manifest that is not one.
	mk := "kv/" + model.Domain() + "/manifests/" + strings.Repeat("0", 64)
	errs := mem.WriteParts(context.Background(), []store.PartWrite{{Key: keys[1], Part: 0, Parts: 1, Manifest: mk, Data: [][]byte{{1}}}})
	require.NoError(t, errs[0])
	require.NoError(t, mem.PutMeta(context.Background(), mk, []byte("garbage")))
	pa := placementArgs{tp: 1, pp: 1}
	wa, _ := testPool(t, "page_first", &model.Descriptor, pa, 1)
	wh := testWriter(t, sh, testModel, pa, wa, "")
	st := writeStatuses(t, wh, keys[:1], []int{0})
	require.Equal(t, []uint8{kvrWritten}, st)

	ra, _ := testPool(t, "layer_first", &model.Descriptor, pa, 2)
	r, err := openReader(sh, testModel, pa, ra)
	require.NoError(t, err)
	rh, _ := lookup[*readerHandle](r, "reader")
	defer rh.close(r, "reader")
	n, msg, err := rh.exists(keys)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Contains(t, msg, "manifest rejected")
	res, err := rh.read(keys, []int{0, 1})
	require.NoError(t, err)
	require.Equal(t, 1, res.Hit)
	require.Equal(t, kvrStopManifest, stopCode(res.Stop))

	fs.queryErr = errors.New("connection refused")
	n, _, err = rh.exists(keys)
	require.Equal(t, 0, n)
	require.EqualError(t, err, "query: connection refused")
	require.Equal(t, kvrEStore, codeOf(err))
	res, err = rh.read(keys, []int{0, 1})
	require.NoError(t, err)
	require.Equal(t, 0, res.Hit)
	require.Equal(t, kvrStopFailed, stopCode(res.Stop))
	require.EqualError(t, res.Stop, "query: connection refused")
	_, err = wh.write(keys[:1], []int{0}, st)
	require.EqualError(t, err, "query: connection refused")
	require.Equal(t, kvrEStore, codeOf(err))
	require.Equal(t, []uint8{kvrFailed}, st)

	// A page whose part cannot be stored fails alone, named in the message.
	fs.queryErr, fs.writeErr = nil, errors.New("disk full")
	_, _, more := storeKeysOf(t, model.Domain(), 4)
	st = make([]uint8, 2)
	msg, err = wh.write(more[2:], []int{0, 0}, st)
	require.NoError(t, err)
	require.Equal(t, []uint8{kvrFailed, kvrFailed}, st)
	require.Equal(t, `page 0 (key "3c6ef372fe94f82a") failed: disk full`, msg)
	require.Equal(t, reshard.WriterStats{Requests: 3, Pages: 4, Written: 1, Failed: 3, Bytes: int64(wh.w.Geometry().PageBytes)}, wh.w.Stats())
}

// failStore is a store whose queries fail with queryErr, and whose part
// writes with writeErr, when they are set.
type failStore struct {
	store.Store
	queryErr, writeErr error
}

func (f *failStore) WriteParts(ctx context.Context, ws []store.PartWrite) []error {
	if f.writeErr != nil {
		errs := make([]error, len(ws))
		for i := range errs {
			errs[i] = f.writeErr
		}
		return errs
	}
	return f.Store.WriteParts(ctx, ws)
}

func (f *failStore) Query(ctx context.Context, keys []string) ([]store.Object, error) {
	if f.queryErr != nil {
		return nil, f.queryErr
	}
	return f.Store.Query(ctx, keys)
}

// TestMLA writes and reads pages of an MLA model: one latent region.
func TestMLA(t *testing.T) {
	ma := modelArgs{layers: 4, kvHeads: 1, headDim: 16, page: 8, mla: 1, dtype: "fp8"}
	sh, model := memStore(t, ma)
	_, _, keys := storeKeysOf(t, model.Domain(), 3)

	var ws []*writerHandle
	for pp := range 2 {
		pa := placementArgs{tp: 1, pp: 2, ppRank: pp, ppLayers: []int{3, 1}}
		a, regs := testPool(t, "page_head", &model.Descriptor, pa, 3)
		require.Equal(t, 1, a.nregions)
		wh := testWriter(t, sh, ma, pa, a, "")
		ws = append(ws, wh)
		for i, k := range keys {
			content.Fill(wh.w.Geometry(), regs, i, content.Seed(k))
		}
		require.Equal(t, []uint8{kvrWritten, kvrWritten, kvrWritten}, writeStatuses(t, wh, keys, []int{0, 1, 2}))
	}
	require.Equal(t, "HPLD", ws[0].man.Layout.Name)

	// TP 2 on one KV head: both ranks hold the latent, one reads here.
	pa := placementArgs{tp: 2, pp: 1, tpRank: 1}
	a, regs := testPool(t, "layer_first", &model.Descriptor, pa, 3)
	r, err := openReader(sh, ma, pa, a)
	require.NoError(t, err)
	rh, _ := lookup[*readerHandle](r, "reader")
	defer rh.close(r, "reader")
	res, err := rh.read(keys, []int{2, 0, 1})
	require.NoError(t, err)
	require.Equal(t, 3, res.Hit)
	for i, s := range []int{2, 0, 1} {
		require.NoError(t, content.Verify(rh.r.Geometry(), regs, s, content.Seed(keys[i])))
	}
	// A TP 2 writer of one head: rank 1 holds a replica.
	pa = placementArgs{tp: 2, pp: 1, tpRank: 1}
	wa, _ := testPool(t, "page_first", &model.Descriptor, pa, 1)
	wh := testWriter(t, sh, ma, pa, wa, "")
	require.Equal(t, []uint8{kvrReplica}, writeStatuses(t, wh, keys[:1], []int{0}))
}
