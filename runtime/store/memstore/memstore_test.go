package memstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/runtime/store"
	"github.com/kvreshard/kvreshard/testkit/storetest"
)

func TestConformance(t *testing.T) {
	storetest.RunBackend(t, storetest.Backend{
		Open:      func(t *testing.T) store.Store { return New() },
		OpenLease: func(t *testing.T, lease time.Duration) store.Store { return NewOptions(Options{Lease: lease}) },
		Age:       func(t *testing.T, s store.Store, key string, d time.Duration) { s.(*Store).age(key, d) },
	})
}

func TestConformanceByURL(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := store.Open(context.Background(), "mem://conformance")
		require.NoError(t, err)
		return s
	})
}

func TestOpen(t *testing.T) {
	ctx := context.Background()
	name := fmt.Sprintf("mem://shared%016x", rand.Uint64()) // fresh under -count
	a, err := store.Open(ctx, name)
	require.NoError(t, err)
	b, err := store.Open(ctx, name)
	require.NoError(t, err)
	require.Same(t, a, b)
	c, err := store.Open(ctx, "mem://")
	require.NoError(t, err)
	d, err := store.Open(ctx, "mem://")
	require.NoError(t, err)
	require.NotSame(t, c, d)
	require.NotSame(t, a, c)

	// Same name, same objects.
	require.Equal(t, []error{nil}, a.WriteParts(ctx, []store.PartWrite{{Key: "k", Part: 0, Parts: 1, Manifest: "m", Data: [][]byte{{1, 2}}}}))
	objs, err := b.Query(ctx, []string{"k"})
	require.NoError(t, err)
	require.Equal(t, []store.Object{{Complete: true, Manifest: "m", PartSizes: []int{2}}}, objs)
	objs, err = c.Query(ctx, []string{"k"})
	require.NoError(t, err)
	require.Equal(t, []store.Object{{}}, objs)

	for _, c := range []struct{ url, reason string }{
		{"mem://a/b", "a mem URL is mem:// or mem://name, with nothing else but ?lease="},
		{"mem:///", "a mem URL is mem:// or mem://name, with nothing else but ?lease="},
		{"mem://a?", "a mem URL is mem:// or mem://name, with nothing else but ?lease="},
		{"mem://a#f", "a mem URL is mem:// or mem://name, with nothing else but ?lease="},
		{"mem://u@a", "a mem URL is mem:// or mem://name, with nothing else but ?lease="},
		{"mem://a:1", "a mem URL is mem:// or mem://name, with nothing else but ?lease="},
		{"mem://a?x=1", `unknown parameter "x"; a mem URL takes only lease`},
		{"mem://?lease=1s&ttl=1s", `unknown parameter "ttl"; a mem URL takes only lease`},
		{"mem://?lease=1s&lease=2s", "lease is given more than once"},
		{"mem://?lease=", `lease "" is not a positive duration such as 30s or 10m`},
		{"mem://?lease=0s", `lease "0s" is not a positive duration such as 30s or 10m`},
		{"mem://?lease=-1m", `lease "-1m" is not a positive duration such as 30s or 10m`},
		{"mem://?lease=30", `lease "30" is not a positive duration such as 30s or 10m`},
		{"mem://?lease=%zz", `cannot parse the query: invalid URL escape "%zz"`},
	} {
		_, err := store.Open(ctx, c.url)
		require.EqualError(t, err, `store URL "`+c.url+`": `+c.reason, c.url)
		var ue *store.URLError
		require.ErrorAs(t, err, &ue)
	}
}

func TestOpenLease(t *testing.T) {
	ctx := context.Background()
	s, err := store.Open(ctx, "mem://?lease=90s")
	require.NoError(t, err)
	require.Equal(t, 90*time.Second, s.(*Store).lease)
	s, err = store.Open(ctx, "mem://")
	require.NoError(t, err)
	require.Equal(t, store.DefaultLease, s.(*Store).lease)

	name := fmt.Sprintf("mem://lease%016x", rand.Uint64())
	a, err := store.Open(ctx, name+"?lease=1m")
	require.NoError(t, err)
	require.Equal(t, time.Minute, a.(*Store).lease)
	b, err := store.Open(ctx, name)
	require.NoError(t, err)
	require.Same(t, a, b)
	b, err = store.Open(ctx, name+"?lease=60s")
	require.NoError(t, err)
	require.Same(t, a, b)
	_, err = store.Open(ctx, name+"?lease=2m")
	require.EqualError(t, err, `store URL "`+name+`?lease=2m": store "`+name[len("mem://"):]+`" is open with lease 1m0s`)
}

// TestLeaseClock drives the lease with a clock the test sets.
func TestLeaseClock(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1e9, 0)
	s := NewOptions(Options{Lease: 30 * time.Second, now: func() time.Time { return now }})
	a := func(part int) store.PartWrite {
		return store.PartWrite{Key: "k", Part: part, Parts: 2, Manifest: "a", Data: [][]byte{{byte(part)}}}
	}
	b := store.PartWrite{Key: "k", Part: 0, Parts: 1, Manifest: "b", Data: [][]byte{{9, 9}}}
	require.Equal(t, []error{nil}, s.WriteParts(ctx, []store.PartWrite{a(0)}))
	now = now.Add(30 * time.Second)
	require.Equal(t, []error{store.ErrLayoutConflict}, s.WriteParts(ctx, []store.PartWrite{b}), "at the lease, not past it")
	now = now.Add(time.Nanosecond)
	require.Equal(t, []error{nil, store.ErrComplete}, s.WriteParts(ctx, []store.PartWrite{b, a(1)}))
	objs, err := s.Query(ctx, []string{"k"})
	require.NoError(t, err)
	require.Equal(t, []store.Object{{Complete: true, Manifest: "b", PartSizes: []int{2}}}, objs)
}

func TestInvalidWrite(t *testing.T) {
	s := New()
	errs := s.WriteParts(context.Background(), []store.PartWrite{
		{Key: "k", Part: 0, Parts: 0, Manifest: "m"},
		{Key: "k", Part: 2, Parts: 2, Manifest: "m"},
		{Key: "k", Part: -1, Parts: 2, Manifest: "m"},
		{Key: "k", Part: 0, Parts: 2},
	})
	require.Len(t, errs, 4)
	require.EqualError(t, errs[0], "write k part 0: part count 0 is not positive")
	require.EqualError(t, errs[1], "write k part 2: part out of range [0,2)")
	require.EqualError(t, errs[2], "write k part -1: part out of range [0,2)")
	require.EqualError(t, errs[3], "write k part 0: empty manifest key")
}

func TestWritePartsCancelled(t *testing.T) {
	s := New()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	errs := s.WriteParts(ctx, []store.PartWrite{{Key: "k", Part: 0, Parts: 1, Manifest: "m", Data: [][]byte{{1}}}})
	require.Equal(t, []error{context.Canceled}, errs)
	objs, err := s.Query(context.Background(), []string{"k"})
	require.NoError(t, err)
	require.Equal(t, []store.Object{{}}, objs)
}

func TestReadRangesAllocs(t *testing.T) {
	s := New()
	ctx := context.Background()
	require.Equal(t, []error{nil}, s.WriteParts(ctx, []store.PartWrite{{Key: "k", Part: 0, Parts: 1, Manifest: "m", Data: [][]byte{make([]byte, 4096)}}}))
	rs := make([]store.Range, 16)
	for i := range rs {
		rs[i] = store.Range{Key: "k", Part: 0, Off: i * 256, Dst: [][]byte{make([]byte, 256)}}
	}
	allocs := testing.AllocsPerRun(100, func() {
		n, err := s.ReadRanges(ctx, rs)
		if n != len(rs) || err != nil {
			t.Fatal(n, err)
		}
	})
	require.Equal(t, 0.0, allocs)
}

func BenchmarkReadRanges(b *testing.B) {
	storetest.BenchReadRanges(b, New())
}

func TestViewPart(t *testing.T) {
	s := New()
	ctx := context.Background()
	var v store.Viewer = s
	require.Equal(t, []error{nil, nil}, s.WriteParts(ctx, []store.PartWrite{
		{Key: "k", Part: 1, Parts: 2, Manifest: "m", Data: [][]byte{{1, 2}, {3}}},
		{Key: "half", Part: 0, Parts: 2, Manifest: "m", Data: [][]byte{{9}}},
	}))
	_, err := v.ViewPart(ctx, "k", 1, "m")
	require.EqualError(t, err, "read k part 1 [0,0): not found", "incomplete objects are not lent")
	require.Equal(t, []error{nil}, s.WriteParts(ctx, []store.PartWrite{{Key: "k", Part: 0, Parts: 2, Manifest: "m", Data: [][]byte{{4, 5, 6, 7}}}}))

	b, err := v.ViewPart(ctx, "k", 1, "m")
	require.NoError(t, err)
	require.Equal(t, []byte{1, 2, 3}, b)
	b, err = v.ViewPart(ctx, "k", 0, "")
	require.NoError(t, err)
	require.Equal(t, []byte{4, 5, 6, 7}, b)
	// The view is the stored bytes: a range read sees what it sees.
	got := make([]byte, 4)
	n, err := s.ReadRanges(ctx, []store.Range{{Key: "k", Part: 0, Dst: [][]byte{got}}})
	require.Equal(t, 1, n)
	require.NoError(t, err)
	require.Equal(t, b, got)

	for _, c := range []struct {
		key, manifest string
		part          int
		want          string
		is            error
	}{
		{"k", "other", 0, "read k part 0 [0,4): object changed since it was queried", store.ErrChanged},
		{"k", "m", 2, "read k part 2 [0,0): not found", store.ErrNotFound},
		{"k", "m", -1, "read k part -1 [0,0): not found", store.ErrNotFound},
		{"nope", "m", 0, "read nope part 0 [0,0): not found", store.ErrNotFound},
		{"half", "m", 0, "read half part 0 [0,0): not found", store.ErrNotFound},
	} {
		b, err := v.ViewPart(ctx, c.key, c.part, c.manifest)
		require.Nil(t, b)
		require.EqualError(t, err, c.want)
		require.ErrorIs(t, err, c.is)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = v.ViewPart(cctx, "k", 0, "m")
	require.ErrorIs(t, err, context.Canceled)
}
