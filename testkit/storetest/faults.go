package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/runtime/store"
)

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
