// Package storetest is the conformance suite for store backends. A backend's
// test calls Run with a function that opens a store:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) store.Store { return openMyStore(t) })
//	}
//
// or RunBackend with a Backend, whose optional hooks enable the subtests
// that need to reach behind the Store interface:
//
//	storetest.RunBackend(t, storetest.Backend{
//		Open:      func(t *testing.T) store.Store { ... },
//		OpenLease: func(t *testing.T, lease time.Duration) store.Store { ... },
//		Age:       func(t *testing.T, s store.Store, key string, d time.Duration) { ... },
//		Corrupt:   func(t *testing.T, s store.Store, key string) { ... },
//	})
//
// The hooks:
//
//   - OpenLease opens a store whose lease (see store.DefaultLease) is the
//     given duration. The Lease* subtests use it, and need Age as well.
//   - Age makes the claim of key in s look d older than it is: as if the
//     last part write to key had happened d earlier. It is called on
//     incomplete and on complete objects; a backend that keeps a claim time
//     subtracts d from it. Lease* subtests are skipped without it, and
//     LeaseDefault also runs Age on a store from Open.
//   - Corrupt makes the stored state of key in s unreadable, the way it could
//     be damaged on that backend (a garbage claim for a file store, a key of
//     the wrong type for Redis). key is a complete object when it is called;
//     s must see the damage at once (drop what it caches of key). The
//     CorruptObject subtest checks that Query reports it in that object's
//     Object.Err only (its text naming the key), that ReadRanges stops at
//     it with a *store.RangeError, and that a write to it fails while the
//     other writes of its batch are done.
//
// A nil hook skips the subtests that need it (with t.Skip, so that go test
// -v shows what did not run).
//
// Every subtest opens its own store and closes it when it ends (open must not
// close it). Every subtest uses keys under a fresh random prefix, so backends
// whose stores share a server or a directory do not collide between subtests
// or between runs.
package storetest

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/runtime/store"
)

// Backend is a backend under test: how to open its stores, and hooks into
// its stored state. Only Open is required; see the package documentation.
type Backend struct {
	Open      func(t *testing.T) store.Store
	OpenLease func(t *testing.T, lease time.Duration) store.Store
	Age       func(t *testing.T, s store.Store, key string, d time.Duration)
	Corrupt   func(t *testing.T, s store.Store, key string)
	// LeaseFromClaim says the backend's lease runs from an object's claim,
	// not from its last part write (its objects are immutable): the
	// LeaseRefreshedByWrites subtest is skipped.
	LeaseFromClaim bool
}

// Run runs the conformance suite against the stores that open returns,
// without the subtests that need Backend hooks.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	RunBackend(t, Backend{Open: open})
}

// RunBackend runs the conformance suite against a backend.
func RunBackend(t *testing.T, b Backend) {
	for _, c := range []struct {
		name string
		fn   func(t *testing.T, s store.Store, k keys)
	}{
		{"PartAloneIsInvisible", testPartAloneIsInvisible},
		{"AllPartsComplete", testAllPartsComplete},
		{"Fragments", testFragments},
		{"BuffersAreCopied", testBuffersAreCopied},
		{"LayoutConflict", testLayoutConflict},
		{"CompleteWins", testCompleteWins},
		{"Retry", testRetry},
		{"BatchInOrder", testBatchInOrder},
		{"InvalidWrite", testInvalidWrite},
		{"Query", testQuery},
		{"Meta", testMeta},
		{"MetaLimit", testMetaLimit},
		{"ReadRanges", testReadRanges},
		{"ReadRangesFailures", testReadRangesFailures},
		{"ReadRangesCancelled", testReadRangesCancelled},
		{"ReadRangesChanged", testReadRangesChanged},
		{"ConcurrentLayouts", testConcurrentLayouts},
		{"EmptyInputs", testEmptyInputs},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := b.Open(t)
			t.Cleanup(func() { require.NoError(t, s.Close()) })
			c.fn(t, s, newKeys())
		})
	}
	t.Run("CorruptObject", func(t *testing.T) {
		if b.Corrupt == nil {
			t.Skip("the backend has no Corrupt hook")
		}
		s := b.Open(t)
		t.Cleanup(func() { require.NoError(t, s.Close()) })
		testCorruptObject(t, s, newKeys(), func(key string) { b.Corrupt(t, s, key) })
	})
	t.Run("LeaseDefault", func(t *testing.T) {
		if b.Age == nil {
			t.Skip("the backend has no Age hook")
		}
		s := b.Open(t)
		t.Cleanup(func() { require.NoError(t, s.Close()) })
		testLeaseDefault(t, s, newKeys(), func(key string, d time.Duration) { b.Age(t, s, key, d) })
	})
	for _, c := range []struct {
		name string
		fn   func(t *testing.T, s store.Store, k keys, age func(key string, d time.Duration))
	}{
		{"LeaseRefuses", testLeaseRefuses},
		{"LeaseTakeover", testLeaseTakeover},
		{"LeaseTakeoverSamePartCount", testLeaseTakeoverSamePartCount},
		{"LeaseSameLayoutContinues", testLeaseSameLayoutContinues},
		{"LeaseRefreshedByWrites", testLeaseRefreshedByWrites},
		{"LeaseNeverTakesComplete", testLeaseNeverTakesComplete},
	} {
		t.Run(c.name, func(t *testing.T) {
			if b.OpenLease == nil || b.Age == nil {
				t.Skip("the backend has no OpenLease or no Age hook")
			}
			if b.LeaseFromClaim && c.name == "LeaseRefreshedByWrites" {
				t.Skip("the backend's lease runs from the claim")
			}
			s := b.OpenLease(t, time.Hour)
			t.Cleanup(func() { require.NoError(t, s.Close()) })
			c.fn(t, s, newKeys(), func(key string, d time.Duration) { b.Age(t, s, key, d) })
		})
	}
}

func newKeys() keys { return keys(fmt.Sprintf("storetest_%016x_", rand.Uint64())) }

// keys is a subtest's random key prefix.
type keys string

func (k keys) key(name string) string      { return string(k) + name }
func (k keys) manifest(name string) string { return "kv/" + string(k) + "/manifests/" + name }

// Pattern returns n bytes that depend only on seed, so that tests can tell
// whose bytes a part holds.
func Pattern(seed string, n int) []byte {
	h := fnv.New64a()
	h.Write([]byte(seed))
	r := rand.New(rand.NewPCG(h.Sum64(), 0x6b76726573686172))
	b := make([]byte, n+7)
	for i := 0; i < n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b[:n:n]
}

// layout is one writer's view of an object: its manifest, part count and
// part sizes. Its bytes are Pattern(manifest/key/part).
type layout struct {
	manifest string
	sizes    []int
}

func (l layout) data(key string, part int) []byte {
	return Pattern(fmt.Sprintf("%s/%s/%d", l.manifest, key, part), l.sizes[part])
}

// write writes part of key.
func (l layout) write(key string, part int) store.PartWrite {
	return store.PartWrite{Key: key, Part: part, Parts: len(l.sizes), Manifest: l.manifest, Data: [][]byte{l.data(key, part)}}
}

// object is what a query of a key written whole in layout l returns.
func (l layout) object(key string) store.Object {
	return store.Object{Complete: true, Manifest: l.manifest, PartSizes: l.sizes}
}

func write(t *testing.T, s store.Store, ws ...store.PartWrite) []error {
	t.Helper()
	errs := s.WriteParts(context.Background(), ws)
	require.Len(t, errs, len(ws))
	return errs
}

// writeAll writes every part of key in layout l, one part per call, and
// requires each write to succeed.
func writeAll(t *testing.T, s store.Store, l layout, key string) {
	t.Helper()
	for p := range l.sizes {
		require.Equal(t, []error{nil}, write(t, s, l.write(key, p)), "write %s part %d", key, p)
	}
}

func query(t *testing.T, s store.Store, ks ...string) []store.Object {
	t.Helper()
	objs, err := s.Query(context.Background(), ks)
	require.NoError(t, err)
	require.Len(t, objs, len(ks))
	return objs
}

// readPart reads a whole part with one range.
func readPart(t *testing.T, s store.Store, key string, part, size int) []byte {
	t.Helper()
	b := make([]byte, size)
	n, err := s.ReadRanges(context.Background(), []store.Range{{Key: key, Part: part, Dst: [][]byte{b}}})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	return b
}

// requireStored requires key to be complete in layout l with l's bytes.
func requireStored(t *testing.T, s store.Store, l layout, key string) {
	t.Helper()
	require.Equal(t, []store.Object{l.object(key)}, query(t, s, key))
	for p, size := range l.sizes {
		require.Equal(t, l.data(key, p), readPart(t, s, key, p, size), "bytes of %s part %d", key, p)
	}
}

// requireNotReadable requires that part of key does not read.
func requireNotReadable(t *testing.T, s store.Store, key string, part, size int) {
	t.Helper()
	n, err := s.ReadRanges(context.Background(), []store.Range{{Key: key, Part: part, Dst: [][]byte{make([]byte, size)}}})
	require.Equal(t, 0, n)
	require.EqualError(t, err, fmt.Sprintf("read %s part %d [0,%d): not found", key, part, size))
	require.ErrorIs(t, err, store.ErrNotFound)
}
