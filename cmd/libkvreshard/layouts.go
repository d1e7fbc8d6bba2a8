package main

/*
#include "kvreshard.h"
*/
import "C"

import (
	"strings"
	"unsafe"

	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/runtime/kernel"
)

// The layouts of kvr_layouts and kvr_define_layout (ABI 2.1): the registry
// of package kernel, which holds the built-ins (layouts/builtin.kvl), the
// layouts of packages linked in, and those defined at run time.

// definedOrigin is where a layout defined by kvr_define_layout comes from,
// as messages name it.
const definedOrigin = "defined at run time"

// layoutsText returns the registered layouts as kvr_layouts writes them:
// one line a layout, in registration order, of tab-separated fields kind,
// name, order and the part layout a pool writes ("" for none). Names are
// identifiers and orders axes and factors separated by spaces, so no field
// holds a tab or a newline.
func layoutsText() string {
	var b strings.Builder
	for _, l := range kernel.Layouts() {
		b.WriteString(l.Kind.String())
		b.WriteByte('\t')
		b.WriteString(l.Name)
		b.WriteByte('\t')
		b.WriteString(l.Order())
		b.WriteByte('\t')
		b.WriteString(l.Writes)
		b.WriteByte('\n')
	}
	return b.String()
}

// defineLayout registers the layout kind called name of order at run time,
// writing part layout writes ("" for none) when it is a pool. Its errors
// are kvlc's messages (kernel.RegisterLayout), and a pool that writes
// what is not a registered part layout.
func defineLayout(kind, name, order, writes string) error {
	if kind == ir.Pool.String() && writes != "" {
		parts := kernel.ListNames(partLayouts())
		w, err := kernel.LayoutNamed(writes)
		if err != nil {
			return invalidf("layout %q: writes %q, which is not a registered part layout (%s)", name, writes, parts)
		}
		if w.Kind != ir.Part {
			return invalidf("layout %q: writes %s, a pool layout; a pool writes a part layout (%s)", name, writes, parts)
		}
	}
	if _, err := kernel.RegisterLayout(kernel.LayoutDecl{Kind: kind, Name: name, Order: order, Writes: writes, Origin: definedOrigin}); err != nil {
		return invalidf("%v", err)
	}
	return nil
}

//export kvrgoLayouts
func kvrgoLayouts(out *C.char, outlen C.size_t, need *C.size_t, err *C.char, errlen C.size_t) (rc C.int) {
	defer recoverTo(&rc, err, errlen)
	text := layoutsText()
	n := uint64(len(text)) + 1
	if need != nil {
		*need = C.size_t(n)
	}
	switch {
	case out == nil && outlen == 0 && need != nil:
		return finish(nil, "", err, errlen) // a query of the size
	case out == nil:
		return finish(invalidf("out is NULL with outlen %d", uint64(outlen)), "", err, errlen)
	case uint64(outlen) < n:
		if outlen > 0 {
			*out = 0
		}
		return finish(invalidf("out has %d bytes; the layouts take %d", uint64(outlen), n), "", err, errlen)
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(out)), n)
	copy(b, text)
	b[n-1] = 0
	return finish(nil, "", err, errlen)
}

//export kvrgoDefineLayout
func kvrgoDefineLayout(kind, name, order, writes *C.char, err *C.char, errlen C.size_t) (rc C.int) {
	defer recoverTo(&rc, err, errlen)
	if kind == nil || name == nil || order == nil {
		return finish(invalidf("kind, name or order is NULL"), "", err, errlen)
	}
	return finish(defineLayout(C.GoString(kind), C.GoString(name), C.GoString(order), goStr(writes)), "", err, errlen)
}
