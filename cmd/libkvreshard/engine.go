package main

/*
#include <stdlib.h>
#include "kvreshard.h"

// Go calls the callbacks of a kvr_engine through these: cgo does not call
// C function pointers.
static int kvr_engine_put(const kvr_engine *e, int64_t n, const char *keys, const int64_t *off, const void *const *frags,
                          const int64_t *fl, const int64_t *fo, int32_t *res, char *err, size_t errlen) {
	return e->put(e->ctx, n, keys, off, frags, fl, fo, res, err, errlen);
}
static int kvr_engine_get(const kvr_engine *e, int64_t n, const char *keys, const int64_t *off, void *const *bufs,
                          const int64_t *caps, int64_t *sizes, char *err, size_t errlen) {
	return e->get(e->ctx, n, keys, off, bufs, caps, sizes, err, errlen);
}
static int kvr_engine_exists(const kvr_engine *e, int64_t n, const char *keys, const int64_t *off, uint8_t *ex, char *err,
                             size_t errlen) {
	return e->exists(e->ctx, n, keys, off, ex, err, errlen);
}
static int kvr_engine_sizes(const kvr_engine *e, int64_t n, const char *keys, const int64_t *off, int64_t *sizes, char *err,
                            size_t errlen) {
	return e->sizes(e->ctx, n, keys, off, sizes, err, errlen);
}
static int kvr_engine_read(const kvr_engine *e, int64_t nkeys, const char *keys, const int64_t *off, int64_t nranges,
                           const int64_t *key, const int64_t *offs, void *const *dst, const int64_t *lens, void *const *base,
                           const uint8_t *whole, int64_t *res, char *err, size_t errlen) {
	return e->read(e->ctx, nkeys, keys, off, nranges, key, offs, dst, lens, base, whole, res, err, errlen);
}
static int kvr_engine_remove(const kvr_engine *e, int64_t n, const char *keys, const int64_t *off, char *err, size_t errlen) {
	return e->remove(e->ctx, n, keys, off, err, errlen);
}
static int kvr_engine_register(const kvr_engine *e, void *base, uint64_t len, char *err, size_t errlen) {
	return e->register_memory == NULL ? 0 : e->register_memory(e->ctx, base, len, err, errlen);
}
static int kvr_engine_unregister(const kvr_engine *e, void *base, uint64_t len, char *err, size_t errlen) {
	return e->unregister_memory == NULL ? 0 : e->unregister_memory(e->ctx, base, len, err, errlen);
}
static void kvr_engine_close(const kvr_engine *e) {
	if (e->close != NULL) {
		e->close(e->ctx);
	}
}
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/cgo"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/kvreshard/kvreshard/runtime/store/enginestore"
)

// cEngine is an enginestore.Engine whose calls are the callbacks of a C
// kvr_engine table, of which it keeps a copy in C memory (C never holds a
// Go pointer).
type cEngine struct {
	e *C.kvr_engine

	mu    sync.Mutex
	regs  []cReg // registered memory, sorted by start: a read's base
	close sync.Once
}

type cReg struct {
	p      unsafe.Pointer // the start, as given
	lo, hi uintptr
	refs   int
}

var _ enginestore.Engine = (*cEngine)(nil)

// cErrLen is the size of the message buffer a callback writes into.
const cErrLen = 1024

// newCEngine checks and copies a kvr_engine table.
func newCEngine(e *C.kvr_engine) (*cEngine, error) {
	if e == nil {
		return nil, invalidf("engine is NULL")
	}
	if err := checkSize(unsafe.Pointer(e), uintptr(e.size), unsafe.Sizeof(*e), "kvr_engine"); err != nil {
		return nil, err
	}
	for _, f := range []struct {
		name string
		set  bool
	}{{"put", e.put != nil}, {"get", e.get != nil}, {"exists", e.exists != nil}, {"sizes", e.sizes != nil},
		{"read", e.read != nil}, {"remove", e.remove != nil}} {
		if !f.set {
			return nil, invalidf("kvr_engine.%s is NULL", f.name)
		}
	}
	if e.read_timeout_ms < 0 || e.lease_ms < 0 {
		return nil, invalidf("kvr_engine read_timeout_ms %d or lease_ms %d is negative", int64(e.read_timeout_ms), int64(e.lease_ms))
	}
	c := (*C.kvr_engine)(C.malloc(C.size_t(unsafe.Sizeof(*e))))
	*c = *e
	return &cEngine{e: c}, nil
}

// cCall is the memory of one callback: its keys, its message buffer, and
// the Go memory its pointers point into, pinned for the call.
type cCall struct {
	keys []byte
	off  []int64
	err  [cErrLen]C.char
	pin  runtime.Pinner
}

func newCall(keys []string) *cCall {
	c := &cCall{off: make([]int64, 1, len(keys)+1)}
	n := 0
	for _, k := range keys {
		n += len(k)
	}
	c.keys = make([]byte, 0, max(n, 1))
	for _, k := range keys {
		c.keys = append(c.keys, k...)
		c.off = append(c.off, int64(len(c.keys)))
	}
	c.keys = c.keys[:max(len(c.keys), 1)] // never a nil pointer
	c.pin.Pin(&c.keys[0])
	c.pin.Pin(&c.off[0])
	return c
}

func (c *cCall) keysPtr() *C.char   { return (*C.char)(unsafe.Pointer(&c.keys[0])) }
func (c *cCall) offPtr() *C.int64_t { return (*C.int64_t)(unsafe.Pointer(&c.off[0])) }
func (c *cCall) errPtr() *C.char    { return &c.err[0] }
func (c *cCall) errLen() C.size_t   { return cErrLen }
func (c *cCall) message() string    { return C.GoString(&c.err[0]) }
func (c *cCall) failed(rc C.int, call string) error {
	msg := c.message()
	if msg == "" {
		msg = fmt.Sprintf("returned %d", int(rc))
	}
	return fmt.Errorf("engine %s: %s", call, msg)
}

// ptr returns the address of b's first byte, pinned for the call when it
// is Go memory (pinning other memory does nothing).
func (c *cCall) ptr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	c.pin.Pin(p)
	return p
}

// Put implements enginestore.Engine.
func (e *cEngine) Put(ctx context.Context, keys []string, data [][][]byte) []error {
	errs := make([]error, len(keys))
	if len(keys) == 0 {
		return errs
	}
	c := newCall(keys)
	defer c.pin.Unpin()
	var frags []unsafe.Pointer
	var lens []int64
	fragOff := []int64{0}
	for _, d := range data {
		for _, f := range d {
			if len(f) > 0 {
				frags, lens = append(frags, c.ptr(f)), append(lens, int64(len(f)))
			}
		}
		fragOff = append(fragOff, int64(len(frags)))
	}
	frags, lens = append(frags, nil), append(lens, 0) // never empty
	res := make([]int32, len(keys))
	rc := C.kvr_engine_put(e.e, C.int64_t(len(keys)), c.keysPtr(), c.offPtr(), (*unsafe.Pointer)(c.ptrOf(unsafe.Pointer(&frags[0]))),
		(*C.int64_t)(c.ptrOf(unsafe.Pointer(&lens[0]))), (*C.int64_t)(c.ptrOf(unsafe.Pointer(&fragOff[0]))),
		(*C.int32_t)(c.ptrOf(unsafe.Pointer(&res[0]))), c.errPtr(), c.errLen())
	if rc != 0 {
		err := c.failed(rc, "put")
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	var first error
	for i, r := range res {
		if r < 0 {
			if first == nil {
				first = c.failed(C.int(r), "put")
			}
			errs[i] = fmt.Errorf("%w (object %d: %d)", first, i, r)
		}
	}
	return errs
}

// ptrOf pins p (a Go slice's first element) for the call and returns it.
func (c *cCall) ptrOf(p unsafe.Pointer) unsafe.Pointer {
	c.pin.Pin(p)
	return p
}

// Get implements enginestore.Engine: it asks with buffers of 4 KiB, then
// again for the objects larger than that, with buffers of their size.
func (e *cEngine) Get(ctx context.Context, keys []string, limit int) ([][]byte, error) {
	out := make([][]byte, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	todo := make([]int, len(keys))
	caps := make([]int64, len(keys))
	for i := range todo {
		todo[i], caps[i] = i, int64(min(4096, limit))
	}
	for round := 0; len(todo) > 0; round++ {
		if round == 3 {
			return nil, fmt.Errorf("engine get: objects kept growing between calls")
		}
		ks := make([]string, len(todo))
		for j, i := range todo {
			ks[j] = keys[i]
		}
		c := newCall(ks)
		bufs := make([][]byte, len(todo))
		ptrs := make([]unsafe.Pointer, len(todo))
		cp := make([]int64, len(todo))
		sizes := make([]int64, len(todo))
		for j, i := range todo {
			bufs[j] = make([]byte, max(caps[i], 1))
			ptrs[j], cp[j] = c.ptr(bufs[j]), caps[i]
		}
		rc := C.kvr_engine_get(e.e, C.int64_t(len(ks)), c.keysPtr(), c.offPtr(), (*unsafe.Pointer)(c.ptrOf(unsafe.Pointer(&ptrs[0]))),
			(*C.int64_t)(c.ptrOf(unsafe.Pointer(&cp[0]))), (*C.int64_t)(c.ptrOf(unsafe.Pointer(&sizes[0]))), c.errPtr(), c.errLen())
		var err error
		if rc != 0 {
			err = c.failed(rc, "get")
		}
		c.pin.Unpin()
		if err != nil {
			return nil, err
		}
		var again []int
		for j, i := range todo {
			switch n := sizes[j]; {
			case n == C.KVR_ENGINE_MISSING:
			case n < 0:
				return nil, fmt.Errorf("engine get %q: size %d", keys[i], n)
			case n > int64(limit):
				return nil, fmt.Errorf("engine get %q: %d bytes, more than %d", keys[i], n, limit)
			case n > caps[i]:
				caps[i] = n
				again = append(again, i)
			default:
				out[i] = bufs[j][:n:n]
			}
		}
		todo = again
	}
	return out, nil
}

// Exists implements enginestore.Engine.
func (e *cEngine) Exists(ctx context.Context, keys []string) ([]bool, error) {
	out := make([]bool, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	c := newCall(keys)
	defer c.pin.Unpin()
	ex := make([]uint8, len(keys))
	if rc := C.kvr_engine_exists(e.e, C.int64_t(len(keys)), c.keysPtr(), c.offPtr(), (*C.uint8_t)(c.ptrOf(unsafe.Pointer(&ex[0]))), c.errPtr(), c.errLen()); rc != 0 {
		return nil, c.failed(rc, "exists")
	}
	for i, v := range ex {
		out[i] = v != 0
	}
	return out, nil
}

// Sizes implements enginestore.Engine.
func (e *cEngine) Sizes(ctx context.Context, keys []string) ([]int64, error) {
	out := make([]int64, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	c := newCall(keys)
	defer c.pin.Unpin()
	if rc := C.kvr_engine_sizes(e.e, C.int64_t(len(keys)), c.keysPtr(), c.offPtr(), (*C.int64_t)(c.ptrOf(unsafe.Pointer(&out[0]))), c.errPtr(), c.errLen()); rc != 0 {
		return nil, c.failed(rc, "sizes")
	}
	for i, n := range out {
		if n < 0 && n != C.KVR_ENGINE_MISSING {
			return nil, fmt.Errorf("engine sizes %q: size %d", keys[i], n)
		}
	}
	return out, nil
}

// Read implements enginestore.Engine: the ranges in one callback, each
// with the base of the registered memory it lies in.
func (e *cEngine) Read(ctx context.Context, rs []enginestore.Range) (int, error) {
	if len(rs) == 0 {
		return 0, nil
	}
	var keys []string
	index := map[string]int{}
	key := make([]int64, len(rs))
	offs := make([]int64, len(rs))
	dst := make([]unsafe.Pointer, len(rs))
	lens := make([]int64, len(rs))
	base := make([]unsafe.Pointer, len(rs))
	whole := make([]uint8, len(rs))
	res := make([]int64, len(rs))
	for j, r := range rs {
		k, ok := index[r.Key]
		if !ok {
			k = len(keys)
			index[r.Key] = k
			keys = append(keys, r.Key)
		}
		b, ok := e.base(r.Dst)
		if !ok {
			return j, fmt.Errorf("engine read %q: %d bytes into memory that is not registered", r.Key, len(r.Dst))
		}
		key[j], offs[j], lens[j], base[j] = int64(k), r.Off, int64(len(r.Dst)), b
		dst[j] = unsafe.Pointer(unsafe.SliceData(r.Dst))
		if r.Whole {
			whole[j] = 1
		}
	}
	c := newCall(keys)
	defer c.pin.Unpin()
	rc := C.kvr_engine_read(e.e, C.int64_t(len(keys)), c.keysPtr(), c.offPtr(), C.int64_t(len(rs)),
		(*C.int64_t)(c.ptrOf(unsafe.Pointer(&key[0]))), (*C.int64_t)(c.ptrOf(unsafe.Pointer(&offs[0]))),
		(*unsafe.Pointer)(c.ptrOf(unsafe.Pointer(&dst[0]))), (*C.int64_t)(c.ptrOf(unsafe.Pointer(&lens[0]))),
		(*unsafe.Pointer)(c.ptrOf(unsafe.Pointer(&base[0]))), (*C.uint8_t)(c.ptrOf(unsafe.Pointer(&whole[0]))),
		(*C.int64_t)(c.ptrOf(unsafe.Pointer(&res[0]))), c.errPtr(), c.errLen())
	if rc != 0 {
		return 0, c.failed(rc, "read")
	}
	for j, n := range res {
		switch {
		case n == C.KVR_ENGINE_MISSING:
			return j, fmt.Errorf("engine read %q: %w", rs[j].Key, enginestore.ErrNotFound)
		case n != lens[j]:
			msg := c.message()
			if msg == "" {
				msg = fmt.Sprintf("result %d", n)
			}
			return j, fmt.Errorf("engine read %q [%d,+%d): %s", rs[j].Key, rs[j].Off, lens[j], msg)
		}
	}
	return len(rs), nil
}

// Remove implements enginestore.Engine.
func (e *cEngine) Remove(ctx context.Context, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	c := newCall(keys)
	defer c.pin.Unpin()
	if rc := C.kvr_engine_remove(e.e, C.int64_t(len(keys)), c.keysPtr(), c.offPtr(), c.errPtr(), c.errLen()); rc != 0 {
		return c.failed(rc, "remove")
	}
	return nil
}

// Register implements enginestore.Engine: memory registered twice (a
// reader and a writer of one pool) is registered with the engine once.
func (e *cEngine) Register(b []byte) error {
	lo, hi := uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))+uintptr(len(b))
	e.mu.Lock()
	defer e.mu.Unlock()
	i, found := slices.BinarySearchFunc(e.regs, lo, func(r cReg, lo uintptr) int { return cmpAddr(r.lo, lo) })
	if found && e.regs[i].hi == hi {
		e.regs[i].refs++
		return nil
	}
	var msg [cErrLen]C.char
	if rc := C.kvr_engine_register(e.e, unsafe.Pointer(unsafe.SliceData(b)), C.uint64_t(len(b)), &msg[0], cErrLen); rc != 0 {
		return fmt.Errorf("engine register_memory: %s", C.GoString(&msg[0]))
	}
	e.regs = slices.Insert(e.regs, i, cReg{unsafe.Pointer(unsafe.SliceData(b)), lo, hi, 1})
	return nil
}

// Unregister implements enginestore.Engine.
func (e *cEngine) Unregister(b []byte) error {
	lo, hi := uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))+uintptr(len(b))
	e.mu.Lock()
	defer e.mu.Unlock()
	i, found := slices.BinarySearchFunc(e.regs, lo, func(r cReg, lo uintptr) int { return cmpAddr(r.lo, lo) })
	if !found || e.regs[i].hi != hi {
		return errors.New("engine unregister_memory: memory that is not registered")
	}
	if e.regs[i].refs--; e.regs[i].refs > 0 {
		return nil
	}
	e.regs = slices.Delete(e.regs, i, i+1)
	var msg [cErrLen]C.char
	if rc := C.kvr_engine_unregister(e.e, unsafe.Pointer(unsafe.SliceData(b)), C.uint64_t(len(b)), &msg[0], cErrLen); rc != 0 {
		return fmt.Errorf("engine unregister_memory: %s", C.GoString(&msg[0]))
	}
	return nil
}

func cmpAddr(a, b uintptr) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// base returns the start of the registered memory b lies in.
func (e *cEngine) base(b []byte) (unsafe.Pointer, bool) {
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	hi := lo + uintptr(len(b))
	e.mu.Lock()
	defer e.mu.Unlock()
	i, found := slices.BinarySearchFunc(e.regs, lo, func(r cReg, lo uintptr) int { return cmpAddr(r.lo, lo) })
	if !found {
		i--
	}
	if i < 0 || e.regs[i].lo > lo || hi > e.regs[i].hi {
		return nil, false
	}
	return e.regs[i].p, true
}

// Close implements enginestore.Engine: it calls the table's close once and
// frees the table.
func (e *cEngine) Close() error {
	e.close.Do(func() {
		C.kvr_engine_close(e.e)
		C.free(unsafe.Pointer(e.e))
	})
	return nil
}

// options returns the store options the table gives, named name.
func (e *cEngine) options(name string) enginestore.Options {
	return enginestore.Options{Name: name, ReadTimeout: time.Duration(e.e.read_timeout_ms) * time.Millisecond,
		Lease: time.Duration(e.e.lease_ms) * time.Millisecond}
}

// openEngineStore opens a store on the object engine of a kvr_engine
// table, named name ("mooncake://host:port", or "engine:<name>").
//
// A refused open does not call the table's close: ctx stays the caller's.
func openEngineStore(e *C.kvr_engine, name string) (uint64, error) {
	if name == "" {
		name = "engine:"
	}
	if !strings.HasPrefix(name, "mooncake://") && !strings.HasPrefix(name, "engine:") {
		return 0, invalidf(`engine store name %q: want "mooncake://host:port..." or "engine:<name>"`, name)
	}
	ce, err := newCEngine(e)
	if err != nil {
		return 0, err
	}
	st := enginestore.New(ce, ce.options(name))
	return uint64(cgo.NewHandle(&storeHandle{url: name, st: st})), nil
}
