package reshard

import (
	"encoding/binary"

	"github.com/zeebo/xxh3"

	"github.com/kvreshard/kvreshard/runtime/store"
)

// sumPrefix is the length of the bytes store.PartChecksum hashes before a
// part's bytes: the manifest key, a NUL byte and the part number as 8
// little-endian bytes.
func sumPrefix(manifest string) int { return len(manifest) + 9 }

// partSum returns store.PartChecksum(manifest, part, [][]byte{data}),
// where buf is the part's bytes data preceded by sumPrefix(manifest)
// bytes that partSum may overwrite: it writes the prefix there and hashes
// prefix and part in one call. XXH3 of the whole input equals the
// streaming sum PartChecksum computes, without the streaming hasher's copy
// of every byte through its block buffer, which costs more than the hash
// (TestPartSum holds the two equal).
func partSum(manifest string, part int, buf []byte) uint64 {
	n := copy(buf, manifest)
	buf[n] = 0
	binary.LittleEndian.PutUint64(buf[n+1:], uint64(part))
	if s := xxh3.Hash(buf); s != 0 {
		return s
	}
	return 1
}

// checkSum reports whether the bytes of check job j match sum: hashed in
// place when the job has room for the prefix before them, by
// store.PartChecksum otherwise (lent parts).
func checkSum(manifest string, j *copyJob, sum uint64) bool {
	if j.room != nil {
		return partSum(manifest, j.k, j.room) == sum
	}
	data := [1][]byte{j.src}
	return store.PartChecksum(manifest, j.k, data[:]) == sum
}
