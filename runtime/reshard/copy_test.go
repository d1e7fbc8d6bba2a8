package reshard_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/reshard"
	"github.com/kvreshard/kvreshard/runtime/store"
	"github.com/kvreshard/kvreshard/runtime/store/memstore"
)

// TestCopyWorkers reads staged pages with 1 to 8 copy workers, from a
// store that lends its parts and through range reads, and checks every
// byte of the pool, that each group of copies ran on as many workers as
// it was allowed (and had copies for), and that the pool is the one a
// single worker fills.
func TestCopyWorkers(t *testing.T) {
	var (
		mu     sync.Mutex
		groups []int // workers of each group of copies
	)
	count := func(w int) {
		mu.Lock()
		groups = append(groups, w)
		mu.Unlock()
	}
	mem := memstore.New()
	keys := content.PageKeys("workers", small.Domain(), 12)
	m := writeAll(t, mem, small, tp4pp1, "PLHD", keys)
	slots := []int{5, 0, 11, 3, 7, 1, 10, 2, 9, 4, 8, 6}
	for _, c := range []struct {
		name string
		st   store.Store
		opts plan.Options
		one  bool // the copies of the request run as one group
	}{
		{"views", mem, plan.Options{Strategy: plan.Staged, MaxGap: 1 << 20}, true},
		{"ranges", newSpy(mem), plan.Options{Strategy: plan.Staged, MaxGap: 1 << 20}, true},
		{"ranges small bound", newSpy(mem), plan.Options{Strategy: plan.Staged, StageBytes: 1000, MaxGap: 64}, false},
	} {
		var want [][]byte // the pool of one worker
		for _, w := range []int{1, 2, 3, 8} {
			t.Run(fmt.Sprintf("%s/%d workers", c.name, w), func(t *testing.T) {
				groups = nil
				// Rank 0/0 of TP 2 x PP 2 needs parts 0 and 1 of each page.
				rd, regions := newReader(t, c.st, small, tp2pp2, placement.Rank{}, "page_first", len(slots),
					reshard.ReaderOptions{Plan: c.opts, CopyWorkers: w})
				reshard.SetMinCopyShare(rd, 0, count)
				readAll(t, rd, keys, slots, regions)
				if want == nil {
					want = regions
				}
				require.Equal(t, want, regions)

				tpl, err := rd.Planner().Template(m)
				require.NoError(t, err)
				reads := len(keys) * len(tpl.Reads)
				if c.one {
					require.Equal(t, []int{min(w, reads)}, groups)
					return
				}
				require.Greater(t, len(groups), 1)
				for _, g := range groups {
					require.LessOrEqual(t, g, w)
				}
				if w > 1 {
					require.Greater(t, max(groups[0], groups[len(groups)-1]), 1)
				}
			})
		}
	}
}

// TestCopyWorkersMinShare: each worker is given at least the minimum
// share (512 KiB outside the tests), so a small group of copies runs on
// fewer workers than allowed, or on the calling goroutine alone.
func TestCopyWorkersMinShare(t *testing.T) {
	st := memstore.New()
	keys := content.PageKeys("workers-share", small.Domain(), 4)
	writeAll(t, st, small, tp4pp1, "PLHD", keys)
	// Rank 0/0 of TP 2 x PP 2 stages parts 0 and 1 of each page whole:
	// 8 copies of 2304 bytes, 18432 in all.
	for _, c := range []struct{ share, workers int }{{1 << 20, 1}, {18433, 1}, {9216, 2}, {4608, 4}, {1, 4}} {
		t.Run(fmt.Sprintf("share %d", c.share), func(t *testing.T) {
			var groups []int
			rd, regions := newReader(t, st, small, tp2pp2, placement.Rank{}, "page_first", 4,
				reshard.ReaderOptions{Plan: plan.Options{Strategy: plan.Staged, MaxGap: 1 << 20}, CopyWorkers: 4})
			reshard.SetMinCopyShare(rd, c.share, func(w int) { groups = append(groups, w) })
			readAll(t, rd, keys, iota(4), regions)
			require.Equal(t, []int{c.workers}, groups)
		})
	}
}

// TestCopyWorkersNegative: a negative worker count is refused.
func TestCopyWorkersNegative(t *testing.T) {
	b, err := plan.BindingFor(&small.Descriptor, tp2pp2, placement.Rank{}, builtin(t, "page_first"), 1)
	require.NoError(t, err)
	_, err = reshard.NewReader(memstore.New(), small.Domain(), &small.Descriptor, b, reshard.ReaderOptions{CopyWorkers: -1})
	require.EqualError(t, err, "copy workers: -1; want 0 (GOMAXPROCS) or more")
}
