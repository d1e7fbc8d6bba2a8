package reshard_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/internal/redistest"
	"github.com/kvreshard/kvreshard/runtime/partsum"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/reshard"
	"github.com/kvreshard/kvreshard/runtime/store"
	"github.com/kvreshard/kvreshard/runtime/store/filestore"
	"github.com/kvreshard/kvreshard/runtime/store/memstore"
)

// TestObjectErrStopsAtBadPage: a query that reports one object as
// unreadable (Object.Err) stops the read at that page, a store failure and
// not a miss; the pages before it are read.
func TestObjectErrStopsAtBadPage(t *testing.T) {
	forEachStore(t, func(t *testing.T, st store.Store) {
		keys := content.PageKeys("objerr", small.Domain(), 4)
		writeAll(t, st, small, tp2pp2, "PLHD", keys)
		errClaim := errors.New("claim is not a part count and a manifest key")
		for _, bad := range [][]int{{3}, {0}, {1, 3}} {
			t.Run(fmt.Sprint(bad), func(t *testing.T) {
				sp := newSpy(st)
				sp.query = func(ctx context.Context, ks []string) ([]store.Object, error) {
					objs, err := st.Query(ctx, ks)
					for _, i := range bad {
						objs[i] = store.Object{Err: errClaim}
					}
					return objs, err
				}
				rd, regions := newReader(t, sp, small, tp1pp3, placement.Rank{PP: 1}, "page_first", 4, reshard.ReaderOptions{})
				before := clone(regions)
				slots := []int{1, 3, 0, 2}
				res, err := rd.Read(context.Background(), keys, slots, regions)
				require.NoError(t, err)
				hit := bad[0]
				require.EqualError(t, res.Stop, fmt.Sprintf("page %s: claim is not a part count and a manifest key", keys[hit]))
				require.ErrorIs(t, res.Stop, errClaim)
				require.NotErrorIs(t, res.Stop, reshard.ErrMiss)
				require.Equal(t, reshard.StopFailed, reshard.Classify(res.Stop))
				require.Equal(t, hit, res.Hit)
				checkPool(t, rd.Geometry(), before, regions, keys, slots, hit)

				n, err := rd.Exists(context.Background(), keys)
				require.Equal(t, hit, n)
				require.EqualError(t, err, res.Stop.Error())
			})
		}
	})
}

// TestGarbageClaimOnFile: on the file store, a claim file that holds
// garbage makes its page a failed page of the query; the pages before it
// are read.
func TestGarbageClaimOnFile(t *testing.T) {
	b := backend{name: "file", dir: t.TempDir()}
	b.st = reopen(t, b)
	{
		keys := content.PageKeys("garbage", small.Domain(), 4)
		writeAll(t, b.st, small, tp2pp2, "PLHD", keys[:3])
		claims := files(t, b.dir, "claim")
		writeAll(t, b.st, small, tp2pp2, "PLHD", keys[3:])
		var claim string
		for _, f := range files(t, b.dir, "claim") {
			if !slices.Contains(claims, f) {
				require.Empty(t, claim, "one new claim")
				claim = f
			}
		}
		require.NoError(t, os.WriteFile(claim, []byte("\x00\x01garbage"), 0o644))
		// The store caches what it learned of complete objects: a new one
		// over the same directory reads the claim again.
		st2 := reopen(t, b)
		rd, regions := newReader(t, st2, small, tp2pp2, placement.Rank{TP: 1}, "page_first", 4, reshard.ReaderOptions{})
		before := clone(regions)
		res, err := rd.Read(context.Background(), keys, iota(4), regions)
		require.NoError(t, err)
		require.Equal(t, 3, res.Hit)
		require.Error(t, res.Stop)
		require.True(t, strings.HasPrefix(res.Stop.Error(), "page "+keys[3]+": "), res.Stop.Error())
		require.Contains(t, res.Stop.Error(), claim, "the error names the bad file")
		require.Equal(t, reshard.StopFailed, reshard.Classify(res.Stop), "%v", res.Stop)
		checkPool(t, rd.Geometry(), before, regions, keys, iota(4), 3)
	}
}

// reopen opens a new file store over b's directory.
func reopen(t testing.TB, b backend) store.Store {
	t.Helper()
	st, err := filestore.Open(b.dir, filestore.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	return st
}

// TestWrongTypeClaimOnRedis: on Redis, a page whose meta key holds a value
// of the wrong type is a failed page of the query; the pages before it are
// read.
func TestWrongTypeClaimOnRedis(t *testing.T) {
	srv := redistest.StartServer(t)
	st, err := store.Open(context.Background(), srv.URL())
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	keys := content.PageKeys("wrongtype", small.Domain(), 4)
	writeAll(t, st, small, tp2pp2, "PLHD", keys)
	c := redisClient(t, srv)
	meta := "{" + keys[3] + "}:3:meta" // redisstore's key of a page's claim
	ctx := context.Background()
	n, err := c.Do(ctx, c.B().Del().Key(meta).Build()).AsInt64()
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.NoError(t, c.Do(ctx, c.B().Set().Key(meta).Value("garbage").Build()).Error())

	rd, regions := newReader(t, st, small, tp2pp2, placement.Rank{TP: 1, PP: 1}, "page_first", 4, reshard.ReaderOptions{})
	before := clone(regions)
	res, err := rd.Read(ctx, keys, iota(4), regions)
	require.NoError(t, err)
	require.Equal(t, 3, res.Hit)
	require.True(t, strings.HasPrefix(res.Stop.Error(), "page "+keys[3]+": "), res.Stop.Error())
	require.Equal(t, reshard.StopFailed, reshard.Classify(res.Stop), "%v", res.Stop)
	checkPool(t, rd.Geometry(), before, regions, keys, iota(4), 3)
}

// files returns the regular files named name under dir.
func files(t testing.TB, dir, name string) []string {
	t.Helper()
	var out []string
	require.NoError(t, filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && d.Name() == name {
			out = append(out, path)
		}
		return err
	}))
	return out
}

// TestVanishedPartIsMiss: a part gone between the query and the read
// (evicted) makes its page a miss, for parts lent by the store as for
// range reads; the pages before it are read.
func TestVanishedPartIsMiss(t *testing.T) {
	t.Run("view", func(t *testing.T) {
		st := memstore.New()
		keys := content.PageKeys("vanished-view", small.Domain(), 3)
		writeAll(t, st, small, tp4pp1, "PLHD", keys)
		vs := newViewSpy(st)
		vs.viewPart = func(ctx context.Context, key string, part int, manifest string) ([]byte, error) {
			if key == keys[1] && part == 1 {
				return nil, &store.RangeError{Key: key, Part: part, Len: 2304, Err: store.ErrNotFound}
			}
			return st.ViewPart(ctx, key, part, manifest)
		}
		rd, regions := newReader(t, vs, small, tp2pp2, placement.Rank{}, "page_first", 3, reshard.ReaderOptions{Plan: plan.Options{Strategy: plan.Staged}})
		before := clone(regions)
		res, err := rd.Read(context.Background(), keys, iota(3), regions)
		require.NoError(t, err)
		require.EqualError(t, res.Stop, fmt.Sprintf("page missing or incomplete: %s: read %s part 1 [0,2304): not found", keys[1], keys[1]))
		require.ErrorIs(t, res.Stop, reshard.ErrMiss)
		require.Equal(t, 1, res.Hit)
		checkPool(t, rd.Geometry(), before, regions, keys, iota(3), 1)
	})
	t.Run("redis", func(t *testing.T) {
		forEachBackend(t, func(t *testing.T, b backend) {
			if b.name != "redis" {
				return
			}
			keys := content.PageKeys("vanished-redis", small.Domain(), 3)
			writeAll(t, b.st, small, tp4pp1, "PLHD", keys)
			for _, opts := range []reshard.ReaderOptions{{}, {CheckParts: true}} {
				sp := newSpy(b.st)
				sp.query = func(ctx context.Context, ks []string) ([]store.Object, error) {
					objs, err := b.st.Query(ctx, ks)
					require.True(t, objs[2].Complete)
					deleteStored(t, b.srv, keys[2], 1) // evicted after the query
					return objs, err
				}
				rd, regions := newReader(t, sp, small, tp2pp2, placement.Rank{}, "page_first", 3, opts)
				before := clone(regions)
				res, err := rd.Read(context.Background(), keys, iota(3), regions)
				require.NoError(t, err)
				require.ErrorIs(t, res.Stop, reshard.ErrMiss)
				require.ErrorIs(t, res.Stop, store.ErrNotFound)
				// The store checks the page before reading any part of it.
				require.Contains(t, res.Stop.Error(), "page missing or incomplete: "+keys[2]+": read "+keys[2]+" part ")
				require.Equal(t, 2, res.Hit)
				checkPool(t, rd.Geometry(), before, regions, keys, iota(3), 2)
				// The read's state check deleted the page, which had
				// lost a part: written again whole for the next reader.
				writeRanks(t, b.st, manifestOf(t, small, tp4pp1, builtin(t, "PLHD")), tp4pp1, tp4pp1.Ranks(), "page_first", keys)
			}
		})
	})
}

// TestQueryBatches: a long request is queried 256 keys at a time, and
// querying stops at the batch of the first page that is not complete.
func TestQueryBatches(t *testing.T) {
	st := memstore.New()
	keys := content.PageKeys("batches", small.Domain(), 1000)
	writeAll(t, st, small, tp2pp2, "PLHD", keys[:300])
	r := placement.Rank{PP: 1}
	for _, c := range []struct {
		pages, hit int
		queries    []int // keys of each Query call
	}{
		{pages: 1000, hit: 300, queries: []int{256, 256}},
		{pages: 300, hit: 300, queries: []int{256, 44}},
		{pages: 256, hit: 256, queries: []int{256}},
		{pages: 3, hit: 3, queries: []int{3}},
	} {
		t.Run(fmt.Sprint(c.pages), func(t *testing.T) {
			sp := newSpy(st)
			var got []int
			sp.query = func(ctx context.Context, ks []string) ([]store.Object, error) {
				got = append(got, len(ks))
				return st.Query(ctx, ks)
			}
			rd, regions := newReader(t, sp, small, tp1pp3, r, "page_first", c.pages, reshard.ReaderOptions{})
			before := clone(regions)
			res, err := rd.Read(context.Background(), keys[:c.pages], iota(c.pages), regions)
			require.NoError(t, err)
			require.NoError(t, err)
			require.Equal(t, c.hit, res.Hit)
			if c.hit < c.pages {
				require.EqualError(t, res.Stop, "page missing or incomplete: "+keys[c.hit])
			} else {
				require.NoError(t, res.Stop)
			}
			require.Equal(t, c.queries, got)
			require.Equal(t, len(c.queries), sp.Calls("Query"))
			if c.pages < 10 {
				checkPool(t, rd.Geometry(), before, regions, keys, iota(c.pages), c.hit)
			} else {
				for _, i := range []int{0, 255, c.hit - 1} {
					require.NoError(t, verifyPage(rd, regions, i, keys[i]), "page %d", i)
				}
			}

			got = nil
			n, err := rd.Exists(context.Background(), keys[:c.pages])
			require.NoError(t, err)
			require.Equal(t, c.hit, n)
			require.Equal(t, c.queries, got)
		})
	}

	// A request of 200000 pages whose page 10 is missing: one query.
	long := content.PageKeys("batches-long", small.Domain(), 11)
	writeAll(t, st, small, tp2pp2, "PLHD", long[:10])
	for i := len(long); i < 200000; i++ {
		long = append(long, fmt.Sprintf("batches-long-%d", i))
	}
	sp := newSpy(st)
	rd, _ := newReader(t, sp, small, tp1pp3, r, "page_first", 1, reshard.ReaderOptions{})
	n, err := rd.Exists(context.Background(), long)
	require.NoError(t, err)
	require.Equal(t, 10, n)
	require.Equal(t, 1, sp.Calls("Query"))

	// A query that fails after the first batch: the pages of the first are
	// still read.
	sp = newSpy(st)
	sp.query = func(ctx context.Context, ks []string) ([]store.Object, error) {
		if ks[0] != keys[0] {
			return nil, errLinkDown
		}
		return st.Query(ctx, ks)
	}
	rd, regions := newReader(t, sp, small, tp1pp3, r, "page_first", 300, reshard.ReaderOptions{})
	res, err := rd.Read(context.Background(), keys[:300], iota(300), regions)
	require.NoError(t, err)
	require.EqualError(t, res.Stop, "query: link down")
	require.Equal(t, reshard.StopFailed, reshard.Classify(res.Stop))
	require.Equal(t, 256, res.Hit)
	for _, i := range []int{0, 255} {
		require.NoError(t, verifyPage(rd, regions, i, keys[i]))
	}
	n, err = rd.Exists(context.Background(), keys[:300])
	require.EqualError(t, err, "query: link down")
	require.Equal(t, 256, n)

	// A store that answers with the wrong number of objects.
	sp.query = func(ctx context.Context, ks []string) ([]store.Object, error) { return make([]store.Object, 1), nil }
	res, err = rd.Read(context.Background(), keys[:3], iota(3), regions)
	require.NoError(t, err)
	require.EqualError(t, res.Stop, "query: store returned 1 objects for 3 keys")
	require.Equal(t, 0, res.Hit)
}

// TestExists counts the leading readable pages: nil for a miss, the
// reason otherwise.
func TestExists(t *testing.T) {
	forEachStore(t, func(t *testing.T, st store.Store) {
		keys := content.PageKeys("exists", small.Domain(), 5)
		writeAll(t, st, small, tp2pp2, "PLHD", keys[:2])
		unpublished := manifestOf(t, small, tp1pp3, builtin(t, "LPHD"))
		writeObject(t, st, keys[2], unpublished.Key(), partSizes(unpublished))
		writeAll(t, st, small, tp2pp2, "PLHD", keys[3:4])
		rd, _ := newReader(t, st, small, tp1pp3, placement.Rank{}, "page_first", 1, reshard.ReaderOptions{})
		ctx := context.Background()

		n, err := rd.Exists(ctx, keys[:2])
		require.NoError(t, err)
		require.Equal(t, 2, n)
		n, err = rd.Exists(ctx, keys[3:])
		require.NoError(t, err, "a miss is not an error")
		require.Equal(t, 1, n)
		n, err = rd.Exists(ctx, nil)
		require.NoError(t, err)
		require.Zero(t, n)
		n, err = rd.Exists(ctx, keys)
		require.NoError(t, err, "a page whose manifest is not in the store is a miss")
		require.Equal(t, 2, n)
		// A manifest of another model is a rejection.
		other := newModel("other", 6, 4, []int{16, 8}, "bf16", 8)
		foreign := manifestOf(t, other, tp2pp2, builtin(t, "PLHD"))
		require.NoError(t, reshard.Publish(ctx, st, foreign))
		bad := content.PageKeys("exists-foreign", small.Domain(), 1)[0]
		writeObject(t, st, bad, foreign.Key(), partSizes(foreign))
		n, err = rd.Exists(ctx, []string{keys[0], keys[1], bad, keys[3]})
		require.EqualError(t, err, fmt.Sprintf("page %s: manifest rejected: %s: manifest belongs to model domain %s, not %s", bad, foreign.Key(), other.Domain(), small.Domain()))
		require.ErrorIs(t, err, reshard.ErrManifest)
		require.Equal(t, reshard.StopRejected, reshard.Classify(err))
		require.Equal(t, 2, n)

		// A layout the reader cannot plan is a rejection too.
		strict, _ := newReader(t, st, small, tp1pp3, placement.Rank{}, "page_first", 1, reshard.ReaderOptions{Plan: plan.Options{MaxOps: 1}})
		n, err = strict.Exists(ctx, keys)
		require.ErrorIs(t, err, plan.ErrLimit)
		require.ErrorIs(t, err, reshard.ErrManifest)
		require.Equal(t, reshard.StopRejected, reshard.Classify(err))
		require.Zero(t, n)

		cctx, cancel := context.WithCancel(ctx)
		cancel()
		n, err = rd.Exists(cctx, keys)
		require.ErrorIs(t, err, context.Canceled)
		require.Equal(t, reshard.StopCanceled, reshard.Classify(err))
		require.Zero(t, n)
	})
}

// TestClassify sorts every kind of Result.Stop.
func TestClassify(t *testing.T) {
	for _, c := range []struct {
		err  error
		want reshard.StopReason
	}{
		{nil, reshard.StopNone},
		{fmt.Errorf("%w: k", reshard.ErrMiss), reshard.StopMiss},
		{fmt.Errorf("%w: k: %w", reshard.ErrMiss, store.ErrNotFound), reshard.StopMiss},
		{fmt.Errorf("%w: 2 pages", reshard.ErrBudget), reshard.StopBudget},
		{context.Canceled, reshard.StopCanceled},
		{fmt.Errorf("page k: %w", context.DeadlineExceeded), reshard.StopCanceled},
		{fmt.Errorf("page k: %w: m: not found", reshard.ErrManifest), reshard.StopRejected},
		{fmt.Errorf("page k: part 1: %w", partsum.ErrMismatch), reshard.StopChecksum},
		{fmt.Errorf("page k: %w", errLinkDown), reshard.StopFailed},
		{store.ErrNotFound, reshard.StopFailed},
	} {
		require.Equal(t, c.want, reshard.Classify(c.err), "%v", c.err)
	}
	require.Equal(t, "checksum", reshard.StopChecksum.String())
	require.Equal(t, "stop(9)", reshard.StopReason(9).String())
}

// TestWriterStats counts a writer's pages by status and the bytes it wrote.
func TestWriterStats(t *testing.T) {
	st := memstore.New()
	keys := content.PageKeys("wstats", small.Domain(), 4)
	m := manifestOf(t, small, tp2pp2, builtin(t, "PLHD"))
	other := manifestOf(t, small, tp1pp3, builtin(t, "LPHD"))
	writeAll(t, st, small, tp2pp2, "PLHD", keys[:1])                                      // complete
	writeRanks(t, st, other, tp1pp3, []placement.Rank{{PP: 0}}, "layer_first", keys[1:2]) // another layout
	newWriter := func(s store.Store, part int, writes bool) (*reshard.Writer, [][]byte) {
		b, err := plan.BindingFor(&small.Descriptor, tp2pp2, placement.Rank{TP: 1, PP: 1}, builtin(t, "page_first"), 4)
		require.NoError(t, err)
		w, err := reshard.NewWriter(s, m, part, writes, b)
		require.NoError(t, err)
		require.NoError(t, w.Publish(context.Background()))
		regions := w.Geometry().NewRegions()
		for i, k := range keys {
			content.Fill(w.Geometry(), regions, i, content.Seed(k))
		}
		return w, regions
	}
	part, _, err := tp2pp2.Writer(&small.Descriptor, placement.Rank{TP: 1, PP: 1})
	require.NoError(t, err)
	sp := newSpy(st)
	w, regions := newWriter(sp, part, true)
	res, err := w.Write(context.Background(), keys, iota(4), regions)
	require.NoError(t, err)
	var got []reshard.Status
	for _, r := range res {
		got = append(got, r.Status)
	}
	require.Equal(t, []reshard.Status{reshard.Complete, reshard.Refused, reshard.Written, reshard.Written}, got)
	_, err = w.Write(context.Background(), keys, iota(3), regions)
	require.EqualError(t, err, "4 keys but 3 slots")
	sp.query = func(context.Context, []string) ([]store.Object, error) { return nil, errLinkDown }
	_, err = w.Write(context.Background(), keys[:3], iota(3), regions)
	require.EqualError(t, err, "query: link down")
	require.Equal(t, reshard.WriterStats{Requests: 2, Pages: 7, Written: 2, Complete: 1, Refused: 1, Failed: 3, Bytes: int64(2 * m.PartBytes(part))}, w.Stats())

	rep, regions := newWriter(st, part, false)
	_, err = rep.Write(context.Background(), keys[:2], iota(2), regions)
	require.NoError(t, err)
	require.Equal(t, reshard.WriterStats{Requests: 1, Pages: 2, Replica: 2}, rep.Stats())
}
