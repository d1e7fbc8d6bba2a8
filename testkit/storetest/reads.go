package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/runtime/store"
)

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
