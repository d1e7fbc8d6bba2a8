package main

// Hidden visibility exports only kvreshard.c's functions (those of
// kvreshard.h); the errors make a call from kvreshard.c that does not
// match its Go export's prototype (from the C types of its parameters)
// fail the build.

/*
#cgo CFLAGS: -fvisibility=hidden -Werror=incompatible-pointer-types -Werror=int-conversion -Werror=implicit-function-declaration -Werror=discarded-qualifiers
#include "kvreshard.h"
*/
import "C"

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"unicode/utf8"
	"unsafe"
)

// The Go side of kvreshard.h: kvreshard.c's public functions check that
// they run in the process that loaded the library and call these. Each
// converts its C arguments, calls the Go code, writes the message and
// recovers from any panic (KVR_EINTERNAL): no panic crosses the boundary.

// putMsg writes msg, NUL-terminated and truncated at a UTF-8 boundary to
// fit errlen bytes, into err (nothing when err is NULL or errlen 0), as
// fitMsg makes it.
func putMsg(err *C.char, errlen C.size_t, msg string) {
	if err == nil || errlen == 0 {
		return
	}
	msg = fitMsg(msg, uint64(errlen))
	b := unsafe.Slice((*byte)(unsafe.Pointer(err)), len(msg)+1)
	copy(b, msg)
	b[len(msg)] = 0
}

// fitMsg returns msg as putMsg writes it into errlen >= 1 bytes, less its
// final NUL: a NUL byte in msg (of a store's error, say) as the four
// characters \x00, so that C does not read the message as ending there,
// then truncated at a UTF-8 boundary to errlen-1 bytes.
func fitMsg(msg string, errlen uint64) string {
	msg = strings.ReplaceAll(msg, "\x00", `\x00`)
	n := len(msg)
	if uint64(n) >= errlen {
		n = int(errlen) - 1
		for n > 0 && !utf8.RuneStart(msg[n]) {
			n--
		}
	}
	return msg[:n]
}

// finish writes err's message (or msg on success) and returns its code.
func finish(e error, msg string, err *C.char, errlen C.size_t) C.int {
	if e != nil {
		msg = e.Error()
	}
	putMsg(err, errlen, msg)
	return C.int(codeOf(e))
}

// recoverTo turns a panic into KVR_EINTERNAL with its message: deferred
// by every export.
func recoverTo(rc *C.int, err *C.char, errlen C.size_t) {
	if r := recover(); r != nil {
		*rc = kvrEInternal
		putMsg(err, errlen, fmt.Sprintf("internal error: %v", r))
	}
}

func goStr(s *C.char) string {
	if s == nil {
		return ""
	}
	return C.GoString(s)
}

// goModel reads a kvr_model (growing).
func goModel(p *C.kvr_model) (modelArgs, error) {
	if p == nil {
		return modelArgs{}, invalidf("model is NULL")
	}
	m, err := readIn(p, "kvr_model")
	if err != nil {
		return modelArgs{}, err
	}
	return modelArgs{
		layers: int(m.layers), kvHeads: int(m.kv_heads), headDim: int(m.head_dim), vHeadDim: int(m.v_head_dim),
		page: int(m.page), mla: int(m.mla),
		dtype: goStr(m.dtype), name: goStr(m.name), revision: goStr(m.revision),
		namespace: goStr(m.namespace_), fingerprint: goStr(m.fingerprint),
		draftLayers: int(m.draft_layers),
	}, nil
}

// goPlacement reads a kvr_placement (growing).
func goPlacement(pp *C.kvr_placement) (placementArgs, error) {
	if pp == nil {
		return placementArgs{}, invalidf("placement is NULL")
	}
	p, err := readIn(pp, "kvr_placement")
	if err != nil {
		return placementArgs{}, err
	}
	a := placementArgs{tp: int(p.tp), pp: int(p.pp), tpRank: int(p.tp_rank), ppRank: int(p.pp_rank),
		cp: int(p.cp), cpRank: int(p.cp_rank), cpInterleave: int(p.cp_interleave)}
	// pp_layers has pp entries; with pp out of range the topology is
	// refused whatever they hold, so they are not read.
	if p.pp_layers != nil && p.pp >= 1 && p.pp <= maxLayers {
		for _, n := range unsafe.Slice((*C.int32_t)(unsafe.Pointer(p.pp_layers)), int(p.pp)) {
			a.ppLayers = append(a.ppLayers, int(n))
		}
	}
	return a, nil
}

// goPool reads a kvr_pool (growing).
func goPool(pp *C.kvr_pool) (*poolArgs, error) {
	if pp == nil {
		return nil, invalidf("pool is NULL")
	}
	p, err := readIn(pp, "kvr_pool")
	if err != nil {
		return nil, err
	}
	a := &poolArgs{layout: goStr(p.layout), nregions: int(p.nregions), slots: int64(p.slots)}
	if p.nregions >= 1 && p.nregions <= maxRegions && p.bases != nil && p.sizes != nil {
		n := int(p.nregions)
		for _, b := range unsafe.Slice((*unsafe.Pointer)(unsafe.Pointer(p.bases)), n) {
			a.bases = append(a.bases, b)
		}
		for _, s := range unsafe.Slice((*C.uint64_t)(unsafe.Pointer(p.sizes)), n) {
			a.sizes = append(a.sizes, uint64(s))
		}
	}
	return a, nil
}

// goRank reads the model, placement and pool of kvr_writer_open or
// kvr_reader_open.
func goRank(m *C.kvr_model, p *C.kvr_placement, pool *C.kvr_pool) (modelArgs, placementArgs, *poolArgs, error) {
	ma, err := goModel(m)
	if err != nil {
		return ma, placementArgs{}, nil, err
	}
	pa, err := goPlacement(p)
	if err != nil {
		return ma, pa, nil, err
	}
	a, err := goPool(pool)
	return ma, pa, a, err
}

// batch returns the store keys and slots of a call's n pages (slots nil
// when the call has none).
func batch(domain string, keys *C.char, offsets, slots *C.int64_t, withSlots bool, n C.int64_t) ([]string, []int, error) {
	if err := checkBatch(int64(n), keys != nil, offsets != nil, slots != nil || !withSlots); err != nil {
		return nil, nil, err
	}
	if n == 0 {
		return nil, nil, nil
	}
	offs := unsafe.Slice((*int64)(unsafe.Pointer(offsets)), int(n)+1)
	size, err := keyLength(offs)
	if err != nil {
		return nil, nil, err
	}
	ks, err := storeKeys(unsafe.Slice((*byte)(unsafe.Pointer(keys)), int(size)), offs, domain)
	if err != nil {
		return nil, nil, err
	}
	var ss []int
	if withSlots {
		ss = intSlots(unsafe.Slice((*int64)(unsafe.Pointer(slots)), int(n)))
	}
	return ks, ss, nil
}

// enterBatch starts a call on writer or reader handle h, a T called kind
// (enterHandle), and returns the store keys and slots of its n pages
// (batch). missing is the message of a NULL output argument, "" when there
// is none: it fails the call after a bad handle and before a bad batch.
// The caller must call leave when it returns nil.
func enterBatch[T caller](h C.uint64_t, kind, missing string, keys *C.char, offsets, slots *C.int64_t, withSlots bool, n C.int64_t) (obj T, ks []string, ss []int, err error) {
	if obj, err = enterHandle[T](uint64(h), kind); err != nil {
		return obj, nil, nil, err
	}
	ok := false // leave unless the call goes on (on a panic too)
	defer func() {
		if !ok {
			obj.leave()
		}
	}()
	if missing != "" {
		return obj, nil, nil, invalidf("%s", missing)
	}
	if ks, ss, err = batch(obj.keyDomain(), keys, offsets, slots, withSlots, n); err != nil {
		return obj, nil, nil, err
	}
	ok = true
	return obj, ks, ss, nil
}

//export kvrgoSetMaxProcs
func kvrgoSetMaxProcs(n C.int32_t, prev *C.int32_t, err *C.char, errlen C.size_t) (rc C.int) {
	defer recoverTo(&rc, err, errlen)
	old, e := setMaxProcs(int(n))
	if e == nil && prev != nil {
		*prev = C.int32_t(old)
	}
	return finish(e, "", err, errlen)
}

// setMaxProcs sets GOMAXPROCS to n, or only reads it when n <= 0, and
// returns the cap before the call. An n above maxProcs() changes nothing.
func setMaxProcs(n int) (int, error) {
	if m := maxProcs(); n > m {
		return 0, invalidf("n is %d; the cap is at most %d (KVR_MAX_PROCS, or the CPUs when more)", n, m)
	}
	return runtime.GOMAXPROCS(n), nil
}

// maxProcs is the most kvr_set_max_procs sets: KVR_MAX_PROCS (1024), or
// the process's CPUs when there are more, so that the runtime's default
// cap (at most the CPUs) can always be set again. Every P costs memory,
// about 15 KB (a cap of 100000 took 1.4 GiB; one of 10^9 was killed for
// want of memory), and more Ps than CPUs run nothing more at once. 1024 is
// copy_workers' bound too (maxCopyWorkers), so that copy_workers 0 (the
// cap) stays within it.
func maxProcs() int { return max(kvrMaxProcs, runtime.NumCPU()) }

//export kvrgoModelDomain
func kvrgoModelDomain(m *C.kvr_model, out *C.char, outlen C.size_t, err *C.char, errlen C.size_t) (rc C.int) {
	defer recoverTo(&rc, err, errlen)
	ma, e := goModel(m)
	if e != nil {
		return finish(e, "", err, errlen)
	}
	if out == nil || outlen < 65 {
		return finish(invalidf("out has %d bytes; a model domain needs 65 (64 hex digits and a NUL)", uint64(outlen)), "", err, errlen)
	}
	model, e := buildModel(ma)
	if e != nil {
		return finish(e, "", err, errlen)
	}
	putMsg(out, outlen, model.Domain())
	return finish(nil, "", err, errlen)
}

//export kvrgoStoreOpen
func kvrgoStoreOpen(url *C.char, h *C.uint64_t, err *C.char, errlen C.size_t) (rc C.int) {
	defer recoverTo(&rc, err, errlen)
	if url == nil || h == nil {
		return finish(invalidf("url or store is NULL"), "", err, errlen)
	}
	v, e := openStore(C.GoString(url))
	if e == nil {
		*h = C.uint64_t(v)
	}
	return finish(e, "", err, errlen)
}

//export kvrgoStoreClose
func kvrgoStoreClose(h C.uint64_t, err *C.char, errlen C.size_t) (rc C.int) {
	defer recoverTo(&rc, err, errlen)
	if h == 0 {
		return finish(nil, "", err, errlen) // closing NULL does nothing
	}
	return finish(closeStore(uint64(h)), "", err, errlen)
}

//export kvrgoWriterOpen
func kvrgoWriterOpen(sh C.uint64_t, m *C.kvr_model, p *C.kvr_placement, pool *C.kvr_pool, part *C.char, h *C.uint64_t, err *C.char, errlen C.size_t) (rc C.int) {
	defer recoverTo(&rc, err, errlen)
	if h == nil {
		return finish(invalidf("writer is NULL"), "", err, errlen)
	}
	ma, pa, a, e := goRank(m, p, pool)
	if e != nil {
		return finish(e, "", err, errlen)
	}
	v, e := openWriter(uint64(sh), ma, pa, a, goStr(part))
	if e == nil {
		*h = C.uint64_t(v)
	}
	return finish(e, "", err, errlen)
}

//export kvrgoWriterPublish
func kvrgoWriterPublish(h C.uint64_t, err *C.char, errlen C.size_t) (rc C.int) {
	defer recoverTo(&rc, err, errlen)
	wh, e := enterHandle[*writerHandle](uint64(h), "writer")
	if e == nil {
		defer wh.leave()
		e = wh.publish(context.Background())
	}
	return finish(e, "", err, errlen)
}

//export kvrgoWriterWrite
func kvrgoWriterWrite(h C.uint64_t, keys *C.char, offsets, slots *C.int64_t, n C.int64_t, statuses *C.uint8_t, err *C.char, errlen C.size_t) (rc C.int) {
	defer recoverTo(&rc, err, errlen)
	missing := ""
	if statuses == nil && n > 0 {
		missing = fmt.Sprintf("statuses is NULL with n = %d", int64(n))
	}
	wh, ks, ss, e := enterBatch[*writerHandle](h, "writer", missing, keys, offsets, slots, true, n)
	if e != nil {
		return finish(e, "", err, errlen)
	}
	defer wh.leave()
	var st []uint8
	if n > 0 {
		st = unsafe.Slice((*uint8)(unsafe.Pointer(statuses)), int(n))
	}
	msg, e := wh.write(ks, ss, st)
	return finish(e, msg, err, errlen)
}

//export kvrgoWriterClose
func kvrgoWriterClose(h C.uint64_t, err *C.char, errlen C.size_t) (rc C.int) {
	defer recoverTo(&rc, err, errlen)
	if h == 0 {
		return finish(nil, "", err, errlen) // closing NULL does nothing
	}
	wh, e := lookup[*writerHandle](uint64(h), "writer")
	if e == nil {
		e = wh.close(uint64(h), "writer")
	}
	return finish(e, "", err, errlen)
}

//export kvrgoWriterStats
func kvrgoWriterStats(h C.uint64_t, out *C.kvr_writer_stats, err *C.char, errlen C.size_t) (rc C.int) {
	defer recoverTo(&rc, err, errlen)
	wh, e := lookup[*writerHandle](uint64(h), "writer")
	if e == nil && out == nil {
		e = invalidf("out is NULL")
	}
	if e == nil {
		e = checkOut(out, "kvr_writer_stats")
	}
	if e != nil {
		return finish(e, "", err, errlen)
	}
	s := wh.w.Stats()
	writeOut(out, C.kvr_writer_stats{
		requests: C.int64_t(s.Requests), pages: C.int64_t(s.Pages),
		written: C.int64_t(s.Written), complete: C.int64_t(s.Complete), refused: C.int64_t(s.Refused),
		replica: C.int64_t(s.Replica), failed: C.int64_t(s.Failed), bytes: C.int64_t(s.Bytes),
	})
	return finish(nil, "", err, errlen)
}

//export kvrgoReaderOpen
func kvrgoReaderOpen(sh C.uint64_t, m *C.kvr_model, p *C.kvr_placement, pool *C.kvr_pool, h *C.uint64_t, err *C.char, errlen C.size_t) (rc C.int) {
	defer recoverTo(&rc, err, errlen)
	if h == nil {
		return finish(invalidf("reader is NULL"), "", err, errlen)
	}
	ma, pa, a, e := goRank(m, p, pool)
	if e != nil {
		return finish(e, "", err, errlen)
	}
	v, e := openReader(uint64(sh), ma, pa, a)
	if e == nil {
		*h = C.uint64_t(v)
	}
	return finish(e, "", err, errlen)
}

//export kvrgoReaderExists
func kvrgoReaderExists(h C.uint64_t, keys *C.char, offsets *C.int64_t, n C.int64_t, complete *C.int64_t, err *C.char, errlen C.size_t) (rc C.int) {
	defer recoverTo(&rc, err, errlen)
	missing := ""
	if complete == nil {
		missing = "complete is NULL"
	}
	rh, ks, _, e := enterBatch[*readerHandle](h, "reader", missing, keys, offsets, nil, false, n)
	if e != nil {
		return finish(e, "", err, errlen)
	}
	defer rh.leave()
	c, msg, e := rh.exists(ks)
	*complete = C.int64_t(c)
	return finish(e, msg, err, errlen)
}

//export kvrgoReaderRead
func kvrgoReaderRead(h C.uint64_t, keys *C.char, offsets, slots *C.int64_t, n C.int64_t, res *C.kvr_read_result, err *C.char, errlen C.size_t) (rc C.int) {
	defer recoverTo(&rc, err, errlen)
	missing := ""
	if res == nil {
		missing = "res is NULL"
	} else if e := checkOut(res, "kvr_read_result"); e != nil {
		missing = e.Error()
	}
	rh, ks, ss, e := enterBatch[*readerHandle](h, "reader", missing, keys, offsets, slots, true, n)
	if e != nil {
		return finish(e, "", err, errlen)
	}
	defer rh.leave()
	r, e := rh.read(ks, ss)
	if e != nil {
		return finish(e, "", err, errlen)
	}
	stop := stopCode(r.Stop)
	writeOut(res, C.kvr_read_result{hit: C.int64_t(r.Hit), bytes: C.int64_t(r.Bytes), ops: C.int64_t(r.Ops), stop: C.int32_t(stop)})
	if r.Stop == nil {
		return finish(nil, "", err, errlen)
	}
	if stop == kvrStopFailed {
		// The store failed: an error, with the hit prefix in *res usable.
		return finish(errorf(kvrEStore, "%v", r.Stop), "", err, errlen)
	}
	return finish(nil, r.Stop.Error(), err, errlen)
}

//export kvrgoReaderSetOptions
func kvrgoReaderSetOptions(h C.uint64_t, opts *C.kvr_reader_options, err *C.char, errlen C.size_t) (rc C.int) {
	defer recoverTo(&rc, err, errlen)
	rh, e := lookup[*readerHandle](uint64(h), "reader")
	var o readerOptions
	if e == nil {
		o, e = goReaderOptions(opts)
	}
	if e == nil {
		e = rh.setOptions(uint64(h), o)
	}
	return finish(e, "", err, errlen)
}

// goReaderOptions reads the options of a kvr_reader_options (growing).
func goReaderOptions(p *C.kvr_reader_options) (readerOptions, error) {
	if p == nil {
		return readerOptions{}, invalidf("options is NULL")
	}
	o, err := readIn(p, "kvr_reader_options")
	if err != nil {
		return readerOptions{}, err
	}
	if o.check_parts != 0 && o.check_parts != 1 {
		return readerOptions{}, invalidf("check_parts is %d; want 0 (no checks) or 1", o.check_parts)
	}
	return readerOptions{copyWorkers: int64(o.copy_workers), maxPages: int64(o.max_pages), maxBytes: int64(o.max_bytes),
		checkParts: o.check_parts != 0}, nil
}

//export kvrgoReaderStats
func kvrgoReaderStats(h C.uint64_t, out *C.kvr_reader_stats, err *C.char, errlen C.size_t) (rc C.int) {
	defer recoverTo(&rc, err, errlen)
	rh, e := lookup[*readerHandle](uint64(h), "reader")
	if e == nil && out == nil {
		e = invalidf("out is NULL")
	}
	if e == nil {
		e = checkOut(out, "kvr_reader_stats")
	}
	if e != nil {
		return finish(e, "", err, errlen)
	}
	s := rh.stats()
	writeOut(out, C.kvr_reader_stats{
		requests: C.int64_t(s.Requests), pages: C.int64_t(s.Pages), hits: C.int64_t(s.Hits), misses: C.int64_t(s.Misses),
		bytes: C.int64_t(s.Bytes), ops: C.int64_t(s.Ops), manifests_rejected: C.int64_t(s.ManifestsRejected),
		fallbacks: C.int64_t(s.Fallbacks), parts_checked: C.int64_t(s.PartsChecked), checksum_errors: C.int64_t(s.ChecksumErrors),
	})
	return finish(nil, "", err, errlen)
}

//export kvrgoReaderClose
func kvrgoReaderClose(h C.uint64_t, err *C.char, errlen C.size_t) (rc C.int) {
	defer recoverTo(&rc, err, errlen)
	if h == 0 {
		return finish(nil, "", err, errlen) // closing NULL does nothing
	}
	rh, e := lookup[*readerHandle](uint64(h), "reader")
	if e == nil {
		e = rh.close(uint64(h), "reader")
	}
	return finish(e, "", err, errlen)
}

//export kvrgoStoreOpenEngine
func kvrgoStoreOpenEngine(e *C.kvr_engine, name *C.char, h *C.uint64_t, err *C.char, errlen C.size_t) (rc C.int) {
	defer recoverTo(&rc, err, errlen)
	if h == nil {
		return finish(invalidf("store is NULL"), "", err, errlen)
	}
	v, ee := openEngineStore(e, goStr(name))
	if ee == nil {
		*h = C.uint64_t(v)
	}
	return finish(ee, "", err, errlen)
}
