package reshard_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/reshard"
	"github.com/kvreshard/kvreshard/runtime/store"
	"github.com/kvreshard/kvreshard/runtime/store/filestore"
)

// pipelined is a reader of a file store whose staged batches are one page
// each (its two whole parts) and pipelined, and the spy it reads through.
// The checks and copies of batch i (ReadRanges call i) are held until
// the next batch's read starts, so that every batch but the last is read
// while the one before it is in flight: a reader that ran a batch's
// copies before reading the next would never start that read, and the
// test fails (after a minute, a bound no correct run comes near).
type pipelined struct {
	sp       *spy
	rd       *reshard.Reader
	regions  [][]byte
	before   [][]byte
	mu       sync.Mutex
	started  []chan struct{} // closed when ReadRanges call i starts
	launches int
	reads    int
	// onRead, when set, runs in place of the store's ReadRanges on call i
	// (0-based) when it returns true.
	onRead func(i int, ctx context.Context, rs []store.Range) (int, error, bool)
}

func newPipelined(t *testing.T, st store.Store, pages int, opts reshard.ReaderOptions) *pipelined {
	t.Helper()
	p := &pipelined{sp: newSpy(st)}
	for range pages + 1 {
		p.started = append(p.started, make(chan struct{}))
	}
	p.sp.readRanges = func(ctx context.Context, rs []store.Range) (int, error) {
		p.mu.Lock()
		i := p.reads
		p.reads++
		p.mu.Unlock()
		close(p.started[i])
		if p.onRead != nil {
			if n, err, ok := p.onRead(i, ctx, rs); ok {
				return n, err
			}
		}
		return st.ReadRanges(ctx, rs)
	}
	if opts.Plan.Strategy == plan.Auto {
		opts.Plan = plan.Options{Strategy: plan.Staged, MaxGap: 1 << 20}
	}
	opts.CopyWorkers = max(opts.CopyWorkers, 2)
	p.rd, p.regions = newReader(t, p.sp, small, tp2pp2, placement.Rank{}, "page_first", pages, opts)
	reshard.SetPipeBatch(p.rd, 1, func() {
		p.mu.Lock()
		i := p.launches
		p.launches++
		p.mu.Unlock()
		select {
		case <-p.started[i+1]:
		case <-time.After(time.Minute):
			t.Errorf("batch %d ran its checks and copies before batch %d was read", i, i+1)
		}
	})
	p.before = clone(p.regions)
	return p
}

// newFileStore returns a new file store.
func newFileStore(t *testing.T) store.Store {
	t.Helper()
	st, err := filestore.Open(t.TempDir(), filestore.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	return st
}

// TestPipelinedRead reads six pages in six pipelined batches, with every
// batch but the first read while the one before is in flight: every page
// is read, with CheckParts every part checked once, nothing else in the
// pool changed, with and without checks, on 2 and 4 copy workers.
func TestPipelinedRead(t *testing.T) {
	st := newFileStore(t)
	keys := content.PageKeys("pipelined", small.Domain(), 6)
	writeAll(t, st, small, tp4pp1, "PLHD", keys)
	slots := []int{4, 1, 5, 0, 3, 2}
	for _, c := range []struct {
		name string
		opts reshard.ReaderOptions
	}{
		{"unchecked", reshard.ReaderOptions{Plan: plan.Options{Strategy: plan.Auto}}},
		{"unchecked four workers", reshard.ReaderOptions{Plan: plan.Options{Strategy: plan.Auto}, CopyWorkers: 4}},
		{"checked", reshard.ReaderOptions{Plan: plan.Options{Strategy: plan.Auto}, CheckParts: true}},
		{"checked four workers", reshard.ReaderOptions{Plan: plan.Options{Strategy: plan.Auto}, CheckParts: true, CopyWorkers: 4}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newPipelined(t, st, len(keys), c.opts)
			res := readAll(t, p.rd, keys, slots, p.regions)
			// Two whole parts a page, and checked their two trailers.
			ops, checked := 2, int64(0)
			if c.opts.CheckParts {
				ops, checked = 4, int64(2*len(keys))
			}
			require.Equal(t, ops*len(keys), res.Ops)
			require.Equal(t, len(keys), p.sp.Calls("ReadRanges"), "a batch a page")
			require.Equal(t, len(keys)-1, p.launches, "every batch but the last in flight")
			require.Equal(t, checked, p.rd.Stats().PartsChecked)

			// Not pipelined, the same pool.
			q := newPipelined(t, st, len(keys), c.opts)
			reshard.SetPipeline(q.rd, false)
			readAll(t, q.rd, keys, slots, q.regions)
			require.Equal(t, 1, q.sp.Calls("ReadRanges"), "one batch")
			require.Zero(t, q.launches)
			require.Equal(t, p.regions, q.regions)
		})
	}
}

// TestPipelinedChecksumMismatch: page 3 of six fails its check, in the
// batch read while page 2's is in flight: pages 0-2 are read, nothing of
// page 3 or after reaches the pool though page 4 was read, and the checks
// counted are those of pages 0-3.
func TestPipelinedChecksumMismatch(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		if b.name == "mem" {
			t.Skip("a store that lends its parts stages nothing")
		}
		keys := content.PageKeys("pipelined-flipped", small.Domain(), 6)
		corruptPage(t, b, keys, 3)
		slots := []int{4, 1, 5, 0, 3, 2}
		p := newPipelined(t, b.st, len(keys), reshard.ReaderOptions{Plan: plan.Options{Strategy: plan.Auto}, CheckParts: true})
		res, err := p.rd.Read(context.Background(), keys, slots, p.regions)
		require.NoError(t, err)
		require.EqualError(t, res.Stop, fmt.Sprintf("page %s: part 1: block 0 (bytes 0-1024): part checksum mismatch", keys[3]))
		require.Equal(t, reshard.StopChecksum, reshard.Classify(res.Stop))
		require.Equal(t, reshard.Result{Hit: 3, Bytes: 3 * p.rd.Geometry().PageBytes, Ops: 12, Stop: res.Stop}, res)
		checkPool(t, p.rd.Geometry(), p.before, p.regions, keys, slots, 3)
		require.Equal(t, 5, p.sp.Calls("ReadRanges"), "page 4 read while page 3 was checked")
		st := p.rd.Stats()
		require.Equal(t, int64(8), st.PartsChecked)
		require.Equal(t, int64(1), st.ChecksumErrors)
	})
}

// TestPipelinedReadFails: the read of page 3 of six fails after its first
// range (the trailer of part 0 read, that of part 1 not), while page 2's
// checks and copies are in flight: pages 0-2 are read, nothing of page 3
// reaches the pool, and no later page is read.
func TestPipelinedReadFails(t *testing.T) {
	st := newFileStore(t)
	keys := content.PageKeys("pipelined-fails", small.Domain(), 6)
	writeAll(t, st, small, tp4pp1, "PLHD", keys)
	slots := []int{4, 1, 5, 0, 3, 2}
	broken := errors.New("disk on fire")
	p := newPipelined(t, st, len(keys), reshard.ReaderOptions{Plan: plan.Options{Strategy: plan.Auto}, CheckParts: true})
	p.onRead = func(i int, ctx context.Context, rs []store.Range) (int, error, bool) {
		if i != 3 {
			return 0, nil, false
		}
		n, err := st.ReadRanges(ctx, rs[:1])
		require.NoError(t, err)
		return n, &store.RangeError{Key: rs[1].Key, Part: rs[1].Part, Off: rs[1].Off, Len: rs[1].Len(), Err: broken}, true
	}
	res, err := p.rd.Read(context.Background(), keys, slots, p.regions)
	require.NoError(t, err)
	require.ErrorIs(t, res.Stop, broken)
	require.Equal(t, reshard.StopFailed, reshard.Classify(res.Stop))
	require.Equal(t, 3, res.Hit)
	checkPool(t, p.rd.Geometry(), p.before, p.regions, keys, slots, 3)
	require.Equal(t, 4, p.sp.Calls("ReadRanges"))
	require.Equal(t, int64(6), p.rd.Stats().PartsChecked)
}

// TestPipelinedCancel: the context is canceled as page 3's batch is read,
// while page 2's checks and copies are in flight: those complete, pages
// 0-2 are read, and the read stops with the context's error.
func TestPipelinedCancel(t *testing.T) {
	st := newFileStore(t)
	keys := content.PageKeys("pipelined-cancel", small.Domain(), 6)
	writeAll(t, st, small, tp4pp1, "PLHD", keys)
	slots := []int{4, 1, 5, 0, 3, 2}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := newPipelined(t, st, len(keys), reshard.ReaderOptions{CheckParts: true})
	p.onRead = func(i int, ctx context.Context, rs []store.Range) (int, error, bool) {
		if i == 3 {
			cancel()
		}
		return 0, nil, false
	}
	res, err := p.rd.Read(ctx, keys, slots, p.regions)
	require.NoError(t, err)
	require.ErrorIs(t, res.Stop, context.Canceled)
	require.Equal(t, reshard.StopCanceled, reshard.Classify(res.Stop))
	require.Equal(t, 3, res.Hit)
	checkPool(t, p.rd.Geometry(), p.before, p.regions, keys, slots, 3)
	require.Equal(t, 4, p.sp.Calls("ReadRanges"))
}

// TestPipelinedDirectWaits reads three pages, two staged (one batch each)
// and then one direct, whose ranges read straight into the pool: they are
// read only once the batch in flight passed its checks. When page 0 fails
// its check, pages 1 and 2 are never read and the pool is untouched; when
// it passes, every page is read.
func TestPipelinedDirectWaits(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		if b.name == "mem" {
			t.Skip("a store that lends its parts stages nothing")
		}
		slots := []int{2, 0, 1}
		bind, err := plan.BindingFor(&small.Descriptor, tp2pp2, placement.Rank{}, builtin(t, "page_first"), len(slots))
		require.NoError(t, err)
		direct, err := plan.NewPlanner(&small.Descriptor, bind, plan.Options{Strategy: plan.Direct})
		require.NoError(t, err)
		for _, bad := range []bool{true, false} {
			t.Run(fmt.Sprintf("page 0 corrupt %v", bad), func(t *testing.T) {
				keys := content.PageKeys(fmt.Sprintf("pipelined-direct-%v", bad), small.Domain(), 3)
				if bad {
					corruptPage(t, b, keys, 0)
				} else {
					writeAll(t, b.st, small, tp4pp1, "PLHD", keys)
				}
				sp := newSpy(b.st)
				rd, regions := newReader(t, sp, small, tp2pp2, placement.Rank{}, "page_first", len(slots),
					reshard.ReaderOptions{Plan: plan.Options{Strategy: plan.Staged, MaxGap: 1 << 20}, CopyWorkers: 2, CheckParts: true})
				reshard.SetPipeBatch(rd, 1, nil)
				before := clone(regions)
				hit, err := reshard.ReadSwapped(rd, context.Background(), keys, slots, regions, func(i int, tpl *plan.Plan) *plan.Plan {
					if i < 2 {
						require.Equal(t, plan.Staged, tpl.Strategy)
						return tpl
					}
					d, err := direct.Template(tpl.Manifest)
					require.NoError(t, err)
					require.Equal(t, plan.Direct, d.Strategy)
					return d
				})
				if bad {
					require.EqualError(t, err, "part 1: block 0 (bytes 0-1024): part checksum mismatch")
					require.Zero(t, hit)
					require.Equal(t, 1, sp.Calls("ReadRanges"), "pages 1 and 2 are not read")
					checkPool(t, rd.Geometry(), before, regions, keys, slots, 0)
					return
				}
				require.NoError(t, err)
				require.Equal(t, 3, hit)
				require.Equal(t, 2, sp.Calls("ReadRanges"))
				checkPool(t, rd.Geometry(), before, regions, keys, slots, 3)
			})
		}
	})
}
