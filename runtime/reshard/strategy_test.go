package reshard_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/reshard"
	"github.com/kvreshard/kvreshard/runtime/store"
)

// TestReadStrategies reads pages written in three layouts with readers of
// every strategy, into permuted slots, and checks every byte of the pool,
// the op counts, and how many batches the store was asked for: staged
// rounds that do not fit the staging bound together are read in batches.
func TestReadStrategies(t *testing.T) {
	forEachStore(t, func(t *testing.T, st store.Store) {
		const n = 4
		var keys []string
		var mans []*manifest.Manifest
		for _, l := range []string{"PLHD", "LPHD", "HPLD"} {
			k := content.PageKeys("strat-"+l, small.Domain(), n)
			m := writeAll(t, st, small, tp1pp3, l, k)
			keys = append(keys, k...)
			for range k {
				mans = append(mans, m)
			}
		}
		slots := []int{5, 0, 11, 3, 7, 1, 10, 2, 9, 4, 8, 6}
		rdma := plan.RDMATransport()
		redis := plan.RedisTransport()
		for _, c := range []struct {
			name    string
			opts    plan.Options
			batches int // 0: more than one
		}{
			{"direct", plan.Options{}, 1},
			{"scatter", plan.Options{Strategy: plan.Scatter, MaxSegments: 3}, 1},
			{"scatter rdma", plan.Options{Strategy: plan.Scatter, Transport: &rdma, MaxSegments: 30}, 1},
			{"staged", plan.Options{Strategy: plan.Staged}, 1},
			{"staged whole parts", plan.Options{Strategy: plan.Staged, MaxGap: 1 << 20}, 1},
			{"staged small bound", plan.Options{Strategy: plan.Staged, StageBytes: 1000, MaxGap: 64}, 0},
			{"auto memory", plan.Options{Strategy: plan.Auto}, 1},
			{"auto redis", plan.Options{Strategy: plan.Auto, Transport: &redis}, 1},
		} {
			t.Run(c.name, func(t *testing.T) {
				sp := newSpy(st)
				rd, regions := newReader(t, sp, small, tp2pp2, placement.Rank{TP: 1, PP: 1}, "page_first", len(slots), reshard.ReaderOptions{Plan: c.opts})
				res := readAll(t, rd, keys, slots, regions)
				ops, strategies := 0, map[plan.Strategy]bool{}
				for i := range keys {
					tpl, err := rd.Planner().Template(mans[i])
					require.NoError(t, err)
					ops += tpl.OpCount()
					strategies[tpl.Strategy] = true
					if c.opts.Strategy != plan.Auto {
						require.Equal(t, c.opts.Strategy, tpl.Strategy)
					}
				}
				require.Equal(t, ops, res.Ops)
				require.Equal(t, ops, sp.rangesRead)
				require.Equal(t, len(keys)*rd.Geometry().PageBytes, res.Bytes)
				if c.batches > 0 {
					require.Equal(t, c.batches, sp.Calls("ReadRanges"))
				} else {
					require.Greater(t, sp.Calls("ReadRanges"), 1)
				}
				t.Logf("%d ops in %d batches, strategies %v", ops, sp.Calls("ReadRanges"), strategies)
			})
		}
	})
}

// TestStagedFailedReadReportsPrefix reads three pages whose staging fills
// the bound, one ReadRanges batch each, and fails batch b at range k: the
// pages of earlier batches are read, and nothing of the failed page is
// copied into the pool.
func TestStagedFailedReadReportsPrefix(t *testing.T) {
	forEachStore(t, func(t *testing.T, st store.Store) {
		keys := content.PageKeys("staged-prefix", small.Domain(), 3)
		writeAll(t, st, small, tp4pp1, "PLHD", keys)
		// Rank 0/0 of TP 2 x PP 2 needs heads 0 and 1: parts 0 and 1, of
		// 2304 bytes each, read whole: a page a staging bound of 4608
		// bytes, and a page a half of one of 9216 when batches are
		// pipelined.
		for _, w := range []int{1, 4} {
			bound := 4608
			if w > 1 {
				bound *= 2
			}
			opts := reshard.ReaderOptions{Plan: plan.Options{Strategy: plan.Staged, StageBytes: bound, MaxGap: 4096}, CopyWorkers: w}
			for _, b := range []int{0, 1, 2} {
				for _, k := range []int{0, 1} {
					t.Run(fmt.Sprintf("%d workers/batch %d range %d", w, b, k), func(t *testing.T) {
						sp := newSpy(st)
						calls := 0
						sp.readRanges = func(ctx context.Context, rs []store.Range) (int, error) {
							require.Len(t, rs, 2)
							require.Equal(t, 2304, rs[0].Len())
							calls++
							if calls-1 < b {
								return st.ReadRanges(ctx, rs)
							}
							n, err := st.ReadRanges(ctx, rs[:k])
							require.NoError(t, err)
							return n, errLinkDown
						}
						rd, regions := newReader(t, sp, small, tp2pp2, placement.Rank{}, "page_first", 3, opts)
						reshard.SetMinCopyShare(rd, 0, nil)
						before := clone(regions)
						slots := []int{2, 0, 1}
						res, err := rd.Read(context.Background(), keys, slots, regions)
						require.NoError(t, err)
						require.Equal(t, b+1, calls)
						require.EqualError(t, res.Stop, fmt.Sprintf("page %s: link down", keys[b]))
						require.Equal(t, reshard.Result{Hit: b, Bytes: b * rd.Geometry().PageBytes, Ops: 2 * b, Stop: res.Stop}, res)
						checkPool(t, rd.Geometry(), before, regions, keys, slots, res.Hit)
					})
				}
			}
		}
	})
}
