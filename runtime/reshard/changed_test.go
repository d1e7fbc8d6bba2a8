package reshard_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/reshard"
	"github.com/kvreshard/kvreshard/runtime/store"
)

// A page rewritten in another layout between the query and the reads (it
// expired and another topology wrote it): the reader planned for the layout
// the query reported, its ranges name that manifest, and the store refuses
// them, so the page is a miss and no byte of another layout is taken for
// this one. The spy reports layout A for pages whose stored layout is B.
func TestPageChangedAfterQuery(t *testing.T) {
	forEachStore(t, func(t *testing.T, st store.Store) {
		keys := content.PageKeys("changed", small.Domain(), 3)
		mb := writeAll(t, st, small, tp2pp2, "LPHD", keys[1:])
		ma := writeAll(t, st, small, tp1pp3, "PLHD", keys[:1])
		s := newSpy(st)
		s.query = func(ctx context.Context, ks []string) ([]store.Object, error) {
			objs, err := st.Query(ctx, ks)
			if err == nil && len(objs) > 2 {
				objs[2] = stored(ma) // page 2 is stored as B, reported as A
			}
			return objs, err
		}
		rd, regions := newReader(t, s, small, tp4pp1, placement.Rank{TP: 1}, "page_first", 3, reshard.ReaderOptions{})
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
		require.Equal(t, stored(mb), query(t, st, keys[2:])[0], "page 2 is stored in layout B")
	})
}
