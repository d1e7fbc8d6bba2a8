package redisstore

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/runtime/store"
	"github.com/kvreshard/kvreshard/runtime/store/redisstore/redistest"
	"github.com/kvreshard/kvreshard/runtime/store/storetest"
)

// BenchmarkReadRanges runs the suite's benchmark (storetest.BenchReadRanges),
// then reads 1000 ranges of 256 bytes: pipelined GETRANGE
// through ReadRanges, against one GET of the whole part that holds them
// and local copies. "dense" ranges tile a 256000-byte part; "sparse" ones
// take every fourth 256-byte block of a part four times as long, so GET
// moves four times the bytes.
func BenchmarkReadRanges(b *testing.B) {
	srv := redistest.StartServer(b)
	c, err := ParseURL(srv.URL())
	require.NoError(b, err)
	s, err := New(context.Background(), c)
	require.NoError(b, err)
	defer s.Close()
	ctx := context.Background()
	b.Run("suite", func(b *testing.B) { storetest.BenchReadRanges(b, s) })
	const nr, size = 1000, 256
	for _, bc := range []struct {
		name   string
		stride int
	}{{"dense", size}, {"sparse", 4 * size}} {
		key := "bench_" + bc.name
		part := pattern(3, nr*bc.stride)
		require.Equal(b, []error{nil}, s.WriteParts(ctx, []store.PartWrite{{Key: key, Part: 0, Parts: 1, Manifest: "m", Data: [][]byte{part}}}))
		dst := make([]byte, nr*size)
		rs := make([]store.Range, nr)
		for i := range rs {
			rs[i] = store.Range{Key: key, Part: 0, Off: i * bc.stride, Dst: [][]byte{dst[i*size : (i+1)*size]}}
		}
		b.Run(bc.name+"/getrange", func(b *testing.B) {
			b.SetBytes(nr * size)
			for b.Loop() {
				n, err := s.ReadRanges(ctx, rs)
				if err != nil || n != nr {
					b.Fatal(n, err)
				}
			}
		})
		b.Run(bc.name+"/get-whole-part", func(b *testing.B) {
			_, prefix := pageKeys(key)
			b.SetBytes(nr * size)
			for b.Loop() {
				v, err := s.c.Do(ctx, s.c.B().Get().Key(prefix+"0").Build()).ToString()
				if err != nil || len(v) != len(part) {
					b.Fatal(len(v), err)
				}
				for i := range rs {
					copy(rs[i].Dst[0], v[rs[i].Off:])
				}
			}
		})
	}
}
