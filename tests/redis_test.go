package tests

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/internal/redistest"
	"github.com/kvreshard/kvreshard/runtime/manifest"
)

// modelMany has 32 KiB pages (32 layers, 2 KV heads, head dim 8, fp8, 32
// tokens) that a tp=2 layer_first reader rank reads with 2048 GETRANGEs a
// page, so that reading 100 of them takes 200 round trips.
const modelMany = "layers=32,kv-heads=2,head-dim=8,dtype=fp8,page=32,name=many"

// getranges returns how many GETRANGE commands the server has run.
func getranges(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	v, err := srv.Do("INFO", "commandstats")
	require.NoError(t, err)
	m := regexp.MustCompile(`cmdstat_getrange:calls=(\d+),`).FindStringSubmatch(v.(string))
	if m == nil {
		return 0
	}
	n, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	return n
}

// A redis-server killed (SIGKILL) while a reader process reads: the reader
// exits 1 without a panic, with the pages it read in full verified and the
// reason it stopped; after a restart the server is empty (a miss, exit 0),
// and a rewrite reads back in full.
func TestServerKilledDuringReads(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t) // its own: the test kills it
	url, prefix := srv.URL(), newPrefix(t)
	const (
		pages = 100
		ops   = 2048     // GETRANGEs of a page for a tp=2 layer_first rank
		share = 16 << 10 // bytes of a page a tp=2 rank holds
	)
	n := fmt.Sprint(pages)
	write := func() string {
		t.Helper()
		var key string
		for i, p := range runAll(t,
			[]string{"write", "--store", url, "--prefix", prefix, "--model", modelMany, "--src", "tp=2,layout=PLHD", "--pages", n, "--rank", "0/0"},
			[]string{"write", "--store", url, "--prefix", prefix, "--model", modelMany, "--src", "tp=2,layout=PLHD", "--pages", n, "--rank", "1/0"},
		) {
			c, k := parseWrite(t, p)
			require.Equal(t, map[string]counts{fmt.Sprintf("%d/0", i): {written: pages}}, c, p.String())
			key = k
		}
		return key
	}
	read := func(rank string) []string {
		// direct: one GETRANGE a run, so the server dies in the middle of a
		// page's reads and not between two of them.
		return []string{"read", "--store", url, "--prefix", prefix, "--model", modelMany, "--dst", "tp=2,layout=layer_first,rank=" + rank,
			"--pages", n, "--verify", "--json", "--strategy", "direct"}
	}
	keys := content.PageKeys(prefix, domainOf(write()), pages)

	// Kill the server once the reader has had a tenth of its GETRANGEs run.
	rd := start(t, read("0/0")...)
	for deadline := time.Now().Add(30 * time.Second); getranges(t, srv) < pages/10*ops; {
		require.True(t, time.Now().Before(deadline), "the reader ran %d GETRANGEs in 30s", getranges(t, srv))
		time.Sleep(time.Millisecond)
	}
	srv.Kill()
	rd.wait(t)
	// A store that fails mid-read is a failure (exit 1), not a miss; the
	// JSON still says what was read.
	require.Equal(t, 1, rd.code, rd.String())
	got := parseRead(t, rd)
	t.Logf("killed after %d of %d pages: %s", got.Hit, pages, got.Stop)
	require.Less(t, got.Hit, pages, rd.String())
	// After the kill the connection reads EOF or is reset, a write to it
	// breaks, or a new connection is refused.
	addr := regexp.QuoteMeta(srv.Addr())
	gone := `(EOF|write tcp 127\.0\.0\.1:\d+->` + addr + `: write: broken pipe|read tcp 127\.0\.0\.1:\d+->` + addr +
		`: read: connection reset by peer|dial tcp ` + addr + `: connect: connection refused)`
	require.Regexp(t, `^page `+regexp.QuoteMeta(keys[got.Hit])+`: redis store `+addr+`: read ranges: `+gone+`$`, got.Stop)
	require.Equal(t, fmt.Sprintf("kvreshard read: read %d of %d pages: %s\n", got.Hit, pages, got.Stop), rd.stderr.String())
	require.Equal(t, readJSON{Requested: pages, Hit: got.Hit, Verified: false, Bytes: got.Hit * share, Ops: got.Hit * ops, Stop: got.Stop}, got, "a failed read is not verified")

	// Restarted, the server is empty: a miss. Written again, every page
	// reads back on both ranks.
	srv.Restart()
	p := run(t, read("0/0")...)
	require.Equal(t, 0, p.code, p.String())
	require.Empty(t, p.stderr.String(), p.String())
	require.Equal(t, readJSON{Requested: pages, Verified: true, Stop: "page missing or incomplete: " + keys[0]}, parseRead(t, p), p.String())
	require.Equal(t, keys, content.PageKeys(prefix, domainOf(write()), pages))
	for _, p := range runAll(t, read("0/0"), read("1/0")) {
		require.Equal(t, 0, p.code, p.String())
		require.Empty(t, p.stderr.String(), p.String())
		require.Equal(t, readJSON{Requested: pages, Hit: pages, Verified: true, Bytes: pages * share, Ops: pages * ops}, parseRead(t, p), p.String())
	}
}

// e2eModel is model12 with a namespace and a revision, as
// `kvreshard --model` makes it.
func e2eModel(namespace, revision string) manifest.Model {
	return manifest.Model{Namespace: namespace, ModelID: "e2e", Revision: revision, Descriptor: manifest.Descriptor{
		Layers: []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, KVHeads: 4, HeadDims: []int{16, 8}, Dtype: "bf16", ItemSize: 2, PageSize: 8}}
}

// Pages of two namespaces, or of two revisions of a model, under the same
// prefix never collide: a reader of one misses the pages of the other (it
// never gets the other's data), a writer of one writes beside the other's
// pages, and each then reads back its own.
func TestNamespacesAndRevisionsApart(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		a, b   string // added to --model
		ma, mb manifest.Model
	}{
		{"namespace", "namespace=a", "namespace=b", e2eModel("a", "0"), e2eModel("b", "0")},
		{"revision", "revision=1", "revision=2", e2eModel("kvreshard", "1"), e2eModel("kvreshard", "2")},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			forEachBackend(t, func(t *testing.T, url, prefix string) {
				const pages = 4
				n := fmt.Sprint(pages)
				ma, mb := model12+","+c.a, model12+","+c.b
				keysA, keysB := content.PageKeys(prefix, c.ma.Domain(), pages), content.PageKeys(prefix, c.mb.Domain(), pages)
				write := func(model string, m manifest.Model) {
					t.Helper()
					p := run(t, "write", "--store", url, "--prefix", prefix, "--model", model, "--src", "tp=2,layout=PLHD", "--pages", n)
					cs, key := parseWrite(t, p)
					require.Equal(t, map[string]counts{"0/0": {written: pages}, "1/0": {written: pages}}, cs, p.String())
					require.Equal(t, m.Domain(), domainOf(key), p.String())
				}
				read := func(model string) []string {
					return []string{"read", "--store", url, "--prefix", prefix, "--model", model, "--dst", "tp=1,layout=page_first,rank=0/0", "--pages", n, "--verify", "--json"}
				}
				write(ma, c.ma)

				p := run(t, read(mb)...)
				require.Equal(t, 0, p.code, p.String())
				require.Empty(t, p.stderr.String(), p.String())
				require.Equal(t, readJSON{Requested: pages, Verified: true, Stop: "page missing or incomplete: " + keysB[0]}, parseRead(t, p), p.String())
				st := openStore(t, url)
				objs, err := st.Query(context.Background(), append(keysA, keysB...))
				require.NoError(t, err)
				for i, o := range objs {
					require.Equal(t, i < pages, o.Complete, "page %d", i)
				}

				write(mb, c.mb)
				for _, p := range runAll(t, read(ma), read(mb)) {
					require.Equal(t, 0, p.code, p.String())
					require.Empty(t, p.stderr.String(), p.String())
					got := parseRead(t, p)
					require.Equal(t, readJSON{Requested: pages, Hit: pages, Verified: true, Bytes: pages * 12 * 4 * lh, Ops: got.Ops}, got, p.String())
				}
			})
		})
	}
}

// A redis:// URL of a cluster node and a redis+cluster:// URL of a single
// server exit 1 with one line saying which to use, and --json prints the
// read that did not happen, with that error.
func TestRedisURLOfTheOtherKind(t *testing.T) {
	t.Parallel()
	srv := redisServer.get(t, startServer)
	cl := redisCluster.get(t, startCluster)
	node := cl.Masters[1].Addr()
	for _, c := range []struct{ url, line string }{
		{"redis://" + node, "kvreshard read: redis store " + node + ": a cluster node; use redis+cluster://"},
		{"redis+cluster://" + srv.Addr(), "kvreshard read: redis store " + srv.Addr() + ": not a cluster node; use redis://"},
	} {
		p := run(t, "read", "--store", c.url, "--model", model12, "--dst", "tp=1,layout=page_first,rank=0/0", "--pages", "1", "--json")
		require.Equal(t, 1, p.code, p.String())
		require.Equal(t, c.line+"\n", p.stderr.String(), p.String())
		require.Equal(t, `{"requested":1,"hit":0,"verified":false,"bytes":0,"ops":0,"seconds":0,"gbps":0,"interpreter_plans":0,"error":"`+
			strings.TrimPrefix(c.line, "kvreshard read: ")+`"}`+"\n", p.stdout.String(), p.String())
	}
}
