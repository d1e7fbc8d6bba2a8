package redisstore_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/redistest"
	"github.com/kvreshard/kvreshard/runtime/store"
	"github.com/kvreshard/kvreshard/runtime/store/redisstore"
	"github.com/kvreshard/kvreshard/testkit/storetest"
)

// keysOf returns the server's keys of page key, sorted.
func keysOf(t *testing.T, do raw, key string) []string {
	t.Helper()
	meta, _, _ := redisstore.PageKeys(key)
	tag := strings.TrimSuffix(meta, ":3:meta")
	var out []string
	for _, k := range do(t, meta, "KEYS", tag+"*").([]any) {
		out = append(out, k.(string))
	}
	sort.Strings(out)
	return out
}

// TestPartialEviction: a page that was complete and lost one part
// (evicted, expired) is deleted whole by the first query, read or write
// that meets it, so that its other parts do not hold memory; a page that
// lost a part before it was complete is kept, for its writer to write
// the part again, and is never complete without it. Every case checks the
// exact keys left on the server.
func TestPartialEviction(t *testing.T) {
	srv := redistest.StartServer(t)
	testPartialEviction(t, srv.URL(), single(srv, 0))
}

func TestPartialEvictionCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	testPartialEviction(t, c.URL(), cluster(c))
}

func testPartialEviction(t *testing.T, url string, do raw) {
	s := open(t, url)
	defer s.Close()
	ctx := context.Background()
	p := [][]byte{storetest.Pattern("p0", 100), storetest.Pattern("p1", 200), storetest.Pattern("p2", 300)}
	want := complete("m", p...)
	// newPage writes the three parts of a page under manifest m, and a
	// neighbour page that no case touches; it returns the page's key.
	newPage := func(t *testing.T) string {
		key := "partial_" + strings.ReplaceAll(t.Name(), "/", "_")
		for _, k := range []string{key, key + "_neighbour"} {
			for i := range p {
				require.NoError(t, write(t, s, k, "m", i, p...))
			}
			require.Equal(t, want, query(t, s, k))
		}
		return key
	}
	names := func(key string, suffixes ...string) []string {
		var out []string
		for _, x := range suffixes {
			out = append(out, "{"+key+"}:3:"+x)
		}
		return out
	}
	evict := func(t *testing.T, key string, part int) {
		t.Helper()
		_, prefix, _ := redisstore.PageKeys(key)
		k := fmt.Sprintf("%s%d", prefix, part)
		require.Equal(t, int64(1), do(t, k, "DEL", k))
	}
	neighbourKept := func(t *testing.T, key string) {
		t.Helper()
		require.Equal(t, names(key+"_neighbour", "meta", "p:0", "p:1", "p:2"), keysOf(t, do, key+"_neighbour"))
		require.Equal(t, want, query(t, s, key+"_neighbour"))
	}

	t.Run("query", func(t *testing.T) {
		key := newPage(t)
		evict(t, key, 1)
		require.Equal(t, names(key, "meta", "p:0", "p:2"), keysOf(t, do, key))
		objs, err := s.Query(ctx, []string{key + "_neighbour", key, key + "_neighbour"})
		require.NoError(t, err)
		require.Equal(t, []store.Object{want, {}, want}, objs)
		require.Empty(t, keysOf(t, do, key))
		neighbourKept(t, key)
	})
	t.Run("last part", func(t *testing.T) {
		key := newPage(t)
		evict(t, key, 2)
		require.Equal(t, store.Object{}, query(t, s, key))
		require.Empty(t, keysOf(t, do, key))
		neighbourKept(t, key)
	})
	t.Run("read", func(t *testing.T) {
		key := newPage(t)
		evict(t, key, 2)
		rs := []store.Range{
			{Key: key + "_neighbour", Part: 2, Dst: [][]byte{make([]byte, 300)}},
			{Key: key, Part: 0, Dst: [][]byte{make([]byte, 100)}},
		}
		n, err := s.ReadRanges(ctx, rs)
		require.Equal(t, 1, n)
		require.EqualError(t, err, fmt.Sprintf("read %s part 0 [0,100): not found", key))
		require.ErrorIs(t, err, store.ErrNotFound)
		require.Equal(t, p[2], rs[0].Dst[0])
		require.Empty(t, keysOf(t, do, key))
		neighbourKept(t, key)
	})
	t.Run("write of its layout", func(t *testing.T) {
		// The write deletes the page and claims it as new: the parts
		// that had survived are written again.
		key := newPage(t)
		evict(t, key, 1)
		require.NoError(t, write(t, s, key, "m", 1, p...))
		require.Equal(t, names(key, "meta", "p:1"), keysOf(t, do, key))
		meta, _, _ := redisstore.PageKeys(key)
		require.Equal(t, "1", do(t, meta, "HGET", meta, "done"))
		require.Equal(t, store.Object{}, query(t, s, key))
		require.NoError(t, write(t, s, key, "m", 0, p...))
		require.NoError(t, write(t, s, key, "m", 2, p...))
		require.Equal(t, want, query(t, s, key))
		for i := range p {
			got, err := read(t, s, key, i, len(p[i]))
			require.NoError(t, err)
			require.Equal(t, p[i], got, "part %d", i)
		}
		neighbourKept(t, key)
	})
	t.Run("write of another layout", func(t *testing.T) {
		// Without waiting for a lease: nothing of the old page is left.
		key := newPage(t)
		evict(t, key, 0)
		b := storetest.Pattern("b1", 50)
		require.NoError(t, write(t, s, key, "n", 1, []byte("b0"), b))
		require.Equal(t, names(key, "meta", "p:1"), keysOf(t, do, key))
		meta, _, _ := redisstore.PageKeys(key)
		require.Equal(t, "n", do(t, meta, "HGET", meta, "manifest"))
		require.Equal(t, "2", do(t, meta, "HGET", meta, "parts"))
		require.NoError(t, write(t, s, key, "n", 0, []byte("b0"), b))
		require.Equal(t, complete("n", []byte("b0"), b), query(t, s, key))
		neighbourKept(t, key)
	})
	t.Run("not yet complete", func(t *testing.T) {
		// A part lost before the page was complete is kept with its
		// page: the retry of its writer writes it again.
		key := "partial_incomplete"
		require.NoError(t, write(t, s, key, "m", 0, p...))
		require.NoError(t, write(t, s, key, "m", 1, p...))
		evict(t, key, 0)
		require.Equal(t, store.Object{}, query(t, s, key))
		require.Equal(t, names(key, "meta", "p:1"), keysOf(t, do, key))
		require.NoError(t, write(t, s, key, "m", 0, p...))
		require.NoError(t, write(t, s, key, "m", 2, p...))
		require.Equal(t, want, query(t, s, key))

		// Lost before the last part is written: that write, which
		// would complete the page, unmarks the lost part instead; the
		// page is kept and completes when the part is written again.
		key += "_again"
		require.NoError(t, write(t, s, key, "m", 0, p...))
		require.NoError(t, write(t, s, key, "m", 1, p...))
		evict(t, key, 0)
		require.NoError(t, write(t, s, key, "m", 2, p...))
		require.Equal(t, names(key, "meta", "p:1", "p:2"), keysOf(t, do, key))
		meta, _, _ := redisstore.PageKeys(key)
		require.Equal(t, "2", do(t, meta, "HGET", meta, "done"))
		require.Equal(t, int64(0), do(t, meta, "HEXISTS", meta, "w:0"))
		require.Equal(t, store.Object{}, query(t, s, key))
		require.Equal(t, names(key, "meta", "p:1", "p:2"), keysOf(t, do, key))
		require.NoError(t, write(t, s, key, "m", 0, p...))
		require.Equal(t, want, query(t, s, key))
		for i := range p {
			got, err := read(t, s, key, i, len(p[i]))
			require.NoError(t, err)
			require.Equal(t, p[i], got, "part %d", i)
		}
	})
}
