package store_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/runtime/store"
)

// TestPartChecksumInPlace: the checksum a reader computes in place, over the part's
// bytes preceded by the prefix, is store.PartChecksum's, for parts shorter
// and longer than XXH3's short inputs, its block and stripe sizes, and for
// manifest keys of several lengths; a changed byte, part number or
// manifest key changes it.
func TestPartChecksumInPlace(t *testing.T) {
	data := make([]byte, 3<<20+77)
	for i := range data {
		data[i] = byte(i*131 + i>>9)
	}
	for _, mk := range []string{"", "m", "kv/test/small/manifests/0123456789abcdef", string(make([]byte, 1100))} {
		for _, n := range []int{0, 1, 16, 100, 128, 200, 231, 240, 241, 1000, 1024, 1025, 1088, 2048, 65536 + 3, 2621440, len(data)} {
			for _, part := range []int{0, 1, 1 << 40} {
				pre := store.ChecksumPrefix(mk)
				buf := make([]byte, pre+n)
				copy(buf[pre:], data[:n])
				want := store.PartChecksum(mk, part, [][]byte{data[:n]})
				require.Equal(t, want, store.PartChecksumInPlace(mk, part, buf), "manifest of %d bytes, part %d of %d bytes", len(mk), part, n)
				require.Equal(t, data[:n], buf[pre:], "the part's bytes are left as they were")
				if n > 0 {
					buf[pre+n/2] ^= 1
					require.NotEqual(t, want, store.PartChecksumInPlace(mk, part, buf), "a changed byte")
					buf[pre+n/2] ^= 1
				}
				require.NotEqual(t, want, store.PartChecksumInPlace(mk, part+1, buf), "another part")
				require.NotEqual(t, want, store.PartChecksumInPlace(mk+"x", part, append([]byte{0}, buf...)), "another manifest")
			}
		}
	}
}
