package reshard_test

import (
	"context"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/internal/redistest"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/reshard"
	"github.com/kvreshard/kvreshard/runtime/store"
)

// evictModel has pages of 64 KiB (4 layers, 4 KV heads, head dims 64,
// bf16, 16 tokens); written TP2/PP2, parts of 16 KiB. (Issue 18 had pages
// of 256 KiB on a larger server; what matters is that the pages are many
// times the server's room.)
var evictModel = newModel("evict", 4, 4, []int{64, 64}, "bf16", 16)

// evictPages is the number of pages the eviction tests write: 6.25 MiB of
// pages on servers of 2 MiB, of which the server's own use takes about
// 0.9 MiB.
const evictPages = 100

// evictServer starts a redis-server of 2 MiB with the maxmemory policy,
// and opens a store on it (with the URL's options, such as ?ttl=1h).
func evictServer(t *testing.T, policy, options string) (*redistest.Server, store.Store) {
	t.Helper()
	srv := redistest.StartServer(t, "--maxmemory", "2mb", "--maxmemory-policy", policy)
	st, err := store.Open(context.Background(), srv.URL()+options)
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	return srv, st
}

// missStop matches the Stop of a read of key that missed, and says which
// of the ways it missed: "page" (missing or incomplete at the query),
// "manifest" (not in the store) or "read" (a part gone since the query).
func missStop(t testing.TB, stop error, key string, m *manifest.Manifest) string {
	t.Helper()
	require.Equal(t, reshard.StopMiss, reshard.Classify(stop), "%v", stop)
	q := regexp.QuoteMeta
	for _, c := range []struct{ how, re string }{
		{"page", "^page missing or incomplete: " + q(key) + "$"},
		{"manifest", "^page " + q(key) + ": page missing or incomplete: manifest " + q(m.Key()) + " is not in the store$"},
		{"read", "^page missing or incomplete: " + q(key) + ": read " + q(key) + ` part \d \[\d+,\d+\): not found$`},
	} {
		if regexp.MustCompile(c.re).MatchString(stop.Error()) {
			return c.how
		}
	}
	t.Fatalf("stop %q is not a miss of %s", stop, key)
	return ""
}

// readEach reads every page of keys, one at a time, into slot 0 of a new
// reader of rank r of topo (a pool of poolName), with opts: a page read is
// byte-exact, a page not read is a miss (missStop) and leaves the pool as
// it was. It returns the pages read and the misses by kind.
func readEach(t *testing.T, st store.Store, m *manifest.Manifest, keys []string, topo placement.Topology, r placement.Rank, poolName string, opts reshard.ReaderOptions) (int, map[string]int) {
	t.Helper()
	rd, regions := newReader(t, st, evictModel, topo, r, poolName, 1, opts)
	hits, misses := 0, map[string]int{}
	for _, k := range keys {
		before := clone(regions)
		res, err := rd.Read(context.Background(), []string{k}, []int{0}, regions)
		require.NoError(t, err)
		checkPoolMissed(t, rd.Geometry(), before, regions, []string{k}, []int{0}, res.Hit)
		if res.Hit == 1 {
			require.NoError(t, res.Stop)
			hits++
			continue
		}
		require.Zero(t, res.Hit)
		misses[missStop(t, res.Stop, k, m)]++
	}
	return hits, misses
}

// checkPoolMissed is checkPool for reads that race the server's
// evictions: a page whose part vanished between the query and the read is
// a miss, and its slot may hold partial bytes (the reader's contract), so
// only the bytes outside every requested slot must be as they were.
func checkPoolMissed(t testing.TB, g *plan.Geometry, before, after [][]byte, keys []string, slots []int, hit int) {
	t.Helper()
	before = clone(before)
	for _, s := range slots[hit:] {
		for r, spans := range slotSpans(g, s) {
			for _, sp := range spans {
				copy(before[r][sp[0]:sp[1]], after[r][sp[0]:sp[1]])
			}
		}
	}
	checkPool(t, g, before, after, keys, slots, hit)
}

// readRun reads keys in one request with a new reader: the leading pages it
// reads are byte-exact and it stops at a miss (or reads them all).
func readRun(t *testing.T, st store.Store, m *manifest.Manifest, keys []string) int {
	t.Helper()
	rd, regions := newReader(t, st, evictModel, tp1pp3, placement.Rank{PP: 2}, "page_first", len(keys), reshard.ReaderOptions{})
	before := clone(regions)
	res, err := rd.Read(context.Background(), keys, iota(len(keys)), regions)
	require.NoError(t, err)
	checkPoolMissed(t, rd.Geometry(), before, regions, keys, iota(len(keys)), res.Hit)
	if res.Hit < len(keys) {
		missStop(t, res.Stop, keys[res.Hit], m)
	} else {
		require.NoError(t, res.Stop)
	}
	return res.Hit
}

// checkReaders reads keys with readers of three topologies and pool
// layouts, one with CheckParts, page by page and in one request, and
// requires what readEach and readRun do.
func checkReaders(t *testing.T, st store.Store, m *manifest.Manifest, keys []string) {
	t.Helper()
	hits, misses := readEach(t, st, m, keys, tp2pp2, placement.Rank{TP: 1, PP: 1}, "page_first", reshard.ReaderOptions{})
	t.Logf("tp2pp2 page by page: %d hits, misses %v", hits, misses)
	hits, misses = readEach(t, st, m, keys, tp4pp1, placement.Rank{TP: 2}, "layer_first", reshard.ReaderOptions{CheckParts: true})
	t.Logf("tp4pp1 checked, page by page: %d hits, misses %v", hits, misses)
	t.Logf("tp1pp3 in one request: %d hits", readRun(t, st, m, keys))
}

// flood sets keys of 64 KiB outside the store's until the manifest key
// has gone: the server evicts (allkeys-lru, allkeys-random) keys it picks
// from samples, and sooner or later the manifest. It fails t after 10,000
// keys.
func flood(t *testing.T, c rueidis.Client, m *manifest.Manifest) int {
	t.Helper()
	ctx := context.Background()
	filler := strings.Repeat("f", 64<<10)
	for i := 0; ; i++ {
		n, err := c.Do(ctx, c.B().Exists().Key("meta:"+m.Key()).Build()).AsInt64()
		require.NoError(t, err)
		if n == 0 {
			return i
		}
		require.Less(t, i, 10000, "meta:%s is still there", m.Key())
		require.NoError(t, c.Do(ctx, c.B().Set().Key("filler:"+strconv.Itoa(i)).Value(filler).Build()).Error())
	}
}

// scanKeys returns the server's keys that match pattern, sorted.
func scanKeys(t *testing.T, c rueidis.Client, pattern string) []string {
	t.Helper()
	var out []string
	var cursor uint64
	for {
		e, err := c.Do(context.Background(), c.B().Scan().Cursor(cursor).Match(pattern).Count(1000).Build()).AsScanEntry()
		require.NoError(t, err)
		out = append(out, e.Elements...)
		if cursor = e.Cursor; cursor == 0 {
			break
		}
	}
	sort.Strings(out)
	return out
}

// pageKeyNames returns the Redis keys of complete pages of keys written in
// four parts: each page's meta hash and parts, sorted.
func pageKeyNames(keys []string) []string {
	var out []string
	for _, k := range keys {
		for _, x := range []string{"meta", "p:0", "p:1", "p:2", "p:3"} {
			out = append(out, "{"+k+"}:3:"+x)
		}
	}
	sort.Strings(out)
	return out
}

// TestEvictionAllkeys writes 6.25 MiB of pages with long-lived TP2/PP2
// writers into a Redis of 2 MiB under each allkeys-* policy, so that the
// server evicts pages, parts of pages and (lru, random) the manifest.
// Whatever it evicted, a reader never gets wrong bytes: every page it
// reads verifies, and it stops at a miss. Once the manifest is gone, no
// new reader reads any page, and each stops at a miss, not a rejection.
// The same writers write again and put the manifest back; with the limit
// lifted (so that nothing more is evicted), every page reads byte-exact
// and the server holds exactly the keys of the pages.
func TestEvictionAllkeys(t *testing.T) {
	for _, policy := range []string{"allkeys-lru", "allkeys-lfu", "allkeys-random"} {
		t.Run(policy, func(t *testing.T) {
			srv, st := evictServer(t, policy, "")
			c := redisClient(t, srv)
			ctx := context.Background()
			m := manifestOf(t, evictModel, tp2pp2, builtin(t, "PLHD"))
			keys := content.PageKeys("evict", evictModel.Domain(), evictPages)
			ws := newRankWriters(t, st, m, tp2pp2, "page_first", keys)
			for at := 0; at < len(keys); at += 4 {
				requireStatus(t, writeBatch(t, ws, keys, at, at+4), reshard.Written)
			}
			checkReaders(t, st, m, keys)

			if policy != "allkeys-lfu" {
				// Under LFU the manifest, which every Write uses,
				// outlasts fillers used once for as long as its
				// counter says: not a bound to test against.
				t.Logf("the manifest went after %d fillers", flood(t, c, m))
				hits, misses := readEach(t, st, m, keys, tp2pp2, placement.Rank{}, "page_head", reshard.ReaderOptions{})
				require.Zero(t, hits, "no manifest, no page: misses %v", misses)
				t.Logf("without the manifest: misses %v", misses)
			}

			// The writers write the last pages again, still under
			// the limit: a page either way, never a failure.
			for _, res := range writeBatch(t, ws, keys, len(keys)-4, len(keys)) {
				for _, pr := range res {
					require.NoError(t, pr.Err)
					require.Contains(t, []reshard.Status{reshard.Written, reshard.Complete}, pr.Status)
				}
			}
			checkReaders(t, st, m, keys[len(keys)-4:])

			// Lift the limit: writing every page again puts the
			// manifest back, and every page reads.
			require.NoError(t, c.Do(ctx, c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", "0").Build()).Error())
			for at := 0; at < len(keys); at += 20 {
				for _, res := range writeBatch(t, ws, keys, at, at+20) {
					for _, pr := range res {
						require.NoError(t, pr.Err)
						require.Contains(t, []reshard.Status{reshard.Written, reshard.Complete}, pr.Status)
					}
				}
			}
			got, err := st.GetMeta(ctx, m.Key())
			require.NoError(t, err)
			require.Equal(t, m.Encode(), got)
			require.Equal(t, evictPages, readRun(t, st, m, keys))
			hits, _ := readEach(t, st, m, keys, tp4pp1, placement.Rank{TP: 3}, "page_head", reshard.ReaderOptions{CheckParts: true})
			require.Equal(t, evictPages, hits)
			require.Equal(t, pageKeyNames(keys), scanKeys(t, c, "{*"), "the pages' keys and nothing else")
		})
	}
}

// dbSize returns the number of keys on the server.
func dbSize(t *testing.T, c rueidis.Client) int64 {
	t.Helper()
	n, err := c.Do(context.Background(), c.B().Dbsize().Build()).AsInt64()
	require.NoError(t, err)
	return n
}

// oomErr matches the error of a part write that a full server refused.
func oomErr(srv *redistest.Server, key string) *regexp.Regexp {
	return regexp.MustCompile("^redis store " + regexp.QuoteMeta(srv.Addr()) + ": write " + regexp.QuoteMeta(key) +
		` part \d: OOM command not allowed when used memory > 'maxmemory'\. script: [0-9a-f]{40}, on @user_script:\d+\.$`)
}

// usedMemory returns the server's used_memory.
func usedMemory(t *testing.T, c rueidis.Client) int64 {
	t.Helper()
	info, err := c.Do(context.Background(), c.B().Info().Section("memory").Build()).ToString()
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^used_memory:(\d+)\r?$`).FindStringSubmatch(info)
	require.NotNil(t, m, info)
	n, err := strconv.ParseInt(m[1], 10, 64)
	require.NoError(t, err)
	return n
}

// TestEvictionNoeviction: under noeviction a full server refuses part
// writes: those pages are Failed with its OOM error, nothing of them is
// stored (the server stays within 256 KiB of its limit, though 6.25 MiB
// were sent), and every page all of whose parts were written reads
// byte-exact, its manifest with it; the others are misses. Writing the
// complete pages again reports them Complete, on the full server.
// volatile-lru without a ttl on the store behaves the same: no key has a
// TTL, so the server has nothing to evict.
func TestEvictionNoeviction(t *testing.T) {
	for _, policy := range []string{"noeviction", "volatile-lru"} {
		t.Run(policy, func(t *testing.T) {
			srv, st := evictServer(t, policy, "")
			c := redisClient(t, srv)
			m := manifestOf(t, evictModel, tp2pp2, builtin(t, "PLHD"))
			keys := content.PageKeys("full", evictModel.Domain(), evictPages)
			ws := newRankWriters(t, st, m, tp2pp2, "page_first", keys)
			var stored, failed []string
			var storedAt []int
			for i, k := range keys {
				ok := true
				for r, res := range writeBatch(t, ws, keys, i, i+1) {
					switch pr := res[0]; pr.Status {
					case reshard.Written:
					case reshard.Failed:
						require.Regexp(t, oomErr(srv, k), pr.Err.Error(), "rank %d page %d", r, i)
						ok = false
					default:
						t.Fatalf("rank %d page %d: %v %v", r, i, pr.Status, pr.Err)
					}
				}
				if ok {
					stored, storedAt = append(stored, k), append(storedAt, i)
				} else {
					failed = append(failed, k)
				}
			}
			t.Logf("%d pages stored, %d failed", len(stored), len(failed))
			require.NotEmpty(t, failed)
			require.LessOrEqual(t, usedMemory(t, c), int64(2<<20+256<<10), "used_memory")

			hits, _ := readEach(t, st, m, stored, tp4pp1, placement.Rank{TP: 1}, "page_head", reshard.ReaderOptions{CheckParts: true})
			require.Equal(t, len(stored), hits)
			require.Equal(t, len(stored), readRun(t, st, m, stored))
			hits, misses := readEach(t, st, m, failed, tp2pp2, placement.Rank{PP: 1}, "page_first", reshard.ReaderOptions{})
			require.Zero(t, hits)
			require.Equal(t, map[string]int{"page": len(failed)}, misses)

			// Written again, on the full server: Complete.
			for _, rw := range ws {
				res, err := rw.w.Write(context.Background(), stored, storedAt, rw.regions)
				require.NoError(t, err)
				for i, pr := range res {
					require.Equal(t, reshard.PageResult{Key: stored[i], Status: reshard.Complete}, pr)
				}
			}
		})
	}
}

// TestEvictionVolatileTTL: with ?ttl= only the keys of pages carry a TTL,
// so volatile-* policies evict pages, never manifests: a reader reads
// byte-exact or misses a page, never its manifest.
func TestEvictionVolatileTTL(t *testing.T) {
	for _, policy := range []string{"volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl"} {
		t.Run(policy, func(t *testing.T) {
			srv, st := evictServer(t, policy, "?ttl=1h")
			c := redisClient(t, srv)
			ctx := context.Background()
			m := manifestOf(t, evictModel, tp2pp2, builtin(t, "PLHD"))
			keys := content.PageKeys("volatile", evictModel.Domain(), evictPages)
			ws := newRankWriters(t, st, m, tp2pp2, "page_first", keys)
			for at := 0; at < len(keys); at += 4 {
				requireStatus(t, writeBatch(t, ws, keys, at, at+4), reshard.Written)
				ttl, err := c.Do(ctx, c.B().Pttl().Key("meta:"+m.Key()).Build()).AsInt64()
				require.NoError(t, err)
				require.Equal(t, int64(-1), ttl, "the manifest has no TTL")
			}
			for _, rd := range []struct {
				topo placement.Topology
				rank placement.Rank
				pool string
				opts reshard.ReaderOptions
			}{
				{tp2pp2, placement.Rank{TP: 1}, "page_first", reshard.ReaderOptions{}},
				{tp4pp1, placement.Rank{TP: 3}, "layer_first", reshard.ReaderOptions{CheckParts: true}},
			} {
				hits, misses := readEach(t, st, m, keys, rd.topo, rd.rank, rd.pool, rd.opts)
				require.Zero(t, misses["manifest"], "misses %v", misses)
				t.Logf("%d hits, misses %v", hits, misses)
			}
		})
	}
}
