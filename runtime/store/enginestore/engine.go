// Package enginestore keeps kvreshard's multipart pages in an object
// engine: a store of immutable objects under string keys, such as Mooncake
// Store, a NIXL-backed store or 3FS, whose client lives in the serving
// process. The engine gives objects; this package maps kvreshard's store
// protocol (claims, completion, part sizes, leases, manifests) onto them
// once, for every engine. The C library hands a host process's engine to
// it as a table of callbacks (kvreshard.h, kvr_engine); Mooncake's Python
// client is one (python/kvreshard/mooncake.py).
//
// # Objects
//
// A page (object of the store protocol) with key K is kept as objects
//
//	K/claim                 the first writer's claim: part count, time, manifest key
//	K/p/<digest>/<i>        part i written under the manifest of that digest
//	K/done                  the commit: the manifest key and each part's size
//	meta/<manifest key>     a manifest (metadata object)
//
// A part's key names its manifest, so parts of two layouts never mix: a
// page rewritten in another layout since a reader planned it has other part
// keys, and the reader's ranges name the manifest it planned for. A writer
// puts its part, then checks whether every part of its manifest exists, and
// if so puts K/done: the page is visible (complete) only once K/done
// exists, and K/done is put only after all the parts it names were seen.
// Every put keeps the first value of a key (the engine's first writer
// wins), so two writers that complete the same page put the same K/done.
//
// The claim fixes the layout: the first writer of an incomplete page puts
// K/claim; a writer of another manifest or part count is refused
// (store.ErrLayoutConflict) until the claim is older than the lease, and
// then removes it, with the parts it names, and claims the page itself.
// Objects are immutable, so part writes do not refresh a claim: the lease
// runs from the claim's time, as its writer's clock put it.
//
// # Objects that vanish
//
// An engine may drop any object at any time (eviction, a client that exited
// with the memory it contributed): a missing K/done is a miss; a missing
// part of a page whose K/done exists is a miss too, and the store then
// removes K/done and K/claim, so that writers see the page as new and write
// it again instead of skipping it as complete forever. A missing manifest
// is store.ErrNotFound: readers count the page a miss, and writers put the
// manifest again (reshard.Writer). A reader never gets bytes of a part it
// did not plan for and never reads a page as complete while a part of it is
// missing.
//
// # Memory
//
// Engines such as Mooncake's transfer only to and from memory registered
// with them. Register registers memory the caller keeps (a rank's host
// pool, for its writer's and reader's lifetime); Alloc gives memory the
// store mapped and registered (a reader's staging buffer). A transfer to
// or from memory that is neither goes through a bounce buffer of the
// store's own, registered, at the cost of a copy.
package enginestore

import (
	"context"
	"errors"
)

// Engine is an object store. Implementations are safe for concurrent use.
// Keys are arbitrary bytes of at most MaxKey bytes.
type Engine interface {
	// Put stores each object; an object whose key exists keeps its value
	// and Put reports no error for it (the first writer wins). Data holds
	// an object's bytes as fragments, in memory registered or not (an
	// engine copies what it cannot send from). It returns one error a key
	// (nil: stored, or kept).
	Put(ctx context.Context, keys []string, data [][][]byte) []error
	// Get returns small objects whole: a nil slice for a missing key. A
	// value longer than limit is an error for the batch.
	Get(ctx context.Context, keys []string, limit int) ([][]byte, error)
	// Exists reports whether each key exists.
	Exists(ctx context.Context, keys []string) ([]bool, error)
	// Sizes returns each object's size, -1 for a missing key.
	Sizes(ctx context.Context, keys []string) ([]int64, error)
	// Read reads the ranges, each into registered memory (Register), and
	// returns how many leading ranges were read in full. When n < len(rs), err says
	// why: ErrNotFound (wrapped) for a missing object, or another error.
	Read(ctx context.Context, rs []Range) (n int, err error)
	// Remove removes objects; a missing key is no error.
	Remove(ctx context.Context, keys []string) error
	// Register registers memory for transfers until Unregister; it may be
	// a no-op. The memory stays the caller's.
	Register(b []byte) error
	Unregister(b []byte) error
	// Close releases the engine.
	Close() error
}

// Range reads len(Dst) bytes at offset Off of object Key; Whole says the
// range is the whole object (an engine may read it by another call).
type Range struct {
	Key   string
	Off   int64
	Dst   []byte
	Whole bool
}

// ErrNotFound: the object does not exist (any more).
var ErrNotFound = errors.New("object not found")

// MaxKey bounds the keys the store gives an engine: a page key of at most
// MaxPageKey bytes, then at most 96 bytes of its own.
const (
	MaxKey     = MaxPageKey + 96
	MaxPageKey = 1024
)
