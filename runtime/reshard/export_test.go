package reshard

import (
	"context"
	"testing"

	"github.com/kvreshard/kvreshard/runtime/plan"
)

// SetMinCopyShare makes readers give each copy worker at least minBytes
// (1 when it is 0 or less), and calls f with the workers of each group of
// copies, until t ends.
func SetMinCopyShare(t testing.TB, minBytes int, f func(workers int)) {
	old := minCopyShare
	minCopyShare, testHookCopyWorkers = minBytes, f
	t.Cleanup(func() { minCopyShare, testHookCopyWorkers = old, nil })
}

// SetPipeline turns the pipelining of staged batches on or off until t
// ends.
func SetPipeline(t testing.TB, on bool) {
	old := pipeline
	pipeline = on
	t.Cleanup(func() { pipeline = old })
}

// SetPipeBatch makes pipelined batches fill n staging bytes at most when
// their rounds are smaller, and calls launched (when not nil) on the
// goroutine of each batch put in flight before its checks and copies
// run, until t ends.
func SetPipeBatch(t testing.TB, n int, launched func()) {
	old := pipeBatch
	pipeBatch, testHookLaunch = n, launched
	t.Cleanup(func() { pipeBatch, testHookLaunch = old, nil })
}

// ReadSwapped reads keys as Read does, with the template of page i
// replaced by swap(i, template): a request that mixes strategies. It
// returns the pages read in full and why the reads stopped.
func ReadSwapped(r *Reader, ctx context.Context, keys []string, slots []int, regions [][]byte, swap func(i int, t *plan.Plan) *plan.Plan) (int, error) {
	pages, stop := r.lookup(ctx, keys)
	if stop != nil {
		return 0, stop
	}
	for i, t := range pages.tpls {
		pages.tpls[i] = swap(i, t)
	}
	x := r.newExec(ctx, pages.tpls, keys, slots, regions)
	defer x.release()
	for i := range pages.tpls {
		if !x.add(i) {
			break
		}
	}
	x.flush(true)
	return x.hit, x.err
}
