package partsum

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func data(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*131 + i>>8)
	}
	return b
}

func TestSizes(t *testing.T) {
	for _, c := range []struct{ n, blocks, trailer int }{
		{0, 0, 8}, {1, 1, 16}, {Block, 1, 16}, {Block + 1, 2, 24}, {10 * Block, 10, 88},
	} {
		require.Equal(t, c.blocks, Blocks(c.n), "Blocks(%d)", c.n)
		require.Equal(t, c.trailer, TrailerLen(c.n), "TrailerLen(%d)", c.n)
		require.Equal(t, c.n+c.trailer, Size(c.n), "Size(%d)", c.n)
	}
}

// TestGolden pins the format: a store written by one build is read by
// another, so a change of the sums or the root must be deliberate (and
// make the stores' format version change).
func TestGolden(t *testing.T) {
	tr := Trailer("kvreshard_00ff_domain", "kv/domain/manifests/abc", 3, [][]byte{data(2500)})
	require.Len(t, tr, 32)
	got := fmt.Sprintf("%016x %016x %016x root %016x", binary.LittleEndian.Uint64(tr), binary.LittleEndian.Uint64(tr[8:]),
		binary.LittleEndian.Uint64(tr[16:]), binary.LittleEndian.Uint64(tr[24:]))
	require.Equal(t, "c6c700c409d40c4b ce866f3ec412653b 4107ba2b81b6484b root e2d4225b0ce85622", got)
}

// TestFragments: the trailer of a part given as fragments, split anywhere,
// is that of its bytes in one piece.
func TestFragments(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		n := r.IntN(5 * Block)
		d := data(n)
		want := Trailer("k", "m", 1, [][]byte{d})
		var frags [][]byte
		for rest := d; len(rest) > 0; {
			c := min(len(rest), r.IntN(2*Block+3))
			frags = append(frags, rest[:c])
			rest = rest[c:]
		}
		if r.IntN(3) == 0 {
			frags = append(frags, nil)
		}
		require.Equal(t, want, Trailer("k", "m", 1, frags), "n %d, %d fragments", n, len(frags))
		require.NoError(t, CheckTrailer("k", "m", 1, n, want))
		require.NoError(t, CheckBlocks(1, n, want[:len(want)-8], 0, d))
	}
}

func TestCheckTrailer(t *testing.T) {
	const n = 3*Block + 100
	tr := Trailer("page", "man", 2, [][]byte{data(n)})
	require.NoError(t, CheckTrailer("page", "man", 2, n, tr))
	for name, c := range map[string]struct {
		key, manifest string
		part, n       int
	}{
		"another page":     {"page2", "man", 2, n},
		"another manifest": {"page", "man2", 2, n},
		"another part":     {"page", "man", 1, n},
		"another length":   {"page", "man", 2, n + 1},
	} {
		err := CheckTrailer(c.key, c.manifest, c.part, c.n, tr)
		require.EqualError(t, err, fmt.Sprintf("part %d: root: part checksum mismatch", c.part), name)
		require.ErrorIs(t, err, ErrMismatch, name)
	}
	require.EqualError(t, CheckTrailer("page", "man", 2, n+Block, tr), "part 2: 40 trailer bytes, not 48: part checksum mismatch")
	require.EqualError(t, CheckTrailer("page", "man", 2, n, tr[:len(tr)-1]), "part 2: 39 trailer bytes, not 40: part checksum mismatch")
	for i := range tr {
		bad := append([]byte(nil), tr...)
		bad[i] ^= 1
		require.EqualError(t, CheckTrailer("page", "man", 2, n, bad), "part 2: root: part checksum mismatch", "byte %d flipped", i)
	}
}

func TestCheckBlocks(t *testing.T) {
	const n = 3*Block + 100
	d := data(n)
	tr := Trailer("page", "man", 0, [][]byte{d})
	sums := tr[:len(tr)-8]
	require.NoError(t, CheckBlocks(0, n, sums, 1, d[Block:3*Block]))
	require.NoError(t, CheckBlocks(0, n, sums, 3, d[3*Block:]))
	require.NoError(t, CheckBlocks(0, n, sums, 2, nil))
	for _, at := range []int{0, Block - 1, Block, 2*Block + 7, n - 1} {
		bad := append([]byte(nil), d...)
		bad[at] ^= 0x80
		i := at / Block
		err := CheckBlocks(0, n, sums, 0, bad)
		require.EqualError(t, err, fmt.Sprintf("part 0: block %d (bytes %d-%d): part checksum mismatch", i, i*Block, min(i*Block+Block, n)))
		require.True(t, errors.Is(err, ErrMismatch))
		// Blocks before the flipped one pass alone.
		require.NoError(t, CheckBlocks(0, n, sums, 0, bad[:i*Block]))
	}
	require.EqualError(t, CheckBlocks(0, n, sums, 3, d[3*Block:n-1]), "part 0: block 3: 99 bytes are not a block of the part: part checksum mismatch")
	require.EqualError(t, CheckBlocks(0, n, sums, 1, d[Block:Block+10]), "part 0: block 1: 10 bytes are not a block of the part: part checksum mismatch")
	require.EqualError(t, CheckBlocks(0, n, sums, 4, d[:Block]), "part 0: block 4: 1024 bytes are not a block of the part: part checksum mismatch")
}
