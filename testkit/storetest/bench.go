package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvreshard/kvreshard/runtime/store"
)

// BenchReadRanges benchmarks ReadRanges on s: 16 pages of 64 KiB, each of
// 4 parts of 16 KiB, read in one call per iteration as 256-byte ranges and
// as whole parts. A backend's BenchmarkReadRanges calls it.
func BenchReadRanges(b *testing.B, s store.Store) {
	const (
		pages    = 16
		parts    = 4
		partSize = 16 << 10
	)
	ctx := context.Background()
	prefix := fmt.Sprintf("storebench_%016x_", rand.Uint64())
	l := layout{"kv/" + prefix + "/manifests/bench", []int{partSize, partSize, partSize, partSize}}
	var ks []string
	for i := range pages {
		key := fmt.Sprintf("%spage%d", prefix, i)
		ks = append(ks, key)
		var ws []store.PartWrite
		for p := range parts {
			ws = append(ws, l.write(key, p))
		}
		for _, err := range s.WriteParts(ctx, ws) {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	dst := make([]byte, pages*parts*partSize)
	for _, c := range []struct {
		name string
		size int
	}{{"256B", 256}, {"part", partSize}} {
		b.Run(c.name, func(b *testing.B) {
			var rs []store.Range
			at := 0
			for _, key := range ks {
				for p := range parts {
					for off := 0; off < partSize; off += c.size {
						rs = append(rs, store.Range{Key: key, Part: p, Off: off, Dst: [][]byte{dst[at : at+c.size]}})
						at += c.size
					}
				}
			}
			b.SetBytes(int64(len(dst)))
			b.ReportAllocs()
			for b.Loop() {
				if n, err := s.ReadRanges(ctx, rs); n != len(rs) || err != nil {
					b.Fatal(n, err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(rs)), "ns/range")
		})
	}
}
