package reshard_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/reshard"
	"github.com/kvreshard/kvreshard/runtime/store"
	"github.com/kvreshard/kvreshard/runtime/store/memstore"
)

// viewSpy is a spy that passes on the store's views, counting them, and
// lets a test replace ViewPart.
type viewSpy struct {
	*spy
	viewPart func(ctx context.Context, key string, part int, manifest string) ([]byte, error)
}

func newViewSpy(st store.Store) *viewSpy { return &viewSpy{spy: newSpy(st)} }

func (s *viewSpy) ViewPart(ctx context.Context, key string, part int, manifest string) ([]byte, error) {
	s.count("ViewPart")
	if s.viewPart != nil {
		return s.viewPart(ctx, key, part, manifest)
	}
	return s.Store.(store.Viewer).ViewPart(ctx, key, part, manifest)
}

// TestReadViews reads staged pages from a store that lends its parts: the
// copies run from the views, no range is read, and the pool holds exactly
// what it holds when the same pages are staged through range reads. The
// memory transport's auto stages whole parts, since its reads are views.
func TestReadViews(t *testing.T) {
	st := memstore.New()
	const n = 4
	var keys []string
	var mans []*manifest.Manifest
	for _, l := range []string{"PLHD", "LPHD", "HPLD"} {
		k := content.PageKeys("view-"+l, small.Domain(), n)
		m := writeAll(t, st, small, tp1pp3, l, k)
		keys = append(keys, k...)
		for range k {
			mans = append(mans, m)
		}
	}
	slots := []int{5, 0, 11, 3, 7, 1, 10, 2, 9, 4, 8, 6}
	for _, c := range []struct {
		name string
		opts plan.Options
	}{
		{"staged", plan.Options{Strategy: plan.Staged}},
		{"staged small bound", plan.Options{Strategy: plan.Staged, StageBytes: 1000, MaxGap: 64}},
		{"auto memory", plan.Options{Strategy: plan.Auto}},
	} {
		t.Run(c.name, func(t *testing.T) {
			vs := newViewSpy(st)
			rd, regions := newReader(t, vs, small, tp2pp2, placement.Rank{TP: 1, PP: 1}, "page_first", len(slots), reshard.ReaderOptions{Plan: c.opts})
			res := readAll(t, rd, keys, slots, regions)

			reads, parts, wholeParts := 0, 0, 0
			for _, m := range mans {
				tpl, err := rd.Planner().Template(m)
				require.NoError(t, err)
				require.Equal(t, plan.Staged, tpl.Strategy)
				reads += len(tpl.Reads)
				seen := map[int32]bool{}
				for _, r := range tpl.Reads {
					if r.Kernel {
						wholeParts++
					}
					seen[r.Part] = true
				}
				parts += len(seen)
			}
			require.Equal(t, reads, res.Ops)
			require.Equal(t, parts, vs.Calls("ViewPart"), "a part is lent once a page, however many reads it has")
			require.Equal(t, 0, vs.Calls("ReadRanges"))
			if c.opts.Strategy == plan.Auto {
				require.Equal(t, reads, wholeParts, "every read of auto on memory is a whole part moved by its copy kernel")
			}

			// The same pages staged through range reads: the same pool.
			sp := newSpy(st)
			rd2, regions2 := newReader(t, sp, small, tp2pp2, placement.Rank{TP: 1, PP: 1}, "page_first", len(slots), reshard.ReaderOptions{Plan: c.opts})
			res2, err := rd2.Read(context.Background(), keys, slots, regions2)
			require.NoError(t, err)
			require.Equal(t, res.Hit, res2.Hit)
			require.Equal(t, regions, regions2)
			require.Positive(t, sp.Calls("ReadRanges"))
		})
	}
}

// TestViewFailureReportsPrefix fails the view of part k of page b: the
// pages before it are read, nothing of page b reaches the pool (its views
// are all taken before any copy), and the error names the page; with one
// copy worker and with several.
func TestViewFailureReportsPrefix(t *testing.T) {
	st := memstore.New()
	keys := content.PageKeys("view-prefix", small.Domain(), 3)
	writeAll(t, st, small, tp4pp1, "PLHD", keys)
	for _, w := range []int{1, 4} {
		opts := reshard.ReaderOptions{Plan: plan.Options{Strategy: plan.Staged, MaxGap: 4096}, CopyWorkers: w}
		for _, b := range []int{0, 1, 2} {
			for _, k := range []int{0, 1} {
				t.Run(fmt.Sprintf("%d workers/page %d part %d", w, b, k), func(t *testing.T) {
					vs := newViewSpy(st)
					views := 0
					vs.viewPart = func(ctx context.Context, key string, part int, manifest string) ([]byte, error) {
						views++
						if key == keys[b] && part == k {
							return nil, errLinkDown
						}
						return st.ViewPart(ctx, key, part, manifest)
					}
					// Rank 0/0 of TP 2 x PP 2 needs parts 0 and 1 of each page.
					rd, regions := newReader(t, vs, small, tp2pp2, placement.Rank{}, "page_first", 3, opts)
					reshard.SetMinCopyShare(rd, 0, nil)
					before := clone(regions)
					slots := []int{2, 0, 1}
					res, err := rd.Read(context.Background(), keys, slots, regions)
					require.NoError(t, err)
					require.Equal(t, 2*b+k+1, views)
					require.EqualError(t, res.Stop, fmt.Sprintf("page %s: link down", keys[b]))
					require.Equal(t, reshard.Result{Hit: b, Bytes: b * rd.Geometry().PageBytes, Ops: 2 * b, Stop: res.Stop}, res)
					checkPool(t, rd.Geometry(), before, regions, keys, slots, res.Hit)
				})
			}
		}
	}
}

// TestViewChangedAfterQuery: a page rewritten in another layout between the
// query and the views is a miss, as it is for range reads
// (TestPageChangedAfterQuery): the view names the manifest planned for.
func TestViewChangedAfterQuery(t *testing.T) {
	st := memstore.New()
	keys := content.PageKeys("view-changed", small.Domain(), 3)
	writeAll(t, st, small, tp2pp2, "LPHD", keys[1:])
	ma := writeAll(t, st, small, tp1pp3, "PLHD", keys[:1])
	vs := newViewSpy(st)
	vs.query = func(ctx context.Context, ks []string) ([]store.Object, error) {
		objs, err := st.Query(ctx, ks)
		if err == nil && len(objs) > 2 {
			objs[2] = stored(ma)
		}
		return objs, err
	}
	rd, regions := newReader(t, vs, small, tp4pp1, placement.Rank{TP: 1}, "page_first", 3, reshard.ReaderOptions{Plan: plan.Options{Strategy: plan.Staged}})
	before := clone(regions)
	res, err := rd.Read(context.Background(), keys, iota(3), regions)
	require.NoError(t, err)
	require.Equal(t, 2, res.Hit)
	require.ErrorIs(t, res.Stop, store.ErrChanged)
	require.ErrorIs(t, res.Stop, reshard.ErrMiss, "a page rewritten since the query is a miss")
	require.Equal(t, reshard.StopMiss, reshard.Classify(res.Stop))
	msg := res.Stop.Error()
	require.True(t, strings.HasPrefix(msg, "page missing or incomplete: "+keys[2]+": read "+keys[2]+" part "), msg)
	require.True(t, strings.HasSuffix(msg, "): object changed since it was queried"), msg)
	checkPool(t, rd.Geometry(), before, regions, keys, iota(3), 2)
	require.Equal(t, 0, vs.Calls("ReadRanges"))
}
