package reshard

import (
	"context"

	"github.com/kvreshard/kvreshard/runtime/plan"
)

// SetMinCopyShare makes r give each copy worker at least minBytes (1 when
// it is 0 or less), and calls f with the workers of each group of copies.
func SetMinCopyShare(r *Reader, minBytes int, f func(workers int)) {
	r.tune.minCopyShare, r.tune.onCopyWorkers = minBytes, f
}

// SetPipeline turns r's pipelining of staged batches on or off.
func SetPipeline(r *Reader, on bool) { r.tune.pipeline = on }

// SetPipeBatch makes r's pipelined batches fill n staging bytes at most
// when their rounds are smaller, and calls launched (when not nil) on the
// goroutine of each batch put in flight before its checks and copies run.
func SetPipeBatch(r *Reader, n int, launched func()) {
	r.tune.pipeBatch, r.tune.onLaunch = n, launched
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
