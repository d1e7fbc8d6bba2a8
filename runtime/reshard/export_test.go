package reshard

import "testing"

// SetParallelCopy makes readers run groups of copies of minBytes and more
// on several goroutines, and calls f with the workers of each group, until
// t ends.
func SetParallelCopy(t testing.TB, minBytes int, f func(workers int)) {
	old := parallelCopyBytes
	parallelCopyBytes, testHookCopyWorkers = minBytes, f
	t.Cleanup(func() { parallelCopyBytes, testHookCopyWorkers = old, nil })
}
