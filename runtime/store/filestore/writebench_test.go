package filestore

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvreshard/kvreshard/runtime/store"
)

func BenchmarkWriteParts(b *testing.B) {
	for _, size := range []int{4 << 10, 256 << 10} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			s, err := Open(b.TempDir(), Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			data := make([]byte, size)
			b.SetBytes(int64(size))
			i := 0
			for b.Loop() {
				i++
				w := store.PartWrite{Key: fmt.Sprint("k", i/2), Part: i % 2, Parts: 2, Manifest: "m", Data: [][]byte{data}}
				if err := s.WriteParts(context.Background(), []store.PartWrite{w})[0]; err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
