package reshard

import (
	"github.com/kvreshard/kvreshard/runtime/store"
)

// checkSum reports whether the bytes of check job j match sum: hashed in
// place when the job has room for the prefix before them, by
// store.PartChecksum otherwise (lent parts).
func checkSum(manifest string, j *copyJob, sum uint64) bool {
	if j.room != nil {
		return store.PartChecksumInPlace(manifest, j.k, j.room) == sum
	}
	data := [1][]byte{j.src}
	return store.PartChecksum(manifest, j.k, data[:]) == sum
}
