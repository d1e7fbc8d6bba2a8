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
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"sync"
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

var incomplete = store.Object{}

func testPartAloneIsInvisible(t *testing.T, s store.Store, k keys) {
	a := layout{k.manifest("a"), []int{100, 200}}
	key := k.key("page")
	require.Equal(t, []error{nil}, write(t, s, a.write(key, 1)))
	require.Equal(t, []store.Object{incomplete}, query(t, s, key))
	requireNotReadable(t, s, key, 1, 200)
	requireNotReadable(t, s, key, 0, 100)
}

func testAllPartsComplete(t *testing.T, s store.Store, k keys) {
	a := layout{k.manifest("a"), []int{1, 4096, 1<<20 + 3}}
	key := k.key("page")
	for i, p := range []int{2, 0, 1} {
		require.Equal(t, []error{nil}, write(t, s, a.write(key, p)))
		if i < 2 {
			require.Equal(t, []store.Object{incomplete}, query(t, s, key))
		}
	}
	requireStored(t, s, a, key)

	// All parts in one batch.
	key2 := k.key("page2")
	require.Equal(t, []error{nil, nil, nil}, write(t, s, a.write(key2, 0), a.write(key2, 1), a.write(key2, 2)))
	requireStored(t, s, a, key2)
}

func testFragments(t *testing.T, s store.Store, k keys) {
	key := k.key("page")
	whole := Pattern("fragments", 1000)
	w := store.PartWrite{Key: key, Part: 0, Parts: 1, Manifest: k.manifest("a"),
		Data: [][]byte{whole[:1], nil, whole[1:300], {}, whole[300:999], whole[999:]}}
	require.Equal(t, 1000, w.Size())
	require.Equal(t, []error{nil}, write(t, s, w))
	require.Equal(t, []store.Object{{Complete: true, Manifest: k.manifest("a"), PartSizes: []int{1000}}}, query(t, s, key))
	require.Equal(t, whole, readPart(t, s, key, 0, 1000))
}

func testBuffersAreCopied(t *testing.T, s store.Store, k keys) {
	key := k.key("page")
	src := Pattern("copied", 64)
	want := append([]byte(nil), src...)
	require.Equal(t, []error{nil}, write(t, s, store.PartWrite{Key: key, Part: 0, Parts: 1, Manifest: k.manifest("a"), Data: [][]byte{src}}))
	clear(src) // the caller reuses its buffer
	got := readPart(t, s, key, 0, 64)
	require.Equal(t, want, got)
	clear(got)
	require.Equal(t, want, readPart(t, s, key, 0, 64))

	val := []byte("manifest bytes")
	require.NoError(t, s.PutMeta(context.Background(), k.manifest("m"), val))
	clear(val)
	meta, err := s.GetMeta(context.Background(), k.manifest("m"))
	require.NoError(t, err)
	require.Equal(t, []byte("manifest bytes"), meta)
	clear(meta)
	meta, err = s.GetMeta(context.Background(), k.manifest("m"))
	require.NoError(t, err)
	require.Equal(t, []byte("manifest bytes"), meta)
}

func testLayoutConflict(t *testing.T, s store.Store, k keys) {
	a := layout{k.manifest("a"), []int{100, 200}}
	b := layout{k.manifest("b"), []int{150, 150}}     // other manifest, same part count
	a3 := layout{k.manifest("a"), []int{100, 50, 50}} // same manifest, other part count
	key := k.key("page")
	require.Equal(t, []error{nil}, write(t, s, a.write(key, 0)))
	require.Equal(t, []error{store.ErrLayoutConflict, store.ErrLayoutConflict, store.ErrLayoutConflict},
		write(t, s, b.write(key, 1), b.write(key, 0), a3.write(key, 1)))
	require.Equal(t, []store.Object{incomplete}, query(t, s, key))
	requireNotReadable(t, s, key, 1, 150)
	// The refused writes wrote nothing: a's writer completes the object with
	// its own bytes.
	require.Equal(t, []error{nil}, write(t, s, a.write(key, 1)))
	requireStored(t, s, a, key)
}

func testCompleteWins(t *testing.T, s store.Store, k keys) {
	a := layout{k.manifest("a"), []int{100, 200}}
	b := layout{k.manifest("b"), []int{300}}
	a3 := layout{k.manifest("a"), []int{100, 50, 50}}
	key := k.key("page")
	writeAll(t, s, a, key)
	other := a.write(key, 1)
	other.Data = [][]byte{Pattern("other", 200)}
	require.Equal(t, []error{store.ErrComplete, store.ErrComplete, store.ErrComplete, store.ErrComplete, store.ErrComplete},
		write(t, s, a.write(key, 0), other, b.write(key, 0), a3.write(key, 2), a3.write(key, 0)))
	requireStored(t, s, a, key)
}

func testRetry(t *testing.T, s store.Store, k keys) {
	a := layout{k.manifest("a"), []int{100, 200, 300}}
	key := k.key("page")
	require.Equal(t, []error{nil}, write(t, s, a.write(key, 0)))
	require.Equal(t, []error{nil}, write(t, s, a.write(key, 0)))
	require.Equal(t, []error{nil, nil}, write(t, s, a.write(key, 1), a.write(key, 1)))
	require.Equal(t, []store.Object{incomplete}, query(t, s, key))
	require.Equal(t, []error{nil}, write(t, s, a.write(key, 2)))
	requireStored(t, s, a, key)
}

func testBatchInOrder(t *testing.T, s store.Store, k keys) {
	a := layout{k.manifest("a"), []int{10, 20}}
	b := layout{k.manifest("b"), []int{30, 40}}
	k1, k2 := k.key("p1"), k.key("p2")
	require.Equal(t,
		[]error{nil, store.ErrLayoutConflict, nil, nil, store.ErrComplete, store.ErrComplete, nil},
		write(t, s, a.write(k1, 0), b.write(k1, 0), b.write(k2, 1), a.write(k1, 1), b.write(k1, 1), a.write(k1, 0), b.write(k2, 0)))
	requireStored(t, s, a, k1)
	requireStored(t, s, b, k2)
}

func testInvalidWrite(t *testing.T, s store.Store, k keys) {
	key := k.key("page")
	m := k.manifest("a")
	for _, c := range []struct {
		w    store.PartWrite
		want string
	}{
		{store.PartWrite{Key: key, Part: 0, Parts: 0, Manifest: m, Data: [][]byte{{1}}}, "write " + key + " part 0: part count 0 is not positive"},
		{store.PartWrite{Key: key, Part: 0, Parts: store.MaxParts + 1, Manifest: m, Data: [][]byte{{1}}}, "write " + key + " part 0: part count 65537 is more than 65536"},
		{store.PartWrite{Key: key, Part: 0, Parts: math.MaxInt, Manifest: m, Data: [][]byte{{1}}}, fmt.Sprintf("write %s part 0: part count %d is more than 65536", key, math.MaxInt)},
		{store.PartWrite{Key: key, Part: -1, Parts: 2, Manifest: m, Data: [][]byte{{1}}}, "write " + key + " part -1: part out of range [0,2)"},
		{store.PartWrite{Key: key, Part: 2, Parts: 2, Manifest: m, Data: [][]byte{{1}}}, "write " + key + " part 2: part out of range [0,2)"},
		{store.PartWrite{Key: key, Part: 0, Parts: 2, Manifest: "", Data: [][]byte{{1}}}, "write " + key + " part 0: empty manifest key"},
		{store.PartWrite{Key: "", Part: 0, Parts: 2, Manifest: m, Data: [][]byte{{1}}}, `write "" part 0: empty key`},
	} {
		errs := write(t, s, c.w)
		require.EqualError(t, errs[0], c.want, "%+v", c.w)
		for _, sentinel := range []error{store.ErrComplete, store.ErrLayoutConflict} {
			require.NotErrorIs(t, errs[0], sentinel)
		}
	}
	// Nothing was written or claimed: another layout still gets the key.
	b := layout{k.manifest("b"), []int{5}}
	writeAll(t, s, b, key)
	requireStored(t, s, b, key)
}

func testQuery(t *testing.T, s store.Store, k keys) {
	a := layout{k.manifest("a"), []int{10, 20}}
	b := layout{k.manifest("b"), []int{7, 8, 9}}
	var ks []string
	var want []store.Object
	for i := range 60 {
		key := k.key(fmt.Sprintf("page%d", i))
		ks = append(ks, key)
		switch i % 4 {
		case 0: // missing
			want = append(want, incomplete)
		case 1: // incomplete
			require.Equal(t, []error{nil}, write(t, s, b.write(key, 1)))
			want = append(want, incomplete)
		case 2:
			writeAll(t, s, a, key)
			want = append(want, a.object(key))
		case 3:
			writeAll(t, s, b, key)
			want = append(want, b.object(key))
		}
	}
	// A key may appear more than once.
	ks = append(ks, ks[2], ks[0])
	want = append(want, want[2], want[0])
	require.Equal(t, want, query(t, s, ks...))
}

func testMeta(t *testing.T, s store.Store, k keys) {
	ctx := context.Background()
	key := k.manifest("0123abcd")
	_, err := s.GetMeta(ctx, key)
	require.Equal(t, store.ErrNotFound, err)
	val := []byte(`{"descriptor":{},"parts":[]}`)
	require.NoError(t, s.PutMeta(ctx, key, val))
	require.NoError(t, s.PutMeta(ctx, key, append([]byte(nil), val...)))
	require.Equal(t, store.ErrMetaConflict, s.PutMeta(ctx, key, []byte(`{"other":1}`)))
	require.Equal(t, store.ErrMetaConflict, s.PutMeta(ctx, key, val[:len(val)-1]))
	require.Equal(t, store.ErrMetaConflict, s.PutMeta(ctx, key, nil))
	got, err := s.GetMeta(ctx, key)
	require.NoError(t, err)
	require.Equal(t, val, got)

	// An empty metadata object is still an object.
	empty := k.manifest("empty")
	require.NoError(t, s.PutMeta(ctx, empty, nil))
	require.NoError(t, s.PutMeta(ctx, empty, []byte{}))
	require.Equal(t, store.ErrMetaConflict, s.PutMeta(ctx, empty, []byte{0}))
	got, err = s.GetMeta(ctx, empty)
	require.NoError(t, err)
	require.Empty(t, got)

	big := Pattern("big meta", 1<<16+1)
	require.NoError(t, s.PutMeta(ctx, k.manifest("big"), big))
	got, err = s.GetMeta(ctx, k.manifest("big"))
	require.NoError(t, err)
	require.Equal(t, big, got)
}

func testReadRanges(t *testing.T, s store.Store, k keys) {
	ctx := context.Background()
	a := layout{k.manifest("a"), []int{1000, 3000}}
	b := layout{k.manifest("b"), []int{500, 600, 700}}
	ka, kb := k.key("pa"), k.key("pb")
	writeAll(t, s, a, ka)
	writeAll(t, s, b, kb)

	// One range into three segments (and an empty one).
	s1, s2, s3 := make([]byte, 10), make([]byte, 0), make([]byte, 90)
	s4 := make([]byte, 900)
	n, err := s.ReadRanges(ctx, []store.Range{{Key: ka, Part: 1, Off: 2000, Dst: [][]byte{s1, s2, s3, s4}}})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	want := a.data(ka, 1)[2000:3000]
	require.Equal(t, want[:10], s1)
	require.Equal(t, want[10:100], s3)
	require.Equal(t, want[100:], s4)

	// Many ranges across objects and parts, in any order, including empty
	// ranges and a range that ends exactly at the end of its part.
	type rd struct {
		l        layout
		key      string
		part     int
		off, len int
	}
	rds := []rd{
		{b, kb, 2, 0, 700}, {a, ka, 0, 17, 256}, {b, kb, 0, 499, 1}, {a, ka, 1, 0, 1},
		{a, ka, 1, 2744, 256}, {b, kb, 1, 600, 0}, {b, kb, 1, 0, 0}, {a, ka, 0, 0, 1000},
	}
	for i := range 64 {
		rds = append(rds, rd{b, kb, i % 3, i * 7 % 400, 64})
	}
	rs := make([]store.Range, len(rds))
	for i, r := range rds {
		rs[i] = store.Range{Key: r.key, Part: r.part, Off: r.off, Dst: [][]byte{make([]byte, r.len)}}
	}
	n, err = s.ReadRanges(ctx, rs)
	require.NoError(t, err)
	require.Equal(t, len(rs), n)
	for i, r := range rds {
		require.Equal(t, r.l.data(r.key, r.part)[r.off:r.off+r.len], rs[i].Dst[0], "range %d", i)
	}
}

func testReadRangesFailures(t *testing.T, s store.Store, k keys) {
	ctx := context.Background()
	a := layout{k.manifest("a"), []int{128, 128}}
	kx, kinc := k.key("x"), k.key("incomplete")
	writeAll(t, s, a, kx)
	require.Equal(t, []error{nil}, write(t, s, a.write(kinc, 0)))

	for _, c := range []struct {
		name     string
		key      string
		part     int
		off, len int
		err      string
		notFound bool
	}{
		{"missing object", k.key("missing"), 0, 0, 64, "not found", true},
		{"incomplete object", kinc, 0, 0, 64, "not found", true},
		{"part past the last", kx, 2, 0, 64, "not found", true},
		{"negative part", kx, -1, 0, 64, "not found", true},
		{"past the end", kx, 1, 100, 64, "past the end of the part (128 bytes)", false},
		{"offset past the end", kx, 0, 129, 0, "past the end of the part (128 bytes)", false},
		{"negative offset", kx, 0, -1, 64, "negative offset", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			good0, good1, bad, after := make([]byte, 28), make([]byte, 128), make([]byte, c.len), make([]byte, 8)
			rs := []store.Range{
				{Key: kx, Part: 0, Off: 100, Dst: [][]byte{good0}},
				{Key: kx, Part: 1, Off: 0, Dst: [][]byte{good1[:64], good1[64:]}},
				{Key: c.key, Part: c.part, Off: c.off, Dst: [][]byte{bad}},
				{Key: kx, Part: 0, Off: 0, Dst: [][]byte{after}},
			}
			n, err := s.ReadRanges(ctx, rs)
			require.Equal(t, 2, n)
			require.EqualError(t, err, fmt.Sprintf("read %s part %d [%d,%d): %s", c.key, c.part, c.off, c.off+c.len, c.err))
			var re *store.RangeError
			require.ErrorAs(t, err, &re)
			require.Equal(t, store.RangeError{Key: c.key, Part: c.part, Off: c.off, Len: c.len, Err: re.Err}, *re)
			require.Equal(t, c.notFound, errors.Is(err, store.ErrNotFound))
			require.Equal(t, a.data(kx, 0)[100:], good0)
			require.Equal(t, a.data(kx, 1), good1)
			require.Equal(t, make([]byte, 8), after, "a range after the failed one was read")
		})
	}

	// The end of a part is a valid offset for an empty range.
	n, err := s.ReadRanges(ctx, []store.Range{{Key: kx, Part: 1, Off: 128}})
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

// testReadRangesChanged: a range that names the manifest its object was
// queried with reads only while the object is stored under it.
func testReadRangesChanged(t *testing.T, s store.Store, k keys) {
	ctx := context.Background()
	a := layout{k.manifest("a"), []int{64}}
	key := k.key("page")
	writeAll(t, s, a, key)
	got := make([]byte, 64)
	n, err := s.ReadRanges(ctx, []store.Range{{Key: key, Part: 0, Off: 0, Dst: [][]byte{got}, Manifest: a.manifest}})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, a.data(key, 0), got)

	other := make([]byte, 64)
	n, err = s.ReadRanges(ctx, []store.Range{
		{Key: key, Part: 0, Off: 0, Dst: [][]byte{got}, Manifest: a.manifest},
		{Key: key, Part: 0, Off: 0, Dst: [][]byte{other}, Manifest: k.manifest("b")},
	})
	require.Equal(t, 1, n)
	require.EqualError(t, err, fmt.Sprintf("read %s part 0 [0,64): object changed since it was queried", key))
	require.ErrorIs(t, err, store.ErrChanged)
	require.Equal(t, make([]byte, 64), other, "a changed object's bytes were delivered")
}

func testReadRangesCancelled(t *testing.T, s store.Store, k keys) {
	a := layout{k.manifest("a"), []int{256}}
	key := k.key("page")
	writeAll(t, s, a, key)
	rs := make([]store.Range, 100)
	for i := range rs {
		rs[i] = store.Range{Key: key, Part: 0, Off: i, Dst: [][]byte{make([]byte, 16)}}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	n, err := s.ReadRanges(ctx, rs)
	require.Less(t, n, len(rs))
	require.Equal(t, context.Canceled, err)
	for i := range n {
		require.Equal(t, a.data(key, 0)[i:i+16], rs[i].Dst[0])
	}
}

// testConcurrentLayouts races writers of two layouts on the same keys.
func testConcurrentLayouts(t *testing.T, s store.Store, k keys) {
	a := layout{k.manifest("a"), []int{1000, 2000}}
	b := layout{k.manifest("b"), []int{700, 800, 900}}
	ks := make([]string, 24)
	for i := range ks {
		ks[i] = k.key(fmt.Sprintf("page%d", i))
	}
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	for g := range 8 {
		l := a
		if g%2 == 1 {
			l = b
		}
		wg.Go(func() {
			errc <- RaceWrite(s, l.manifest, l.sizes, ks, uint64(g))
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		require.NoError(t, err)
	}
	CheckRaced(t, s, ks, map[string][]int{a.manifest: a.sizes, b.manifest: b.sizes})
}

// RaceWrite writes every part of every key in one layout, in an order drawn
// from seed, one part per call, with Pattern(manifest/key/part) bytes. A
// write may succeed or give ErrComplete or ErrLayoutConflict; any other
// error is returned. Multi-process tests run it in several processes.
func RaceWrite(s store.Store, manifest string, sizes []int, ks []string, seed uint64) error {
	l := layout{manifest, sizes}
	type kp struct {
		key  string
		part int
	}
	var todo []kp
	for _, key := range ks {
		for p := range sizes {
			todo = append(todo, kp{key, p})
		}
	}
	r := rand.New(rand.NewPCG(seed, 1))
	r.Shuffle(len(todo), func(i, j int) { todo[i], todo[j] = todo[j], todo[i] })
	for _, w := range todo {
		err := s.WriteParts(context.Background(), []store.PartWrite{l.write(w.key, w.part)})[0]
		if err != nil && err != store.ErrComplete && err != store.ErrLayoutConflict {
			return fmt.Errorf("write %s part %d: %w", w.key, w.part, err)
		}
	}
	return nil
}

// CheckRaced checks that every key that RaceWrite wrote with the given
// layouts is complete in exactly one of them, with that layout's bytes.
func CheckRaced(t *testing.T, s store.Store, ks []string, layouts map[string][]int) {
	t.Helper()
	objs := query(t, s, ks...)
	for i, key := range ks {
		sizes, ok := layouts[objs[i].Manifest]
		require.True(t, ok, "%s: %+v", key, objs[i])
		requireStored(t, s, layout{objs[i].Manifest, sizes}, key)
	}
}

func testEmptyInputs(t *testing.T, s store.Store, k keys) {
	ctx := context.Background()
	require.Empty(t, s.WriteParts(ctx, nil))
	objs, err := s.Query(ctx, nil)
	require.NoError(t, err)
	require.Empty(t, objs)
	n, err := s.ReadRanges(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, 0, n)
	n, err = s.ReadRanges(ctx, []store.Range{})
	require.NoError(t, err)
	require.Equal(t, 0, n)
}

// testMetaLimit: PutMeta refuses what no reader accepts, and stores nothing.
func testMetaLimit(t *testing.T, s store.Store, k keys) {
	ctx := context.Background()
	key := k.manifest("limit")
	max := Pattern("max meta", store.MaxMetaBytes)
	require.NoError(t, s.PutMeta(ctx, key, max))
	got, err := s.GetMeta(ctx, key)
	require.NoError(t, err)
	require.Equal(t, max, got)

	over := k.manifest("over")
	err = s.PutMeta(ctx, over, Pattern("over meta", store.MaxMetaBytes+1))
	require.EqualError(t, err, fmt.Sprintf("metadata %s is 1048577 bytes; the limit is 1048576", over))
	_, err = s.GetMeta(ctx, over)
	require.Equal(t, store.ErrNotFound, err)
}

// testCorruptObject: one object whose stored state is unreadable is
// reported in its own Object.Err; the others of the batch are answered,
// read and written as usual.
func testCorruptObject(t *testing.T, s store.Store, k keys, corrupt func(key string)) {
	ctx := context.Background()
	a := layout{k.manifest("a"), []int{100, 200}}
	k1, bad, k3, missing := k.key("p1"), k.key("bad"), k.key("p3"), k.key("missing")
	for _, key := range []string{k1, bad, k3} {
		writeAll(t, s, a, key)
	}
	corrupt(bad)

	objs := query(t, s, k1, bad, k3, missing, bad)
	require.Equal(t, a.object(k1), objs[0])
	require.Equal(t, a.object(k3), objs[2])
	require.Equal(t, incomplete, objs[3])
	for _, o := range []store.Object{objs[1], objs[4]} {
		require.Error(t, o.Err)
		require.Contains(t, o.Err.Error(), bad, "the error names the key")
		require.Equal(t, store.Object{Err: o.Err}, o, "an unreadable object is not complete")
	}
	objs = query(t, s, bad)
	require.Error(t, objs[0].Err)

	// Ranges before the corrupt object are read; the read stops at it.
	got1 := make([]byte, 100)
	rs := []store.Range{
		{Key: k1, Part: 0, Dst: [][]byte{got1}},
		{Key: bad, Part: 0, Dst: [][]byte{make([]byte, 100)}},
		{Key: k3, Part: 0, Dst: [][]byte{make([]byte, 100)}},
	}
	n, err := s.ReadRanges(ctx, rs)
	require.Equal(t, 1, n)
	var re *store.RangeError
	require.ErrorAs(t, err, &re)
	require.Equal(t, bad, re.Key)
	require.Equal(t, a.data(k1, 0), got1)
	requireStored(t, s, a, k3)

	// A write to the corrupt object fails; the next write of the batch is
	// done.
	k4 := k.key("p4")
	errs := write(t, s, a.write(bad, 0), a.write(k4, 0), a.write(k4, 1))
	require.Error(t, errs[0])
	require.Equal(t, []error{nil, nil}, errs[1:])
	requireStored(t, s, a, k4)
}

// testLeaseDefault: a store opened with no lease uses store.DefaultLease.
func testLeaseDefault(t *testing.T, s store.Store, k keys, age func(key string, d time.Duration)) {
	a := layout{k.manifest("a"), []int{10, 20}}
	b := layout{k.manifest("b"), []int{30}}
	key := k.key("page")
	require.Equal(t, []error{nil}, write(t, s, a.write(key, 0)))
	age(key, store.DefaultLease-time.Minute)
	require.Equal(t, []error{store.ErrLayoutConflict}, write(t, s, b.write(key, 0)))
	age(key, 2*time.Minute)
	require.Equal(t, []error{nil}, write(t, s, b.write(key, 0)))
	requireStored(t, s, b, key)
}

// testLeaseRefuses: an incomplete object younger than the lease is not
// taken over.
func testLeaseRefuses(t *testing.T, s store.Store, k keys, age func(key string, d time.Duration)) {
	a := layout{k.manifest("a"), []int{10, 20}}
	b := layout{k.manifest("b"), []int{30, 40}}
	key := k.key("page")
	require.Equal(t, []error{nil}, write(t, s, a.write(key, 0)))
	require.Equal(t, []error{store.ErrLayoutConflict}, write(t, s, b.write(key, 0)))
	age(key, 59*time.Minute)
	require.Equal(t, []error{store.ErrLayoutConflict, store.ErrLayoutConflict}, write(t, s, b.write(key, 1), b.write(key, 0)))
	// The refused writes left nothing: a completes the object.
	require.Equal(t, []error{nil}, write(t, s, a.write(key, 1)))
	requireStored(t, s, a, key)
}

// testLeaseTakeover: an incomplete object older than the lease is taken
// over by a writer of another layout, as if it were new: the old layout's
// writer is refused from then on.
func testLeaseTakeover(t *testing.T, s store.Store, k keys, age func(key string, d time.Duration)) {
	a := layout{k.manifest("a"), []int{100, 200}}
	b := layout{k.manifest("b"), []int{50, 60, 70}}
	key := k.key("page")
	require.Equal(t, []error{nil}, write(t, s, a.write(key, 0)))
	age(key, 61*time.Minute)
	require.Equal(t, []error{nil}, write(t, s, b.write(key, 1)))
	require.Equal(t, []store.Object{incomplete}, query(t, s, key))
	// The new claim is fresh: a's writer does not take it back.
	require.Equal(t, []error{store.ErrLayoutConflict, store.ErrLayoutConflict}, write(t, s, a.write(key, 1), a.write(key, 0)))
	require.Equal(t, []store.Object{incomplete}, query(t, s, key))
	requireNotReadable(t, s, key, 0, 100)
	require.Equal(t, []error{nil, nil}, write(t, s, b.write(key, 0), b.write(key, 2)))
	requireStored(t, s, b, key)
}

// testLeaseTakeoverSamePartCount: the parts written under the old claim are
// dropped, even when the new layout has as many parts of the same sizes.
func testLeaseTakeoverSamePartCount(t *testing.T, s store.Store, k keys, age func(key string, d time.Duration)) {
	a := layout{k.manifest("a"), []int{64, 64}}
	b := layout{k.manifest("b"), []int{64, 64}}
	key := k.key("page")
	require.Equal(t, []error{nil}, write(t, s, a.write(key, 0)))
	age(key, 2*time.Hour)
	require.Equal(t, []error{nil}, write(t, s, b.write(key, 1)))
	require.Equal(t, []store.Object{incomplete}, query(t, s, key), "a's part 0 completed b's object")
	requireNotReadable(t, s, key, 0, 64)
	require.Equal(t, []error{nil}, write(t, s, b.write(key, 0)))
	requireStored(t, s, b, key)
}

// testLeaseSameLayoutContinues: an old claim is no obstacle to its own
// layout; the parts written under it are kept.
func testLeaseSameLayoutContinues(t *testing.T, s store.Store, k keys, age func(key string, d time.Duration)) {
	a := layout{k.manifest("a"), []int{10, 20}}
	key := k.key("page")
	require.Equal(t, []error{nil}, write(t, s, a.write(key, 0)))
	age(key, 3*time.Hour)
	require.Equal(t, []error{nil}, write(t, s, a.write(key, 1)))
	requireStored(t, s, a, key)
}

// testLeaseRefreshedByWrites: every part write restarts the lease.
func testLeaseRefreshedByWrites(t *testing.T, s store.Store, k keys, age func(key string, d time.Duration)) {
	a := layout{k.manifest("a"), []int{10, 20, 30}}
	b := layout{k.manifest("b"), []int{40}}
	key := k.key("page")
	require.Equal(t, []error{nil}, write(t, s, a.write(key, 0)))
	age(key, 50*time.Minute)
	require.Equal(t, []error{nil}, write(t, s, a.write(key, 1)))
	age(key, 50*time.Minute)
	// 100 minutes since the claim, 50 since the last write.
	require.Equal(t, []error{store.ErrLayoutConflict}, write(t, s, b.write(key, 0)))
	// A retry of a written part is a write too.
	require.Equal(t, []error{nil}, write(t, s, a.write(key, 0)))
	age(key, 50*time.Minute)
	require.Equal(t, []error{store.ErrLayoutConflict}, write(t, s, b.write(key, 0)))
	age(key, 11*time.Minute)
	require.Equal(t, []error{nil}, write(t, s, b.write(key, 0)))
	requireStored(t, s, b, key)
}

// testLeaseNeverTakesComplete: a complete object is never taken over.
func testLeaseNeverTakesComplete(t *testing.T, s store.Store, k keys, age func(key string, d time.Duration)) {
	a := layout{k.manifest("a"), []int{10, 20}}
	b := layout{k.manifest("b"), []int{30}}
	key := k.key("page")
	writeAll(t, s, a, key)
	age(key, 100*time.Hour)
	require.Equal(t, []error{store.ErrComplete, store.ErrComplete}, write(t, s, b.write(key, 0), a.write(key, 0)))
	requireStored(t, s, a, key)
}
