// Command libkvreshard is kvreshard's runtime as a C library, for the
// serving processes that keep KV caches and are not Go programs (SGLang
// and vLLM in Python, TensorRT-LLM in C++). Build it with
//
//	go build -buildmode=c-shared -o libkvreshard.so ./cmd/libkvreshard
//
// and include kvreshard.h, beside this file, which is its manual: the Go
// header the build writes beside the library is not the API. The Python
// package kvreshard (python/) loads the library with ctypes.
//
// The API is batch-oriented: a call writes, reads or checks the existence
// of a batch of pages (keys in one buffer with offsets, one pool slot per
// page) between a store and the caller's host pool, whose memory the
// caller owns and registers when it opens a writer or a reader. Stores,
// writers and readers are runtime/cgo handles, which C holds as pointers
// of the opaque types kvr_store, kvr_writer and kvr_reader (their values
// are the ids, never dereferenced), closed explicitly. Every function
// returns an int code and writes its message into a buffer of the caller;
// none allocates memory the caller must free, and C never holds a Go
// pointer. Structs carry their size, so that they grow (structs.go); the
// ABI version is 2.1 (codes.go).
//
// kvreshard.c holds the public functions: each checks first, in C, that it
// runs in the process that loaded the library (Go does not survive fork:
// a forked child gets KVR_EFORK instead of a call that may hang) and then
// calls its Go export in exports.go, which recovers from any panic.
//
// A Go function called from C runs on a goroutine locked to the C thread,
// where every join of a read's copy workers costs two thread wakeups; a
// read that may start copy workers therefore runs on a goroutine of the
// library while the C thread waits (readerHandle.offload in handles.go).
package main

import (
	// The stores a URL may name.
	_ "github.com/kvreshard/kvreshard/runtime/store/filestore"
	_ "github.com/kvreshard/kvreshard/runtime/store/memstore"
	_ "github.com/kvreshard/kvreshard/runtime/store/redisstore"
)

// main is not run: the library's code runs when C calls it.
func main() {}
