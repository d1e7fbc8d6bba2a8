package reshard

import "testing"

// SetMinCopyShare makes readers give each copy worker at least minBytes
// (1 when it is 0 or less), and calls f with the workers of each group of
// copies, until t ends.
func SetMinCopyShare(t testing.TB, minBytes int, f func(workers int)) {
	old := minCopyShare
	minCopyShare, testHookCopyWorkers = minBytes, f
	t.Cleanup(func() { minCopyShare, testHookCopyWorkers = old, nil })
}

// PartSum is partSum.
var PartSum = partSum

// SumPrefix is sumPrefix.
var SumPrefix = sumPrefix
