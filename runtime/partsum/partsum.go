// Package partsum is the format of a stored part: the part's bytes, then
// the checksums that let a reader check any range of them, then one root
// checksum that binds those to the page, the manifest and the part number.
//
//	data    n bytes, the part in its part layout
//	sums    8 x ceil(n/Block) bytes: the 64-bit XXH3 of each Block bytes
//	        of data (the last block may be shorter), little-endian
//	root    8 bytes: the 64-bit XXH3 of the page key, a NUL byte, the
//	        manifest key, a NUL byte, the part number and n (8 bytes
//	        little-endian each), then sums; little-endian
//
// A store keeps the whole of it as the part's bytes and knows nothing of
// the format. A reader that reads a range of data reads the blocks around
// it and the part's sums and root (Trailer bytes at offset n), checks the
// root against the page it asked for and each block it uses against its
// sum, and only then copies. A part copied from another page, another
// manifest or another part number fails the root check; a changed byte of
// data fails its block's check, a changed sum or root the root check.
//
// The checksums detect corruption and mix-ups, not an adversary who can
// write the store: XXH3 is not a MAC.
package partsum

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/zeebo/xxh3"
)

// Block is the bytes of data each sum covers. A checked read of a range
// reads and hashes whole blocks: 1 KiB keeps what a TP rank reads of a
// part written by a smaller TP exact in the common cases (a run of heads
// of 1 KiB or more), for sums of 0.8% of the data. XXH3 hashes 1 KiB
// blocks at about 30 GB/s in cache here, faster than memory moves them.
const Block = 1 << 10

// ErrMismatch: a part's bytes do not match its checksums.
var ErrMismatch = errors.New("part checksum mismatch")

// Blocks returns the number of sums of a part of n data bytes.
func Blocks(n int) int { return (n + Block - 1) / Block }

// TrailerLen returns the bytes that follow n data bytes: the sums and the
// root.
func TrailerLen(n int) int { return 8*Blocks(n) + 8 }

// Size returns the stored size of a part of n data bytes.
func Size(n int) int { return n + TrailerLen(n) }

// Trailer returns the sums and root of the part whose data is the
// fragments of data concatenated: what a writer stores after data.
func Trailer(key, manifest string, part int, data [][]byte) []byte {
	n := 0
	for _, f := range data {
		n += len(f)
	}
	t := make([]byte, 0, TrailerLen(n))
	var block [Block]byte
	fill := 0 // bytes of a block that spans fragments, in block
	for _, f := range data {
		if fill > 0 {
			c := copy(block[fill:], f)
			fill, f = fill+c, f[c:]
			if fill < Block {
				continue
			}
			t = binary.LittleEndian.AppendUint64(t, xxh3.Hash(block[:]))
			fill = 0
		}
		for len(f) >= Block {
			t = binary.LittleEndian.AppendUint64(t, xxh3.Hash(f[:Block]))
			f = f[Block:]
		}
		fill = copy(block[:], f)
	}
	if fill > 0 {
		t = binary.LittleEndian.AppendUint64(t, xxh3.Hash(block[:fill]))
	}
	return binary.LittleEndian.AppendUint64(t, Root(key, manifest, part, n, t))
}

// Root returns the root of the part of n data bytes whose sums are sums.
func Root(key, manifest string, part, n int, sums []byte) uint64 {
	h := xxh3.New()
	var b [16]byte
	h.WriteString(key)
	h.Write(b[:1])
	h.WriteString(manifest)
	h.Write(b[:1])
	binary.LittleEndian.PutUint64(b[:8], uint64(part))
	binary.LittleEndian.PutUint64(b[8:], uint64(n))
	h.Write(b[:])
	h.Write(sums)
	return h.Sum64()
}

// CheckTrailer checks the trailer t of part part, of n data bytes, of page
// key written with manifest: its length, and its root against its sums.
func CheckTrailer(key, manifest string, part, n int, t []byte) error {
	if len(t) != TrailerLen(n) {
		return fmt.Errorf("part %d: %d trailer bytes, not %d: %w", part, len(t), TrailerLen(n), ErrMismatch)
	}
	sums := t[:len(t)-8]
	if Root(key, manifest, part, n, sums) != binary.LittleEndian.Uint64(t[len(t)-8:]) {
		return fmt.Errorf("part %d: root: %w", part, ErrMismatch)
	}
	return nil
}

// CheckBlocks checks the blocks of a part of n data bytes that b holds,
// from block first on: b is whole blocks, but for the data's last block,
// which may be shorter. sums are the part's sums, from a trailer that
// CheckTrailer passed. It names the first block that does not match.
func CheckBlocks(part, n int, sums []byte, first int, b []byte) error {
	for at, i := 0, first; at < len(b); at, i = at+Block, i+1 {
		end := min(at+Block, len(b))
		if 8*i+8 > len(sums) || end-at != min(Block, n-i*Block) {
			return fmt.Errorf("part %d: block %d: %d bytes are not a block of the part: %w", part, i, end-at, ErrMismatch)
		}
		if xxh3.Hash(b[at:end]) != binary.LittleEndian.Uint64(sums[8*i:]) {
			return fmt.Errorf("part %d: block %d (bytes %d-%d): %w", part, i, i*Block, i*Block+end-at, ErrMismatch)
		}
	}
	return nil
}
