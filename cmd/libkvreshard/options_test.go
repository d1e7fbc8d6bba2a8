package main

import (
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/runtime/reshard"
)

// optionPages is the number of pages readerOf's store holds.
const optionPages = 5

// readerOf writes optionPages pages of model ma from a TP1/PP1 writer
// into a memory store and opens a TP2/PP1 page_first reader of rank 1 on
// it, whose pool has slots slots: its handle, its pool's regions and the
// pages' store keys.
func readerOf(t *testing.T, ma modelArgs, slots int) (uint64, *readerHandle, [][]byte, []string) {
	t.Helper()
	sh, err := openStore("mem://")
	require.NoError(t, err)
	model, err := buildModel(ma)
	require.NoError(t, err)
	d := &model.Descriptor
	_, _, keys := storeKeysOf(t, model.Domain(), optionPages)
	wa := placementArgs{tp: 1, pp: 1}
	a, regs := testPool(t, "page_first", d, wa, optionPages)
	wv, err := openWriter(sh, ma, wa, a, "")
	require.NoError(t, err)
	wh, err := lookup[*writerHandle](wv, "writer")
	require.NoError(t, err)
	for i, k := range keys {
		content.Fill(wh.w.Geometry(), regs, i, content.Seed(k))
	}
	st := make([]uint8, optionPages)
	_, err = wh.write(keys, []int{0, 1, 2, 3, 4}, st)
	require.NoError(t, err)
	require.Equal(t, []uint8{0, 0, 0, 0, 0}, st)
	require.NoError(t, wh.close(wv, "writer"))

	ra := placementArgs{tp: 2, pp: 1, tpRank: 1}
	a, regs = testPool(t, "page_first", d, ra, slots)
	rv, err := openReader(sh, ma, ra, a)
	require.NoError(t, err)
	require.NoError(t, closeStore(sh)) // the store stays open for its reader
	rh, err := lookup[*readerHandle](rv, "reader")
	require.NoError(t, err)
	return rv, rh, regs, keys
}

// verifyRead checks that pages keys[:hit] are in slots reverse[i] = 4-i.
func verifyRead(t *testing.T, rh *readerHandle, regs [][]byte, keys []string, hit int) {
	t.Helper()
	require.NoError(t, verifyAt(rh, regs, keys[:hit], reverse))
}

// verifyAt returns the error of the first page keys[i] not in slot
// slots[i].
func verifyAt(rh *readerHandle, regs [][]byte, keys []string, slots []int) error {
	for i, k := range keys {
		if err := content.Verify(rh.r.Geometry(), regs, slots[i], content.Seed(k)); err != nil {
			return fmt.Errorf("page %d: %w", i, err)
		}
	}
	return nil
}

var reverse = []int{4, 3, 2, 1, 0}

// TestSetOptions sets a reader's copy workers and prefetch budget
// (kvr_reader_set_options): bad values are refused with their names and
// change nothing, the budget stops reads at its page or byte, and the
// counters go on across the change.
func TestSetOptions(t *testing.T) {
	rv, rh, regs, keys := readerOf(t, testModel, optionPages)
	require.Equal(t, runtime.GOMAXPROCS(0), rh.opts.CopyWorkers, "copy workers at open")
	require.Zero(t, rh.opts.MaxPages)
	require.Zero(t, rh.opts.MaxBytes)

	for _, c := range []struct {
		cw, pages, bytes int64
		msg              string
	}{
		{-1, 0, 0, "copy_workers is -1; want 0 (GOMAXPROCS) to 1024"},
		{1025, 0, 0, "copy_workers is 1025; want 0 (GOMAXPROCS) to 1024"},
		{1, -1, 0, "max_pages is -1; want 0 (no limit) or more"},
		{1, 0, -5, "max_bytes is -5; want 0 (no limit) or more"},
	} {
		err := rh.setOptions(rv, readerOptions{copyWorkers: c.cw, maxPages: c.pages, maxBytes: c.bytes})
		require.EqualError(t, err, c.msg)
		require.Equal(t, kvrEInval, codeOf(err))
	}
	require.Equal(t, runtime.GOMAXPROCS(0), rh.opts.CopyWorkers, "a refused call changes nothing")

	res, err := rh.read(keys, reverse)
	require.NoError(t, err)
	require.Equal(t, optionPages, res.Hit)
	verifyRead(t, rh, regs, keys, optionPages)
	pageBytes := rh.r.Geometry().PageBytes

	clear(regs[0])
	require.NoError(t, rh.setOptions(rv, readerOptions{copyWorkers: 1, maxPages: 2, maxBytes: 0}))
	require.Equal(t, reshard.ReaderOptions{Plan: rh.popts, CopyWorkers: 1, MaxPages: 2}, rh.opts)
	res, err = rh.read(keys, reverse)
	require.NoError(t, err)
	require.Equal(t, 2, res.Hit)
	require.Equal(t, kvrStopBudget, stopCode(res.Stop))
	require.EqualError(t, res.Stop, "prefetch budget reached: 2 pages")
	require.Equal(t, 2*pageBytes, res.Bytes)
	verifyRead(t, rh, regs, keys, 2)

	// A budget of bytes: 3 pages and one byte is 3 pages.
	require.NoError(t, rh.setOptions(rv, readerOptions{copyWorkers: 3, maxPages: 0, maxBytes: int64(3*pageBytes + 1)}))
	require.Equal(t, 3, rh.opts.CopyWorkers)
	res, err = rh.read(keys, reverse)
	require.NoError(t, err)
	require.Equal(t, 3, res.Hit)
	require.Equal(t, kvrStopBudget, stopCode(res.Stop))
	require.EqualError(t, res.Stop, fmt.Sprintf("prefetch budget reached: %d bytes", 3*pageBytes+1))

	// Back to the defaults: no budget.
	require.NoError(t, rh.setOptions(rv, readerOptions{copyWorkers: 0, maxPages: 0, maxBytes: 0}))
	require.Equal(t, runtime.GOMAXPROCS(0), rh.opts.CopyWorkers)
	res, err = rh.read(keys, reverse)
	require.NoError(t, err)
	require.Equal(t, optionPages, res.Hit)
	verifyRead(t, rh, regs, keys, optionPages)

	// Checked: each lent part checked once a reader.
	require.NoError(t, rh.setOptions(rv, readerOptions{checkParts: true}))
	res, err = rh.read(keys, reverse)
	require.NoError(t, err)
	require.Equal(t, optionPages, res.Hit)
	verifyRead(t, rh, regs, keys, optionPages)

	// The counters of the five reads, across five readers: one op a page
	// (the memory store lends whole parts), and one more a checked page
	// (its part's trailer, lent with the part).
	hits := int64(5 + 2 + 3 + 5 + 5)
	require.Equal(t, reshard.Stats{Requests: 5, Pages: 5 * optionPages, Hits: hits, Misses: 3 + 2,
		Bytes: hits * int64(pageBytes), Ops: hits + 5, PartsChecked: 5}, rh.stats())

	require.NoError(t, rh.close(rv, "reader"))
	err = rh.setOptions(rv, readerOptions{copyWorkers: 1, maxPages: 0, maxBytes: 0})
	require.EqualError(t, err, fmt.Sprintf("reader handle %d is closed", rv))
	require.Equal(t, kvrEClosed, codeOf(err))
}

// bigModel's pages are 256 KiB for a reader of TP 2: four are the 1 MiB
// that two copy workers need.
var bigModel = modelArgs{layers: 4, kvHeads: 2, headDim: 128, page: 64, dtype: "fp32", name: "big", revision: "1", namespace: "ns"}

// TestReadOffload checks which reads run on a goroutine of the library
// (a caller from C is a goroutine locked to its thread; see offload):
// reads whose copies may run on more than one copy worker. Not an empty
// call, nor a read on one copy worker, nor one under 1 MiB. Both kinds
// read every byte.
func TestReadOffload(t *testing.T) {
	rv, rh, regs, keys := readerOf(t, bigModel, optionPages)
	require.Equal(t, 256<<10, rh.r.Geometry().PageBytes)
	for _, c := range []struct {
		cw   int64
		n    int
		want bool
	}{
		{2, 0, false}, {2, 1, false}, {2, 3, false}, {2, 4, true}, {2, optionPages, true}, {8, 4, true},
		{1, 0, false}, {1, 4, false}, {1, optionPages, false},
	} {
		require.NoError(t, rh.setOptions(rv, readerOptions{copyWorkers: c.cw, maxPages: 0, maxBytes: 0}))
		require.Equal(t, c.want, rh.offload(c.n), "copy workers %d, %d pages", c.cw, c.n)
		clear(regs[0])
		clear(regs[1])
		res, err := rh.read(keys[:c.n], reverse[:c.n])
		require.NoError(t, err)
		require.Equal(t, c.n, res.Hit)
		verifyRead(t, rh, regs, keys, c.n)
	}
	require.NoError(t, rh.close(rv, "reader"))
}

// TestOnGoroutinePanic checks that a panic of an offloaded read reaches
// the caller's goroutine, where the export's recover turns it into
// KVR_EINTERNAL, instead of ending the process.
func TestOnGoroutinePanic(t *testing.T) {
	var got any
	func() {
		defer func() { got = recover() }()
		_, _ = onGoroutine(func() (reshard.Result, error) { panic("boom") })
	}()
	require.Equal(t, "boom", got)
	res, err := onGoroutine(func() (reshard.Result, error) { return reshard.Result{Hit: 3}, fmt.Errorf("x") })
	require.Equal(t, 3, res.Hit)
	require.EqualError(t, err, "x")
}

// TestSetOptionsWhileReading changes a reader's options while goroutines
// read through it, each into slots of its own: each read sees one set of
// options whole (all pages, or the budget's 2; on the library's goroutine
// or the caller's), its pages are right, and the counters add up. Run
// with -race.
func TestSetOptionsWhileReading(t *testing.T) {
	const readers, reads, sets = 4, 5, 10
	rv, rh, regs, keys := readerOf(t, bigModel, readers*optionPages)
	var wg sync.WaitGroup
	errs := make(chan error, readers*reads)
	for g := range readers {
		wg.Go(func() {
			slots := make([]int, optionPages)
			for i := range slots {
				slots[i] = g*optionPages + i
			}
			for range reads {
				if err := rh.enter(rv, "reader"); err != nil {
					errs <- err
					return
				}
				res, err := rh.read(keys, slots)
				if err == nil && res.Hit != optionPages && (res.Hit != 2 || stopCode(res.Stop) != kvrStopBudget) {
					err = fmt.Errorf("goroutine %d: hit %d, stop %v", g, res.Hit, res.Stop)
				}
				if err == nil {
					err = verifyAt(rh, regs, keys[:res.Hit], slots)
				}
				rh.leave()
				if err != nil {
					errs <- err
				}
			}
		})
	}
	for i := range sets {
		require.NoError(t, rh.setOptions(rv, readerOptions{copyWorkers: int64(1 + i%3), maxPages: int64(2 * (i % 2)), maxBytes: 0}))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	s := rh.stats()
	require.Equal(t, int64(readers*reads), s.Requests)
	require.Equal(t, int64(readers*reads*optionPages), s.Pages)
	require.Equal(t, s.Pages, s.Hits+s.Misses)
	require.NoError(t, rh.close(rv, "reader"))
}
