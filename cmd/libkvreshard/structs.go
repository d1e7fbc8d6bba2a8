package main

/*
#include "kvreshard.h"
*/
import "C"

import (
	"unsafe"
)

// The growing structs of kvreshard.h: each begins with uint32_t size, the
// size of the struct as the caller compiled it. An input's fields within
// size are read (a field past it is 0); bytes past the fields this library
// knows must be 0. An output gets the fields that fit in size, and 0 past
// the fields this library knows.

// maxStructSize bounds the size a caller may give a growing struct.
const maxStructSize = 4096

// firstSizes is the size of each growing struct in its first version (ABI
// 2.0): the end of its last field then. A caller's size below it is
// refused. A minor version that adds fields at the end of a struct keeps
// its entry here as it is.
var firstSizes = map[string]uintptr{
	"kvr_model":          unsafe.Offsetof(C.kvr_model{}.fingerprint) + unsafe.Sizeof(C.kvr_model{}.fingerprint),
	"kvr_placement":      unsafe.Offsetof(C.kvr_placement{}.pp_layers) + unsafe.Sizeof(C.kvr_placement{}.pp_layers),
	"kvr_pool":           unsafe.Offsetof(C.kvr_pool{}.slots) + unsafe.Sizeof(C.kvr_pool{}.slots),
	"kvr_reader_options": unsafe.Offsetof(C.kvr_reader_options{}.check_parts) + unsafe.Sizeof(C.kvr_reader_options{}.check_parts),
	"kvr_engine":         unsafe.Offsetof(C.kvr_engine{}.lease_ms) + unsafe.Sizeof(C.kvr_engine{}.lease_ms),
	"kvr_read_result":    unsafe.Offsetof(C.kvr_read_result{}.ops) + unsafe.Sizeof(C.kvr_read_result{}.ops),
	"kvr_reader_stats":   unsafe.Offsetof(C.kvr_reader_stats{}.checksum_errors) + unsafe.Sizeof(C.kvr_reader_stats{}.checksum_errors),
	"kvr_writer_stats":   unsafe.Offsetof(C.kvr_writer_stats{}.bytes) + unsafe.Sizeof(C.kvr_writer_stats{}.bytes),
}

// lastEnd returns the end of the last field this library reads or writes
// of the growing struct name: bytes from there on are a newer header's.
// No struct has grown since ABI 2.0, so it is each one's first size; a
// minor that adds a field returns its end here. Room past it within the
// struct (kvr_reader_options' reserved) is checked as a field this library
// does not know, so that a later minor cannot put a field where an older
// library would not see it.
func lastEnd(name string) uintptr { return firstSizes[name] }

// structSize returns the size field of the growing struct at p.
func structSize(p unsafe.Pointer) uintptr { return uintptr(*(*uint32)(p)) }

// checkSize checks the size field of a growing struct at p, called name,
// which this library knows as known bytes (its sizeof): at least its first
// version's, at most maxStructSize, and, for an input, any bytes past the
// last field this library reads 0 (a field of a newer header this library
// does not have).
func checkSize(p unsafe.Pointer, known uintptr, name string, input bool) (uintptr, error) {
	size := structSize(p)
	switch {
	case size < firstSizes[name]:
		return 0, invalidf("%s.size is %d; this library's %s has %d bytes: set size to sizeof(%s)", name, size, name, known, name)
	case size > maxStructSize:
		return 0, invalidf("%s.size is %d, more than %d", name, size, maxStructSize)
	}
	if end := lastEnd(name); input && size > end {
		for i, b := range unsafe.Slice((*byte)(p), size)[end:] {
			if b != 0 {
				return 0, invalidf("%s byte %d is %d: a field this library (ABI %d.%d) does not know is set", name, end+uintptr(i), b, abiVersion, abiMinor)
			}
		}
	}
	return size, nil
}

// readIn returns a copy of the growing input struct at p, called name:
// the fields within its size, the others 0.
func readIn[T any](p *T, name string) (T, error) {
	var v T
	known := unsafe.Sizeof(v)
	size, err := checkSize(unsafe.Pointer(p), known, name, true)
	if err != nil {
		return v, err
	}
	n := min(size, known)
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&v)), n), unsafe.Slice((*byte)(unsafe.Pointer(p)), n))
	return v, nil
}

// checkOut checks the size of the growing output struct at p, called
// name, before a call computes what it writes there (writeOut).
func checkOut[T any](p *T, name string) error {
	var v T
	_, err := checkSize(unsafe.Pointer(p), unsafe.Sizeof(v), name, false)
	return err
}

// writeOut writes v into the growing output struct at p, whose size
// checkOut checked: the fields that fit in its size but size itself, and
// 0 into the bytes past v's.
func writeOut[T any](p *T, v T) {
	known := unsafe.Sizeof(v)
	size := structSize(unsafe.Pointer(p))
	dst := unsafe.Slice((*byte)(unsafe.Pointer(p)), size)
	src := unsafe.Slice((*byte)(unsafe.Pointer(&v)), known)
	const sizeField = 4 // uint32_t size, first
	n := min(size, known)
	copy(dst[sizeField:n], src[sizeField:n])
	clear(dst[n:])
}
