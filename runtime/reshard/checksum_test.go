package reshard_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/runtime/manifest"
)

// corruptPage writes keys as the ranks of TP 4 in part layout PLHD (four
// parts of 2304 bytes, one head each) and flips byte 0 of part 1 of
// keys[bad]: in the stored part where the backend lets a test reach it (a
// file, a Redis string), in the bytes written otherwise (after the writer
// computed the checksum).
func corruptPage(t *testing.T, b backend, keys []string, bad int) *manifest.Manifest {
	t.Helper()
	ts, tp := newTamper(b.st)
	if b.name == "mem" {
		tp.flip[partID{keys[bad], 1}] = true
	}
	m := writeAll(t, ts, small, tp4pp1, "PLHD", keys)
	require.Equal(t, []int{2336, 2336, 2336, 2336}, partSizes(m), "2304 bytes of data, 3 block sums and the root")
	if b.name != "mem" {
		require.True(t, flipStored(t, b, keys[bad], 1, tp.written(t, keys[bad], 1).Data[0], 0))
	}
	return m
}
