package reshard_test

import (
	"bytes"
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/internal/content"
	_ "github.com/kvreshard/kvreshard/layouts"
	"github.com/kvreshard/kvreshard/runtime/kernel"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/reshard"
	"github.com/kvreshard/kvreshard/runtime/store"
	"github.com/kvreshard/kvreshard/runtime/store/filestore"
	"github.com/kvreshard/kvreshard/runtime/store/memstore"
)

// newModel returns a model with layers 0..layers-1.
func newModel(name string, layers, heads int, dims []int, dtype string, page int) manifest.Model {
	d := manifest.Descriptor{KVHeads: heads, HeadDims: dims, Dtype: dtype, PageSize: page}
	d.ItemSize, _ = manifest.ItemSizeOf(dtype)
	for i := range layers {
		d.Layers = append(d.Layers, i)
	}
	return manifest.Model{Namespace: "test", ModelID: name, Revision: "1", Descriptor: d}
}

// small is the model of most tests: 6 layers, 4 KV heads, K and V head dims
// that differ, bf16, 8 tokens a page (9216 bytes a page).
var small = newModel("small", 6, 4, []int{16, 8}, "bf16", 8)

var (
	tp2pp2 = placement.Topology{TP: 2, PP: 2}
	tp1pp3 = placement.Topology{TP: 1, PP: 3}
	tp4pp1 = placement.Topology{TP: 4, PP: 1}
)

// forEachStore runs f on a new memstore and on a new filestore.
func forEachStore(t *testing.T, f func(t *testing.T, st store.Store)) {
	t.Run("mem", func(t *testing.T) { f(t, memstore.New()) })
	t.Run("file", func(t *testing.T) {
		st, err := filestore.Open(t.TempDir(), filestore.Options{})
		require.NoError(t, err)
		t.Cleanup(func() { st.Close() })
		f(t, st)
	})
}

func builtin(t testing.TB, name string) *ir.Layout {
	t.Helper()
	l, err := kernel.LayoutNamed(name)
	require.NoError(t, err)
	return l
}

func manifestOf(t testing.TB, mo manifest.Model, topo placement.Topology, l *ir.Layout) *manifest.Manifest {
	t.Helper()
	m, err := plan.ManifestFor(mo.Domain(), &mo.Descriptor, topo, l)
	require.NoError(t, err)
	return m
}

func iota(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// writeRanks writes keys as the ranks of topo in part layout m, each rank
// from a pool of layout poolName filled with the pages' content at slots
// 0..n-1, and returns each rank's statuses.
func writeRanks(t testing.TB, st store.Store, m *manifest.Manifest, topo placement.Topology, ranks []placement.Rank, poolName string, keys []string) map[placement.Rank][]reshard.Status {
	t.Helper()
	d := &m.Descriptor
	out := map[placement.Rank][]reshard.Status{}
	for _, r := range ranks {
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
		res, err := w.Write(context.Background(), keys, iota(len(keys)), regions)
		require.NoError(t, err)
		for i, pr := range res {
			require.Equal(t, keys[i], pr.Key)
			if pr.Status == reshard.Failed {
				require.NoError(t, pr.Err)
			}
			out[r] = append(out[r], pr.Status)
		}
	}
	return out
}

// writeAll writes keys with every rank of topo in part layout l, from SGLang
// pools of the matching layout, and returns the manifest.
func writeAll(t testing.TB, st store.Store, mo manifest.Model, topo placement.Topology, l string, keys []string) *manifest.Manifest {
	t.Helper()
	m := manifestOf(t, mo, topo, builtin(t, l))
	pool := map[string]string{"PLHD": "page_first", "LPHD": "layer_first", "HPLD": "page_head"}[l]
	for r, ss := range writeRanks(t, st, m, topo, topo.Ranks(), pool, keys) {
		_, writes, _ := topo.Writer(&m.Descriptor, r)
		for i, s := range ss {
			if writes {
				require.Equal(t, reshard.Written, s, "rank %v page %d", r, i)
			} else {
				require.Equal(t, reshard.Replica, s, "rank %v page %d", r, i)
			}
		}
	}
	return m
}

// newReader returns a reader of rank r of topo into a pool of layout
// poolName with slots pages, and its regions filled with a sentinel byte.
func newReader(t testing.TB, st store.Store, mo manifest.Model, topo placement.Topology, r placement.Rank, poolName string, slots int, opts reshard.ReaderOptions) (*reshard.Reader, [][]byte) {
	t.Helper()
	b, err := plan.BindingFor(&mo.Descriptor, topo, r, builtin(t, poolName), slots)
	require.NoError(t, err)
	rd, err := reshard.NewReader(st, mo.Domain(), &mo.Descriptor, b, opts)
	require.NoError(t, err)
	regions := rd.Geometry().NewRegions()
	for _, reg := range regions {
		for i := range reg {
			reg[i] = 0xa5
		}
	}
	return rd, regions
}

// readAll reads keys into slots with rd, requires every page read, and
// checks every byte of the pool (checkPool).
func readAll(t testing.TB, rd *reshard.Reader, keys []string, slots []int, regions [][]byte) reshard.Result {
	t.Helper()
	before := clone(regions)
	res, err := rd.Read(context.Background(), keys, slots, regions)
	require.NoError(t, err)
	require.NoError(t, res.Stop)
	require.Equal(t, len(keys), res.Hit)
	checkPool(t, rd.Geometry(), before, regions, keys, slots, res.Hit)
	return res
}

func clone(regions [][]byte) [][]byte {
	out := make([][]byte, len(regions))
	for i, r := range regions {
		out[i] = bytes.Clone(r)
	}
	return out
}

// slotSpans returns the spans [lo,hi) of each region that hold the page at
// slot s.
func slotSpans(g *plan.Geometry, s int) [][][2]int {
	out := make([][][2]int, len(g.Regions))
	for r := range g.Regions {
		for b := 0; b < g.Blocks[r]; b++ {
			lo := b*g.BlockStride[r] + s*g.SlotStride[r]
			out[r] = append(out[r], [2]int{lo, lo + g.BlockBytes[r]})
		}
	}
	return out
}

// checkPool checks a pool after a read that reported hit pages: the pages
// keys[:hit] at slots[:hit] verify, and no other byte differs from before.
func checkPool(t testing.TB, g *plan.Geometry, before, after [][]byte, keys []string, slots []int, hit int) {
	t.Helper()
	for i := 0; i < hit; i++ {
		require.NoError(t, content.Verify(g, after, slots[i], content.Seed(keys[i])), "page %d", i)
	}
	want := clone(before)
	for i := 0; i < hit; i++ {
		for r, spans := range slotSpans(g, slots[i]) {
			for _, sp := range spans {
				copy(want[r][sp[0]:sp[1]], after[r][sp[0]:sp[1]])
			}
		}
	}
	for r := range want {
		if i := firstDiff(want[r], after[r]); i >= 0 {
			t.Fatalf("region %s byte %d changed from %#x to %#x, outside the pages read", g.RegionNames[r], i, want[r][i], after[r][i])
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// spy wraps a store, counts its calls, and lets a test replace Query and
// ReadRanges.
type spy struct {
	store.Store
	mu    sync.Mutex
	calls map[string]int
	// rangesRead is the total of ranges passed to ReadRanges.
	rangesRead int
	query      func(ctx context.Context, keys []string) ([]store.Object, error)
	readRanges func(ctx context.Context, rs []store.Range) (int, error)
}

func newSpy(st store.Store) *spy { return &spy{Store: st, calls: map[string]int{}} }

func (s *spy) count(name string) {
	s.mu.Lock()
	s.calls[name]++
	s.mu.Unlock()
}

func (s *spy) Calls(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[name]
}

func (s *spy) Query(ctx context.Context, keys []string) ([]store.Object, error) {
	s.count("Query")
	if s.query != nil {
		return s.query(ctx, keys)
	}
	return s.Store.Query(ctx, keys)
}

func (s *spy) GetMeta(ctx context.Context, key string) ([]byte, error) {
	s.count("GetMeta")
	return s.Store.GetMeta(ctx, key)
}

func (s *spy) ReadRanges(ctx context.Context, rs []store.Range) (int, error) {
	s.count("ReadRanges")
	s.mu.Lock()
	s.rangesRead += len(rs)
	s.mu.Unlock()
	if s.readRanges != nil {
		return s.readRanges(ctx, rs)
	}
	return s.Store.ReadRanges(ctx, rs)
}

// verifyPage checks every element of the page at slot against key's content.
func verifyPage(rd *reshard.Reader, regions [][]byte, slot int, key string) error {
	return content.Verify(rd.Geometry(), regions, slot, content.Seed(key))
}
