package tests

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/internal/redistest"
	_ "github.com/kvreshard/kvreshard/layouts"
	"github.com/kvreshard/kvreshard/runtime/kernel"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/partsum"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/reshard"
	"github.com/kvreshard/kvreshard/runtime/store"
)

// model12 has 12 layers and 4 KV heads, K and V head dims 16 and 8, bf16
// and 8 tokens a page: one (layer, head) of a page is 8*(16+8)*2 = 384
// bytes, a page 12*4*384 = 18432.
const model12 = "layers=12,kv-heads=4,head-dim=16,v-head-dim=8,dtype=bf16,page=8,name=e2e"

// lh is the bytes of one (layer, head) of a model12 or model6h page.
const lh = 384

// model6h is model12 with 6 KV heads.
const model6h = "layers=12,kv-heads=6,head-dim=16,v-head-dim=8,dtype=bf16,page=8,name=e2e6"

// A scenario: writer ranks of one topology, each its own process, write
// pages and exit; then reader ranks of another topology, each its own
// process, restore and verify every byte.
type scenario struct {
	name     string
	model    string
	src      string   // writer topology
	srcRanks []string // T/P
	dst      string   // reader topology, without rank
	dstRanks []string
	share    []int // bytes of a page each reader rank holds
	pages    int
	again    string // a writer topology and layout that finds the pages complete
}

func TestWritersExitThenReadersVerify(t *testing.T) {
	t.Parallel()
	for _, s := range []scenario{{
		name:  "tp2pp2 PLHD to tp1pp3 page_head",
		model: model12, src: "tp=2,pp=2,layout=PLHD", srcRanks: []string{"0/0", "1/0", "0/1", "1/1"},
		dst: "tp=1,pp=3,layout=page_head", dstRanks: []string{"0/0", "0/1", "0/2"},
		share: []int{4 * 4 * lh, 4 * 4 * lh, 4 * 4 * lh}, pages: 6, again: "tp=1,pp=3,layout=HPLD",
	}, {
		name:  "tp1pp3 HPLD to tp2pp2 layer_first",
		model: model12, src: "tp=1,pp=3,layout=HPLD", srcRanks: []string{"0/0", "0/1", "0/2"},
		dst: "tp=2,pp=2,layout=layer_first", dstRanks: []string{"0/0", "1/0", "0/1", "1/1"},
		share: []int{6 * 2 * lh, 6 * 2 * lh, 6 * 2 * lh, 6 * 2 * lh}, pages: 5, again: "tp=2,pp=2,layout=LPHD",
	}, {
		name:  "uneven pp-layers LPHD to page_first_direct",
		model: model12, src: "tp=1,pp=3,pp-layers=5/4/3,layout=LPHD", srcRanks: []string{"0/0", "0/1", "0/2"},
		dst: "tp=2,pp=2,pp-layers=7/5,layout=page_first_direct", dstRanks: []string{"0/0", "1/0", "0/1", "1/1"},
		share: []int{7 * 2 * lh, 7 * 2 * lh, 5 * 2 * lh, 5 * 2 * lh}, pages: 4, again: "tp=2,pp=2,pp-layers=7/5,layout=PLHD",
	}, {
		name:  "tp3 reader of a tp2 writer with 6 heads",
		model: model6h, src: "tp=2,layout=PLHD", srcRanks: []string{"0/0", "1/0"},
		dst: "tp=3,layout=page_first", dstRanks: []string{"0/0", "1/0", "2/0"},
		share: []int{12 * 2 * lh, 12 * 2 * lh, 12 * 2 * lh}, pages: 4, again: "tp=3,layout=HPLD",
	}} {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			forEachBackend(t, func(t *testing.T, url, prefix string) { s.run(t, url, prefix) })
		})
	}
}

func (s *scenario) run(t *testing.T, url, prefix string) {
	n := fmt.Sprint(s.pages)
	var writers [][]string
	for _, r := range s.srcRanks {
		writers = append(writers, []string{"write", "--store", url, "--prefix", prefix, "--model", s.model, "--src", s.src, "--pages", n, "--rank", r})
	}
	var key string
	for i, p := range runAll(t, writers...) {
		c, k := parseWrite(t, p)
		require.Equal(t, map[string]counts{s.srcRanks[i]: {written: s.pages}}, c, p.String())
		if key == "" {
			key = k
		}
		require.Equal(t, key, k)
	}
	keys := content.PageKeys(prefix, domainOf(key), s.pages+1)

	// Every writer has exited. Each reader rank is a process; rank 0 also
	// asks for one page more than was written.
	var readers [][]string
	for _, r := range s.dstRanks {
		readers = append(readers, []string{"read", "--store", url, "--prefix", prefix, "--model", s.model, "--dst", s.dst + ",rank=" + r, "--pages", n, "--verify", "--json"})
	}
	readers = append(readers, []string{"read", "--store", url, "--prefix", prefix, "--model", s.model, "--dst", s.dst + ",rank=" + s.dstRanks[0],
		"--pages", fmt.Sprint(s.pages + 1), "--verify", "--json"})
	for i, p := range runAll(t, readers...) {
		require.Equal(t, 0, p.code, p.String())
		require.Empty(t, p.stderr.String(), p.String())
		got := parseRead(t, p)
		want := readJSON{Requested: s.pages, Hit: s.pages, Verified: true, Bytes: s.pages * s.share[min(i, len(s.share)-1)], Ops: got.Ops}
		if i == len(s.dstRanks) {
			want.Requested, want.Bytes = s.pages+1, s.pages*s.share[0]
			want.Stop = "page missing or incomplete: " + keys[s.pages]
		}
		require.Equal(t, want, got, p.String())
		require.Positive(t, got.Ops)
	}

	// Writers of the reader's topology find every page complete.
	p := run(t, "write", "--store", url, "--prefix", prefix, "--model", s.model, "--src", s.again, "--pages", n)
	c, _ := parseWrite(t, p)
	require.Len(t, c, len(s.dstRanks))
	for r, x := range c {
		require.Equal(t, s.pages, x.complete+x.replica, "rank %s: %s", r, p)
		require.Zero(t, x.written+x.refused, "rank %s: %s", r, p)
	}
}

// Writers of two layouts, each rank its own process, all started together,
// race on the same pages: every page ends complete in exactly one layout,
// each rank writes exactly the pages its layout won, and every reader
// verifies.
func TestConcurrentLayoutsRace(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, url, prefix string) {
		const pages = 24
		n := fmt.Sprint(pages)
		a := []string{"0/0", "1/0", "0/1", "1/1"} // tp=2,pp=2,layout=PLHD
		b := []string{"0/0", "0/1", "0/2"}        // tp=1,pp=3,layout=HPLD
		var args [][]string
		for i := range 4 {
			args = append(args, []string{"write", "--store", url, "--prefix", prefix, "--model", model12, "--src", "tp=2,pp=2,layout=PLHD", "--pages", n, "--rank", a[i]})
			if i < 3 {
				args = append(args, []string{"write", "--store", url, "--prefix", prefix, "--model", model12, "--src", "tp=1,pp=3,layout=HPLD", "--pages", n, "--rank", b[i]})
			}
		}
		ps := runAll(t, args...)
		var keyA, keyB string
		rankCounts := map[string][]counts{}
		for i, p := range ps {
			c, k := parseWrite(t, p)
			require.Len(t, c, 1, p.String())
			layout := "A"
			if i%2 == 1 {
				layout = "B"
				keyB = k
			} else {
				keyA = k
			}
			for _, x := range c {
				require.Zero(t, x.replica)
				require.Equal(t, pages, x.written+x.complete+x.refused, p.String())
				rankCounts[layout] = append(rankCounts[layout], x)
			}
		}
		require.NotEqual(t, keyA, keyB)

		st := openStore(t, url)
		keys := content.PageKeys(prefix, domainOf(keyA), pages)
		objs, err := st.Query(context.Background(), keys)
		require.NoError(t, err)
		won := map[string]int{}
		for i, o := range objs {
			require.True(t, o.Complete, "page %d", i)
			switch o.Manifest {
			case keyA:
				n := partsum.Size(6 * 2 * lh)
				require.Equal(t, []int{n, n, n, n}, o.PartSizes, "page %d", i)
				won["A"]++
			case keyB:
				n := partsum.Size(4 * 4 * lh)
				require.Equal(t, []int{n, n, n}, o.PartSizes, "page %d", i)
				won["B"]++
			default:
				t.Fatalf("page %d is complete with manifest %s, neither %s nor %s", i, o.Manifest, keyA, keyB)
			}
		}
		t.Logf("pages won: PLHD %d, HPLD %d", won["A"], won["B"])
		// A rank writes a page only while its layout holds the page's
		// claim, and the claim's layout is the one that completes the page.
		for layout, cs := range rankCounts {
			for _, c := range cs {
				require.Equal(t, won[layout], c.written, "layout %s: %+v", layout, cs)
			}
		}

		var readers [][]string
		for _, r := range []string{"0/0", "1/0", "2/0", "3/0"} {
			readers = append(readers, []string{"read", "--store", url, "--prefix", prefix, "--model", model12, "--dst", "tp=4,layout=page_first,rank=" + r, "--pages", n, "--verify", "--json"})
		}
		for _, p := range runAll(t, readers...) {
			require.Equal(t, 0, p.code, p.String())
			got := parseRead(t, p)
			require.Equal(t, readJSON{Requested: pages, Hit: pages, Verified: true, Bytes: pages * 12 * lh, Ops: got.Ops}, got, p.String())
		}
	})
}

// modelBig has 1 MiB pages (4 layers, 2 KV heads, head dim 128, fp32, 128
// tokens), so that writing many of them takes a while.
const modelBig = "layers=4,kv-heads=2,head-dim=128,dtype=fp32,page=128,name=big"

// Writers killed with SIGKILL in the middle of writing: no page that reads
// as complete fails verification, and a retry completes every page.
func TestWriterKilledThenRetried(t *testing.T) {
	t.Parallel()
	forEachBackend(t, testWriterKilledThenRetried)
}

func testWriterKilledThenRetried(t *testing.T, url, prefix string) {
	const pages = 40
	n := fmt.Sprint(pages)
	mo := manifest.Model{Namespace: "kvreshard", ModelID: "big", Revision: "0", Descriptor: manifest.Descriptor{
		Layers: []int{0, 1, 2, 3}, KVHeads: 2, HeadDims: []int{128, 128}, Dtype: "fp32", ItemSize: 4, PageSize: 128}}
	poll := openStore(t, url)

	// Kill both writers once some page is complete (so that the store holds
	// complete pages, pages with one part and pages with none), after a
	// short random delay. When both have finished first, which a loaded
	// machine can make happen, try again under a new prefix.
	var keys []string
	for try := 1; ; try++ {
		p := fmt.Sprintf("%s-%d", prefix, try)
		keys = content.PageKeys(p, mo.Domain(), pages)
		since := lastClientIDs(t, url)
		ws := []*proc{
			start(t, "write", "--store", url, "--prefix", p, "--model", modelBig, "--src", "tp=2,layout=PLHD", "--pages", n, "--rank", "0/0"),
			start(t, "write", "--store", url, "--prefix", p, "--model", modelBig, "--src", "tp=2,layout=PLHD", "--pages", n, "--rank", "1/0"),
		}
		deadline := time.Now().Add(time.Minute)
		for {
			objs, err := poll.Query(context.Background(), keys)
			require.NoError(t, err)
			if slices.ContainsFunc(objs, func(o store.Object) bool { return o.Complete }) {
				break
			}
			require.True(t, time.Now().Before(deadline), "no page complete in a minute")
			time.Sleep(time.Millisecond)
		}
		time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond)
		for _, w := range ws {
			w.cmd.Process.Signal(syscall.SIGKILL)
		}
		killed := 0
		for _, w := range ws {
			w.wait(t)
			if w.code == -1 {
				killed++
			} else {
				require.Equal(t, 0, w.code, w.String())
			}
		}
		t.Logf("try %d: %d of 2 writers killed", try, killed)
		if killed > 0 {
			// A Redis server still runs the writes a killed writer had
			// sent; they are done when it has closed the connection.
			require.NoError(t, poll.Close())
			waitClosed(t, url, since)
			prefix = p
			break
		}
		require.Less(t, try, 5, "both writers finished before the kill, 5 times")
	}
	st := openStore(t, url)

	// Check in this process that every page the store calls complete
	// verifies, and count the leading run of complete pages.
	objs, err := st.Query(context.Background(), keys)
	require.NoError(t, err)
	lead, complete := -1, 0
	pool, err := kernel.LayoutNamed("page_head")
	require.NoError(t, err)
	b, err := plan.BindingFor(&mo.Descriptor, placement.Topology{TP: 1, PP: 1}, placement.Rank{}, pool, 1)
	require.NoError(t, err)
	rd, err := reshard.NewReader(st, mo.Domain(), &mo.Descriptor, b, reshard.ReaderOptions{})
	require.NoError(t, err)
	regions := [][]byte{make([]byte, rd.Geometry().Regions[0]), make([]byte, rd.Geometry().Regions[1])}
	for i, o := range objs {
		if !o.Complete {
			if lead < 0 {
				lead = i
			}
			continue
		}
		complete++
		n := partsum.Size(1 << 19)
		require.Equal(t, []int{n, n}, o.PartSizes, "page %d", i)
		if lead >= 0 { // the reader processes below verify the leading run
			res, err := rd.Read(context.Background(), keys[i:i+1], []int{0}, regions)
			require.NoError(t, err)
			require.NoError(t, res.Stop)
			require.NoError(t, content.Verify(rd.Geometry(), regions, 0, content.Seed(keys[i])), "page %d", i)
		}
	}
	if lead < 0 {
		lead = pages
	}
	t.Logf("after the kill: %d pages complete, the first %d of them leading", complete, lead)
	for _, r := range []string{"0/0", "1/0"} {
		p := run(t, "read", "--store", url, "--prefix", prefix, "--model", modelBig, "--dst", "tp=2,layout=page_first,rank="+r, "--pages", n, "--verify", "--json")
		require.Equal(t, 0, p.code, p.String())
		got := parseRead(t, p)
		require.Equal(t, lead, got.Hit, p.String())
		require.True(t, got.Verified, p.String())
	}

	// The retry: every rank again, in one process, rank 0/0 first. It finds
	// the complete pages complete and writes its part of every other; rank
	// 1/0 also finds complete the pages whose part 1 survived the kill.
	p := run(t, "write", "--store", url, "--prefix", prefix, "--model", modelBig, "--src", "tp=2,layout=PLHD", "--pages", n)
	c, _ := parseWrite(t, p)
	require.Equal(t, counts{written: pages - complete, complete: complete}, c["0/0"], p.String())
	require.Equal(t, pages, c["1/0"].written+c["1/0"].complete, p.String())
	require.GreaterOrEqual(t, c["1/0"].complete, complete, p.String())
	require.Len(t, c, 2)
	for _, p := range runAll(t,
		[]string{"read", "--store", url, "--prefix", prefix, "--model", modelBig, "--dst", "tp=1,layout=page_head,rank=0/0", "--pages", n, "--verify", "--json"},
		[]string{"read", "--store", url, "--prefix", prefix, "--model", modelBig, "--dst", "tp=2,pp=2,layout=layer_first,rank=1/1", "--pages", n, "--verify", "--json"},
	) {
		require.Equal(t, 0, p.code, p.String())
		got := parseRead(t, p)
		require.Equal(t, pages, got.Hit, p.String())
		require.True(t, got.Verified, p.String())
	}
}

// redisAddrs returns the addresses of the Redis servers of a store URL,
// none for another store.
func redisAddrs(url string) []string {
	scheme, rest, _ := strings.Cut(url, "://")
	if scheme != "redis" && scheme != "redis+cluster" {
		return nil
	}
	return strings.Split(rest, ",")
}

// lastClientIDs returns, for each Redis server of url, an id that every
// connection it accepts later exceeds: the id of a new connection.
func lastClientIDs(t *testing.T, url string) []int64 {
	t.Helper()
	var ids []int64
	for _, a := range redisAddrs(url) {
		v, err := redistest.Do(a, "CLIENT", "ID")
		require.NoError(t, err)
		ids = append(ids, v.(int64))
	}
	return ids
}

var clientID = regexp.MustCompile(`(?m)^id=(\d+) `)

// waitClosed waits until each Redis server of url has closed every
// connection it accepted after since (from lastClientIDs) and before now.
// A server runs the commands a client sent before it died, and then closes
// its connection.
func waitClosed(t *testing.T, url string, since []int64) {
	t.Helper()
	until := lastClientIDs(t, url)
	deadline := time.Now().Add(30 * time.Second)
	for i, a := range redisAddrs(url) {
		for {
			v, err := redistest.Do(a, "CLIENT", "LIST")
			require.NoError(t, err)
			open := 0
			for _, m := range clientID.FindAllStringSubmatch(v.(string), -1) {
				id, err := strconv.ParseInt(m[1], 10, 64)
				require.NoError(t, err)
				if since[i] < id && id < until[i] {
					open++
				}
			}
			if open == 0 {
				break
			}
			require.True(t, time.Now().Before(deadline), "%s: %d connections still open after 30s:\n%s", a, open, v)
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// freePort returns a loopback port nothing listens on.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	return port
}

// Malformed flags exit 2 with one line naming the problem; a store that
// cannot be reached exits 1 with one line.
func TestUsageErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	url := "file://" + dir
	const m = model12
	port := freePort(t)
	for _, c := range []struct {
		args []string
		code int
		line string
	}{
		{[]string{"write", "--store", url, "--model", "layers=x,kv-heads=4,head-dim=8,dtype=fp32,page=16", "--src", "tp=1,layout=PLHD", "--pages", "1"}, 2,
			"kvreshard write: --model: layers=x is not a whole number >= 1"},
		{[]string{"read", "--store", url, "--model", "layers=2,kv-heads=4,head-dim=8,page=16", "--dst", "tp=1,rank=0/0,layout=page_first", "--pages", "1"}, 2,
			"kvreshard read: --model: dtype is required (fp32, bf16, fp16 or fp8)"},
		{[]string{"write", "--store", url, "--model", m, "--src", "tp=2,pp=2", "--pages", "1"}, 2,
			"kvreshard write: --src: layout is required (PLHD, LPHD, HPLD, page_first, page_first_direct, layer_first, page_head)"},
		{[]string{"write", "--store", url, "--model", m, "--src", "tp=3,layout=PLHD", "--pages", "1"}, 2,
			"kvreshard write: --src: kv-heads 4 is not divisible by tp 3"},
		{[]string{"write", "--store", url, "--model", m, "--src", "tp=2,layout=XYZ", "--pages", "1"}, 2,
			`kvreshard write: --src: unknown layout "XYZ"; layouts are PLHD, LPHD, HPLD, page_first, page_first_direct, layer_first, page_head`},
		{[]string{"read", "--store", url, "--model", m, "--dst", "tp=2,pp=2,layout=page_first", "--pages", "1"}, 2,
			"kvreshard read: --dst: rank is required (rank=T/P or T/P/C: the TP rank, the PP rank, then the CP rank)"},
		{[]string{"read", "--store", url, "--model", m, "--dst", "tp=2,pp=2,rank=2/0,layout=page_first", "--pages", "1"}, 2,
			"kvreshard read: --dst: rank=2/0 is outside tp=2 x pp=2"},
		{[]string{"read", "--store", url, "--model", m, "--dst", "tp=2,pp=2,rank=0/0,layout=page_first,pp-layers=5/5", "--pages", "1"}, 2,
			"kvreshard read: --dst: pp-layers sum to 10, not the 12 layers"},
		{[]string{"write", "--store", "relative/dir", "--model", m, "--src", "tp=2,layout=PLHD", "--pages", "1"}, 2,
			`kvreshard write: --store: store URL "relative/dir": missing scheme; use one of file://, mem://, redis+cluster://, redis://`},
		{[]string{"write", "--store", "file://relative/dir", "--model", m, "--src", "tp=2,layout=PLHD", "--pages", "1"}, 2,
			`kvreshard write: --store: store URL "file://relative/dir": host "relative" is not empty or localhost; write file:///abs/dir, with three slashes`},
		{[]string{"read", "--store", "ftp://x", "--model", m, "--dst", "tp=2,rank=0/0,layout=page_first", "--pages", "1"}, 2,
			`kvreshard read: --store: store URL "ftp://x": unknown scheme "ftp"; use one of file://, mem://, redis+cluster://, redis://`},
		{[]string{"write", "--model", m, "--src", "tp=2,layout=PLHD", "--pages", "1"}, 2,
			"kvreshard write: --store is required (file://, mem://, redis+cluster://, redis://)"},
		{[]string{"write", "--store", url, "--model", m, "--src", "tp=2,layout=PLHD", "--pages", "1", "--rank", "5/0"}, 2,
			"kvreshard write: --rank 5/0 is outside tp=2 x pp=1"},
		{[]string{"write", "--store", url, "--model", m, "--src", "tp=2,layout=PLHD", "--pages", "1", "--rank", "1"}, 2,
			"kvreshard write: --rank 1 is not TP/PP ranks like 1/0, or TP/PP/CP ranks like 1/0/1"},
		{[]string{"read", "--store", url, "--model", m, "--dst", "tp=2,rank=x/0,layout=page_first", "--pages", "1"}, 2,
			"kvreshard read: --dst: rank=x/0 is not TP/PP ranks like 1/0, or TP/PP/CP ranks like 1/0/1"},
		{[]string{"write", "--store", url, "--model", m, "--src", "tp=2,cp=2,cp-interleave=3,layout=PLHD", "--pages", "1"}, 2,
			"kvreshard write: --src: cp interleave 3 does not divide the page's 8 tokens"},
		{[]string{"write", "--store", url, "--model", m, "--src", "tp=2,cp=16,layout=PLHD", "--pages", "1"}, 2,
			"kvreshard write: --src: cp 16 is more than the page's 8 tokens"},
		{[]string{"write", "--store", url, "--model", m, "--src", "tp=2,cp=2,layout=PLHD", "--pages", "1", "--rank", "0/0/2"}, 2,
			"kvreshard write: --rank 0/0/2 is outside tp=2 x pp=1 x cp=2"},
		{[]string{"read", "--store", url, "--model", m, "--dst", "tp=1,cp=4,cp-interleave=2,rank=0/0/4,layout=page_first", "--pages", "1"}, 2,
			"kvreshard read: --dst: rank=0/0/4 is outside tp=1 x pp=1 x cp=4"},
		{[]string{"read", "--store", url, "--model", m, "--dst", "tp=2,rank=0/0,layout=page_first,slot=0", "--pages", "1"}, 2,
			"kvreshard read: --dst: slots and slot are chosen by read: page i goes to slot i of a pool of --pages slots"},
		{[]string{"write", "--store", "file:///dev/null/kv", "--model", m, "--src", "tp=2,layout=PLHD", "--pages", "1"}, 1,
			"kvreshard write: open file store: mkdir /dev/null: not a directory"},
		{[]string{"read", "--store", "file:///dev/null/kv", "--model", m, "--dst", "tp=2,rank=0/0,layout=page_first", "--pages", "1"}, 1,
			"kvreshard read: open file store: mkdir /dev/null: not a directory"},
		{[]string{"read", "--store", fmt.Sprintf("redis://127.0.0.1:%d", port), "--model", m, "--dst", "tp=2,rank=0/0,layout=page_first", "--pages", "1"}, 1,
			fmt.Sprintf("kvreshard read: redis store 127.0.0.1:%d: cannot connect: dial tcp 127.0.0.1:%d: connect: connection refused", port, port)},
	} {
		p := run(t, c.args...)
		require.Equal(t, c.code, p.code, p.String())
		require.Equal(t, c.line+"\n", p.stderr.String(), p.String())
		require.Empty(t, p.stdout.String(), p.String())
	}
	entries, err := os.ReadDir(filepath.Join(dir))
	require.NoError(t, err)
	require.Empty(t, entries, "a usage error touched the store")
}
