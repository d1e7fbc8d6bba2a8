package reshard_test

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
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

// metaStore wraps a store: it counts PutMeta calls, fails them with
// putErr when set, and hides the metadata objects it is told to forget
// until PutMeta stores them again, as a store that evicted them would (the
// memory store has no way to delete one from outside).
type metaStore struct {
	store.Store
	mu     sync.Mutex
	puts   int
	gone   map[string]bool
	putErr error
}

func (s *metaStore) PutMeta(ctx context.Context, key string, val []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.puts++
	if s.putErr != nil {
		return s.putErr
	}
	err := s.Store.PutMeta(ctx, key, val)
	if err == nil {
		delete(s.gone, key)
	}
	return err
}

func (s *metaStore) GetMeta(ctx context.Context, key string) ([]byte, error) {
	s.mu.Lock()
	gone := s.gone[key]
	s.mu.Unlock()
	if gone {
		return nil, store.ErrNotFound
	}
	return s.Store.GetMeta(ctx, key)
}

// Puts returns the number of PutMeta calls so far.
func (s *metaStore) Puts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.puts
}

// forget hides the metadata object key until it is stored again.
func (s *metaStore) forget(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone == nil {
		s.gone = map[string]bool{}
	}
	s.gone[key] = true
}

// deleteManifest deletes manifest m from the store where b keeps it: the
// file <dir>/meta/<h>/<name> of a file store (found by its bytes), the key
// meta:<manifest key> on Redis; from a memory store, ms forgets it.
func deleteManifest(t testing.TB, b backend, ms *metaStore, m *manifest.Manifest) {
	t.Helper()
	switch b.name {
	case "mem":
		ms.forget(m.Key())
	case "file":
		var found []string
		require.NoError(t, filepath.WalkDir(filepath.Join(b.dir, "meta"), func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			f, err := os.ReadFile(path)
			if err == nil && bytes.Equal(f, m.Encode()) {
				found = append(found, path)
			}
			return err
		}))
		require.Len(t, found, 1, "files holding manifest %s", m.Key())
		require.NoError(t, os.Remove(found[0]))
	case "redis":
		n, err := b.srv.Do("DEL", "meta:"+m.Key())
		require.NoError(t, err)
		require.Equal(t, int64(1), n, "DEL meta:%s", m.Key())
	default:
		t.Fatalf("backend %s", b.name)
	}
	_, err := ms.GetMeta(context.Background(), m.Key())
	require.ErrorIs(t, err, store.ErrNotFound)
}

// rankWriter is one rank's long-lived writer, with a pool that holds page
// keys[i] at slot i.
type rankWriter struct {
	rank    placement.Rank
	w       *reshard.Writer
	regions [][]byte
}

// newRankWriters returns a writer for each rank of topo in manifest m, each
// published once, from pools of layout poolName holding keys' content.
func newRankWriters(t testing.TB, st store.Store, m *manifest.Manifest, topo placement.Topology, poolName string, keys []string) []rankWriter {
	t.Helper()
	d := &m.Descriptor
	var out []rankWriter
	for _, r := range topo.Ranks() {
		part, writes, err := topo.Writer(d, r)
		require.NoError(t, err)
		b, err := plan.BindingFor(d, topo, r, builtin(t, poolName), len(keys))
		require.NoError(t, err)
		w, err := reshard.NewWriter(st, m, part, writes, b)
		require.NoError(t, err)
		require.NoError(t, w.Publish(context.Background()))
		regions := w.Geometry().NewRegions()
		for i, k := range keys {
			content.Fill(w.Geometry(), regions, i, content.Seed(k))
		}
		out = append(out, rankWriter{rank: r, w: w, regions: regions})
	}
	return out
}

// writeBatch writes keys[from:to] with every writer, rank after rank, and
// returns the results of each rank's Write.
func writeBatch(t testing.TB, ws []rankWriter, keys []string, from, to int) [][]reshard.PageResult {
	t.Helper()
	slots := make([]int, 0, to-from)
	for i := from; i < to; i++ {
		slots = append(slots, i)
	}
	var out [][]reshard.PageResult
	for _, rw := range ws {
		res, err := rw.w.Write(context.Background(), keys[from:to], slots, rw.regions)
		require.NoError(t, err, "rank %v", rw.rank)
		out = append(out, res)
	}
	return out
}

// requireStatus requires every page of every rank's results to have status
// want, without an error.
func requireStatus(t testing.TB, results [][]reshard.PageResult, want reshard.Status) {
	t.Helper()
	for r, res := range results {
		for i, pr := range res {
			require.NoError(t, pr.Err, "writer %d page %d", r, i)
			require.Equal(t, want, pr.Status, "writer %d page %d (%s)", r, i, pr.Key)
		}
	}
}

// TestWriterRepublishes: a manifest deleted from the store under live
// writers makes its pages misses (not rejections) for readers that do not
// hold it already, and the next Write of
// the layout stores it again, one PutMeta a Write call, whether it writes
// new pages or finds its pages complete; then every page of the layout,
// old and new, reads byte-exact, with the reader that missed too.
func TestWriterRepublishes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		ms := &metaStore{Store: b.st}
		m := manifestOf(t, small, tp2pp2, builtin(t, "PLHD"))
		keys := content.PageKeys("republish-"+b.name, small.Domain(), 6)
		ws := newRankWriters(t, ms, m, tp2pp2, "page_first", keys)
		requireStatus(t, writeBatch(t, ws, keys, 0, 3), reshard.Written)
		warm, wregions := newReader(t, ms, small, tp2pp2, placement.Rank{PP: 1}, "layer_first", 6, reshard.ReaderOptions{})
		readAll(t, warm, keys[:3], iota(3), wregions)

		deleteManifest(t, b, ms, m)
		// A reader that holds the manifest (its cache) still reads.
		readAll(t, warm, keys[:3], []int{5, 4, 3}, wregions)
		rd, regions := newReader(t, ms, small, tp1pp3, placement.Rank{PP: 1}, "page_first", 6, reshard.ReaderOptions{})
		before := clone(regions)
		res, err := rd.Read(ctx, keys[:3], iota(3), regions)
		require.NoError(t, err)
		require.EqualError(t, res.Stop, fmt.Sprintf("page %s: page missing or incomplete: manifest %s is not in the store", keys[0], m.Key()))
		require.Equal(t, reshard.StopMiss, reshard.Classify(res.Stop))
		require.Zero(t, res.Hit)
		checkPool(t, rd.Geometry(), before, regions, keys, iota(3), 0)
		n, err := rd.Exists(ctx, keys[:3])
		require.NoError(t, err, "a miss")
		require.Zero(t, n)
		require.Zero(t, rd.Stats().ManifestsRejected)

		// New pages: each rank's Write stores the manifest again.
		puts := ms.Puts()
		requireStatus(t, writeBatch(t, ws, keys, 3, 6), reshard.Written)
		require.Equal(t, len(ws), ms.Puts()-puts, "one PutMeta a Write")
		got, err := ms.GetMeta(ctx, m.Key())
		require.NoError(t, err)
		require.Equal(t, m.Encode(), got)
		readAll(t, rd, keys, iota(6), regions)

		// Only complete pages of its own: the same.
		deleteManifest(t, b, ms, m)
		fresh, fregions := newReader(t, ms, small, tp2pp2, placement.Rank{TP: 1}, "page_first", 6, reshard.ReaderOptions{})
		res, err = fresh.Read(ctx, keys, iota(6), fregions)
		require.NoError(t, err)
		require.Equal(t, reshard.StopMiss, reshard.Classify(res.Stop), "%v", res.Stop)
		puts = ms.Puts()
		requireStatus(t, writeBatch(t, ws, keys, 0, 6), reshard.Complete)
		require.Equal(t, len(ws), ms.Puts()-puts, "one PutMeta a Write")
		got, err = ms.GetMeta(ctx, m.Key())
		require.NoError(t, err)
		require.Equal(t, m.Encode(), got)
		readAll(t, fresh, keys, iota(6), fregions)
		rd3, regions3 := newReader(t, ms, small, tp4pp1, placement.Rank{TP: 3}, "layer_first", 6, reshard.ReaderOptions{CheckParts: true})
		readAll(t, rd3, keys, iota(6), regions3)
	})
}

// TestWriterRepublishOnlyForItsPages: a Write whose pages are all complete
// under another manifest, refused, or replicas sends no PutMeta; one with
// a page of its own among them sends one.
func TestWriterRepublishOnlyForItsPages(t *testing.T) {
	ctx := context.Background()
	ms := &metaStore{Store: memstore.New()}
	mine := manifestOf(t, small, tp2pp2, builtin(t, "PLHD"))
	other := manifestOf(t, small, tp1pp3, builtin(t, "LPHD"))
	keys := content.PageKeys("republish-only", small.Domain(), 4)
	writeAll(t, ms, small, tp1pp3, "LPHD", keys[:2])                                      // complete, another layout
	writeRanks(t, ms, other, tp1pp3, []placement.Rank{{PP: 0}}, "layer_first", keys[2:3]) // being written in another layout
	ws := newRankWriters(t, ms, mine, tp2pp2, "page_first", keys)
	w := ws[0]
	puts := ms.Puts()
	res, err := w.w.Write(ctx, keys[:2], iota(2), w.regions)
	require.NoError(t, err)
	require.Equal(t, []reshard.PageResult{{Key: keys[0], Status: reshard.Complete}, {Key: keys[1], Status: reshard.Complete}}, res)
	res, err = w.w.Write(ctx, keys[2:3], []int{2}, w.regions)
	require.NoError(t, err)
	require.Equal(t, reshard.Refused, res[0].Status)
	require.Equal(t, puts, ms.Puts(), "no page of its own: no PutMeta")

	part, _, err := tp2pp2.Writer(&small.Descriptor, placement.Rank{})
	require.NoError(t, err)
	b, err := plan.BindingFor(&small.Descriptor, tp2pp2, placement.Rank{}, builtin(t, "page_first"), 4)
	require.NoError(t, err)
	rep, err := reshard.NewWriter(ms, mine, part, false, b)
	require.NoError(t, err)
	_, err = rep.Write(ctx, keys, iota(4), rep.Geometry().NewRegions())
	require.NoError(t, err)
	require.Equal(t, puts, ms.Puts(), "a replica: no PutMeta")

	res, err = w.w.Write(ctx, keys, iota(4), w.regions)
	require.NoError(t, err)
	var got []reshard.Status
	for _, r := range res {
		got = append(got, r.Status)
	}
	require.Equal(t, []reshard.Status{reshard.Complete, reshard.Complete, reshard.Refused, reshard.Written}, got)
	require.Equal(t, puts+1, ms.Puts(), "one PutMeta for the batch")
}

// TestWriterRepublishFails: when the manifest cannot be stored again, the
// pages that needed it are Failed with the error: those written, and those
// complete under the writer's manifest; a page complete under another
// manifest stays Complete. The counters say so.
func TestWriterRepublishFails(t *testing.T) {
	ctx := context.Background()
	ms := &metaStore{Store: memstore.New()}
	mine := manifestOf(t, small, tp2pp2, builtin(t, "PLHD"))
	keys := content.PageKeys("republish-fails", small.Domain(), 4)
	writeAll(t, ms, small, tp1pp3, "LPHD", keys[:1]) // another layout
	writeAll(t, ms, small, tp2pp2, "PLHD", keys[1:2])
	ws := newRankWriters(t, ms, mine, tp2pp2, "page_first", keys)
	w := ws[1]
	ms.putErr = errLinkDown
	res, err := w.w.Write(ctx, keys, iota(4), w.regions)
	require.NoError(t, err)
	want := fmt.Errorf("publish manifest %s: link down", mine.Key())
	require.Len(t, res, 4)
	require.Equal(t, reshard.PageResult{Key: keys[0], Status: reshard.Complete}, res[0])
	for i := 1; i < 4; i++ {
		require.Equal(t, keys[i], res[i].Key)
		require.Equal(t, reshard.Failed, res[i].Status, "page %d", i)
		require.EqualError(t, res[i].Err, want.Error(), "page %d", i)
		require.ErrorIs(t, res[i].Err, errLinkDown)
	}
	require.Equal(t, reshard.WriterStats{Requests: 1, Pages: 4, Complete: 1, Failed: 3}, w.w.Stats())

	// The parts are stored: once the manifest can be stored, the pages
	// are complete and counted.
	ms.putErr = nil
	res, err = w.w.Write(ctx, keys, iota(4), w.regions)
	require.NoError(t, err)
	for i, r := range res {
		require.NoError(t, r.Err)
		require.Equal(t, []reshard.Status{reshard.Complete, reshard.Complete, reshard.Written, reshard.Written}[i], r.Status, "page %d", i)
	}
	part, _, err := tp2pp2.Writer(&small.Descriptor, w.rank)
	require.NoError(t, err)
	require.Equal(t, reshard.WriterStats{Requests: 2, Pages: 8, Complete: 3, Written: 2, Failed: 3, Bytes: int64(2 * mine.PartBytes(part))}, w.w.Stats())
}
