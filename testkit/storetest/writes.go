package storetest

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/runtime/store"
)

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
