package redisstore_test

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/redistest"
	"github.com/kvreshard/kvreshard/runtime/store"
	"github.com/kvreshard/kvreshard/runtime/store/redisstore"
	"github.com/kvreshard/kvreshard/testkit/storetest"
)

func open(t *testing.T, url string) store.Store {
	t.Helper()
	s, err := store.Open(context.Background(), url)
	require.NoError(t, err)
	return s
}

func TestURLErrors(t *testing.T) {
	for _, c := range []struct{ url, reason string }{
		{"redis://", "missing host:port"},
		{"redis://127.0.0.1", `address "127.0.0.1" is not host:port`},
		{"redis://:6379", `address ":6379" is not host:port`},
		{"redis://127.0.0.1:", `address "127.0.0.1:" is not host:port`},
		{"redis://127.0.0.1:0", `address "127.0.0.1:0": port "0" is not a number from 1 to 65535`},
		{"redis://127.0.0.1:6379/x", `database "x" is not a non-negative number`},
		{"redis://127.0.0.1:6379/-1", `database "-1" is not a non-negative number`},
		{"redis://127.0.0.1:6379/01", `database "01" is not a non-negative number`},
		{"redis://127.0.0.1:6379/1/2", `database "1/2" is not a non-negative number`},
		{"redis://127.0.0.1:6379?db=1", `unknown option "db"; the options are ttl and lease`},
		{"redis://127.0.0.1:6379?ttl=10m&ttl=1m", "option ttl given 2 times"},
		{"redis://127.0.0.1:6379?ttl=soon", `ttl "soon" is not a duration of whole milliseconds, at least 1ms, such as 10m`},
		{"redis://127.0.0.1:6379?ttl=-1s", `ttl "-1s" is not a duration of whole milliseconds, at least 1ms, such as 10m`},
		{"redis://127.0.0.1:6379?ttl=1500us", `ttl "1500us" is not a duration of whole milliseconds, at least 1ms, such as 10m`},
		{"redis://127.0.0.1:6379#x", `unexpected fragment "x"`},
		{"redis://a:1,b:2", "a redis URL has one address; use redis+cluster:// for a cluster"},
		{"redis+cluster://a:1,,b:2", `address "" is not host:port`},
		{"redis+cluster://a:1,:2", `address ":2" is not host:port`},
		{"redis+cluster://a:1/0", `a cluster has only database 0; remove the path "/0"`},
		{"redis://127.0.0.1:6379?lease=soon", `lease "soon" is not a positive duration such as 30s or 10m`},
		{"redis://127.0.0.1:6379?lease=0", `lease "0" is not a positive duration such as 30s or 10m`},
		{"redis://127.0.0.1:6379?lease=-1s", `lease "-1s" is not a positive duration such as 30s or 10m`},
		{"redis://127.0.0.1:6379?lease=", `lease "" is not a positive duration such as 30s or 10m`},
		{"redis://127.0.0.1:6379?lease=1m&lease=2m", "option lease given 2 times"},
		{"redis+cluster://a:1?ttl=1m&lease=x", `lease "x" is not a positive duration such as 30s or 10m`},
		{"redis+cluster://a:1?ttl=1m&lease=1m&db=1", `unknown option "db"; the options are ttl and lease`},
	} {
		t.Run(c.url, func(t *testing.T) {
			_, err := store.Open(context.Background(), c.url)
			require.EqualError(t, err, fmt.Sprintf("store URL %q: %s", c.url, c.reason))
			var ue *store.URLError
			require.ErrorAs(t, err, &ue)
		})
	}
}

func TestParseURL(t *testing.T) {
	c, err := redisstore.ParseURL("redis://u:p@127.0.0.1:6380/3?ttl=10m")
	require.NoError(t, err)
	require.Equal(t, redisstore.Config{Addrs: []string{"127.0.0.1:6380"}, DB: 3, Username: "u", Password: "p", TTL: 10 * time.Minute}, c)
	c, err = redisstore.ParseURL("redis+cluster://127.0.0.1:7000,localhost:7001/")
	require.NoError(t, err)
	require.Equal(t, redisstore.Config{Addrs: []string{"127.0.0.1:7000", "localhost:7001"}, Cluster: true}, c)
	c, err = redisstore.ParseURL("redis+cluster://127.0.0.1:7000?lease=30s&ttl=1h")
	require.NoError(t, err)
	require.Equal(t, redisstore.Config{Addrs: []string{"127.0.0.1:7000"}, Cluster: true, Lease: 30 * time.Second, TTL: time.Hour}, c)
	c, err = redisstore.ParseURL("redis://127.0.0.1:6379?lease=1500us")
	require.NoError(t, err)
	require.Equal(t, redisstore.Config{Addrs: []string{"127.0.0.1:6379"}, Lease: 1500 * time.Microsecond}, c)

	c, err = redisstore.ParseURL("redis://[::1]:6379")
	require.NoError(t, err)
	require.Equal(t, redisstore.Config{Addrs: []string{"[::1]:6379"}}, c)

	// The password is not shown in errors.
	_, err = redisstore.ParseURL("redis://u:secret@127.0.0.1:6380/x")
	require.EqualError(t, err, `store URL "redis://u:xxxxx@127.0.0.1:6380/x": database "x" is not a non-negative number`)
}

// closedPort returns a loopback port that nothing listens on.
func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

func TestUnreachable(t *testing.T) {
	addr := closedPort(t)
	// The open fails with the first dial's error, not after retries; no
	// bound on its time (that would depend on the machine's load).
	for _, url := range []string{"redis://" + addr, "redis+cluster://" + addr} {
		_, err := store.Open(context.Background(), url)
		require.EqualError(t, err, fmt.Sprintf("redis store %s: cannot connect: dial tcp %s: connect: connection refused", addr, addr))
	}
}

func TestSingle(t *testing.T) {
	srv := redistest.StartServer(t)

	t.Run("Conformance", func(t *testing.T) {
		storetest.RunBackend(t, backend(srv.URL(), single(srv, 0)))
	})
	t.Run("ConformanceTTL", func(t *testing.T) {
		storetest.RunBackend(t, backend(srv.URL()+"/1?ttl=10m", single(srv, 1)))
	})
	t.Run("WrongMode", func(t *testing.T) {
		_, err := store.Open(context.Background(), "redis+cluster://"+srv.Addr())
		require.EqualError(t, err, fmt.Sprintf("redis store %s: not a cluster node; use redis://", srv.Addr()))
	})
	t.Run("DB", func(t *testing.T) { testDB(t, srv) })
	t.Run("TTL", func(t *testing.T) { testTTL(t, srv) })
	t.Run("Evicted", func(t *testing.T) { testEvicted(t, srv) })
	t.Run("ScriptFlush", func(t *testing.T) { testScriptFlush(t, srv) })
}

// write writes part of key, one of the parts data.
func write(t *testing.T, s store.Store, key, manifest string, part int, data ...[]byte) error {
	t.Helper()
	d := [][]byte{data[part]}
	errs := s.WriteParts(context.Background(), []store.PartWrite{{Key: key, Part: part, Parts: len(data), Manifest: manifest, Data: d}})
	require.Len(t, errs, 1)
	return errs[0]
}

// complete returns what a query of an object written whole with parts
// data, by write, returns.
func complete(manifest string, data ...[]byte) store.Object {
	o := store.Object{Complete: true, Manifest: manifest}
	for _, d := range data {
		o.PartSizes = append(o.PartSizes, len(d))
	}
	return o
}

func query(t *testing.T, s store.Store, key string) store.Object {
	t.Helper()
	objs, err := s.Query(context.Background(), []string{key})
	require.NoError(t, err)
	require.Len(t, objs, 1)
	return objs[0]
}

func read(t *testing.T, s store.Store, key string, part, size int) ([]byte, error) {
	t.Helper()
	b := make([]byte, size)
	n, err := s.ReadRanges(context.Background(), []store.Range{{Key: key, Part: part, Dst: [][]byte{b}}})
	if err != nil {
		require.Equal(t, 0, n)
		return nil, err
	}
	require.Equal(t, 1, n)
	return b, nil
}

// testDB checks that databases are separate.
func testDB(t *testing.T, srv *redistest.Server) {
	s0, s2 := open(t, srv.URL()), open(t, srv.URL()+"/2")
	defer s0.Close()
	defer s2.Close()
	key := "db_page_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	require.NoError(t, write(t, s2, key, "m", 0, []byte("x")))
	require.Equal(t, complete("m", []byte("x")), query(t, s2, key))
	require.Equal(t, store.Object{}, query(t, s0, key))
}

// testTTL checks that page keys expire, that a page whose part expired is a
// miss whose other keys the query deletes, that any layout may then write
// it, and that manifests never expire.
func testTTL(t *testing.T, srv *redistest.Server) {
	s := open(t, srv.URL()+"?ttl=10m")
	defer s.Close()
	ctx := context.Background()
	key := "ttl_page"
	p0, p1 := []byte("part zero"), []byte("part one!")
	require.NoError(t, write(t, s, key, "kv/d/manifests/a", 0, p0, p1))
	require.NoError(t, write(t, s, key, "kv/d/manifests/a", 1, p0, p1))
	require.NoError(t, s.PutMeta(ctx, "kv/d/manifests/a", []byte("{}")))
	want := complete("kv/d/manifests/a", p0, p1)
	require.Equal(t, want, query(t, s, key))

	do := func(args ...string) any {
		t.Helper()
		v, err := srv.Do(args...)
		require.NoError(t, err)
		return v
	}
	for _, k := range []string{"{ttl_page}:3:meta", "{ttl_page}:3:p:0", "{ttl_page}:3:p:1"} {
		ttl := do("PTTL", k).(int64)
		require.Greater(t, ttl, int64(9*time.Minute/time.Millisecond), k)
		require.LessOrEqual(t, ttl, int64(10*time.Minute/time.Millisecond), k)
	}
	require.Equal(t, int64(-1), do("PTTL", "meta:kv/d/manifests/a"))

	// Part 1 expires: the query deletes the rest of the page.
	require.Equal(t, int64(1), do("PEXPIRE", "{ttl_page}:3:p:1", "1"))
	time.Sleep(20 * time.Millisecond)
	require.Equal(t, []string{"{ttl_page}:3:meta", "{ttl_page}:3:p:0"}, keysOf(t, single(srv, 0), "ttl_page"))
	require.Equal(t, store.Object{}, query(t, s, key))
	require.Empty(t, keysOf(t, single(srv, 0), "ttl_page"))
	_, err := read(t, s, key, 0, 9)
	require.EqualError(t, err, "read ttl_page part 0 [0,9): not found")
	require.ErrorIs(t, err, store.ErrNotFound)

	// Its layout writes it whole again.
	require.NoError(t, write(t, s, key, "kv/d/manifests/a", 0, p0, p1))
	require.Equal(t, store.Object{}, query(t, s, key))
	require.NoError(t, write(t, s, key, "kv/d/manifests/a", 1, p0, p1))
	require.Equal(t, want, query(t, s, key))
	got, err := read(t, s, key, 1, 9)
	require.NoError(t, err)
	require.Equal(t, p1, got)
	require.Equal(t, store.ErrComplete, write(t, s, key, "kv/d/manifests/a", 1, p0, p1))

	// The whole page expires: any layout may write it again.
	require.Equal(t, int64(3), do("EVAL", "for _, k in ipairs(KEYS) do redis.call('PEXPIRE', k, 1) end return #KEYS", "3",
		"{ttl_page}:3:meta", "{ttl_page}:3:p:0", "{ttl_page}:3:p:1"))
	time.Sleep(20 * time.Millisecond)
	require.Equal(t, store.Object{}, query(t, s, key))
	require.NoError(t, write(t, s, key, "kv/d/manifests/b", 0, []byte("b")))
	require.Equal(t, complete("kv/d/manifests/b", []byte("b")), query(t, s, key))
	meta, err := s.GetMeta(ctx, "kv/d/manifests/a")
	require.NoError(t, err)
	require.Equal(t, []byte("{}"), meta)
}

// testEvicted checks that a part deleted by the server (eviction) while the
// page is incomplete is written again by a retry; and that when the page
// has been counted complete meanwhile, the query that meets it deletes it,
// and its parts are written again.
func testEvicted(t *testing.T, srv *redistest.Server) {
	s := open(t, srv.URL())
	defer s.Close()
	key := "evicted_page"
	p0, p1 := []byte("zero"), []byte("one")
	evict := func(k string) {
		t.Helper()
		v, err := srv.Do("DEL", k)
		require.NoError(t, err)
		require.Equal(t, int64(1), v)
	}
	require.NoError(t, write(t, s, key, "m", 0, p0, p1))
	evict("{evicted_page}:3:p:0")
	require.NoError(t, write(t, s, key, "m", 0, p0, p1)) // a retry
	require.NoError(t, write(t, s, key, "m", 1, p0, p1))
	require.Equal(t, complete("m", p0, p1), query(t, s, key))

	// Counted complete, then evicted in part: the write that meets it
	// deletes it and claims it as new.
	evict("{evicted_page}:3:p:1")
	require.NoError(t, write(t, s, key, "m", 0, p0, p1))
	require.Equal(t, []string{"{evicted_page}:3:meta", "{evicted_page}:3:p:0"}, keysOf(t, single(srv, 0), key))
	require.Equal(t, store.Object{}, query(t, s, key))
	require.NoError(t, write(t, s, key, "m", 1, p0, p1))
	require.Equal(t, complete("m", p0, p1), query(t, s, key))

	// The query that meets it deletes it.
	evict("{evicted_page}:3:p:1")
	require.Equal(t, store.Object{}, query(t, s, key))
	require.Empty(t, keysOf(t, single(srv, 0), key))
	require.NoError(t, write(t, s, key, "m", 0, p0, p1))
	require.NoError(t, write(t, s, key, "m", 1, p0, p1))
	require.Equal(t, complete("m", p0, p1), query(t, s, key))
	got, err := read(t, s, key, 0, 4)
	require.NoError(t, err)
	require.Equal(t, p0, got)
}

// testScriptFlush checks the EVAL fallback when the server has lost its
// script cache.
func testScriptFlush(t *testing.T, srv *redistest.Server) {
	s := open(t, srv.URL())
	defer s.Close()
	require.NoError(t, write(t, s, "flush_a", "m", 0, []byte("a")))
	v, err := srv.Do("SCRIPT", "FLUSH")
	require.NoError(t, err)
	require.Equal(t, "OK", v)
	require.NoError(t, write(t, s, "flush_b", "m", 0, []byte("b")))
	_, err = srv.Do("SCRIPT", "FLUSH")
	require.NoError(t, err)
	require.Equal(t, complete("m", []byte("a")), query(t, s, "flush_a"))
	_, err = srv.Do("SCRIPT", "FLUSH")
	require.NoError(t, err)
	got, err := read(t, s, "flush_b", 0, 1)
	require.NoError(t, err)
	require.Equal(t, []byte("b"), got)
}

func TestCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)

	t.Run("Conformance", func(t *testing.T) {
		storetest.RunBackend(t, backend(c.URL(), cluster(c)))
	})
	t.Run("OneSeed", func(t *testing.T) {
		s := open(t, "redis+cluster://"+c.Masters[1].Addr())
		require.NoError(t, s.Close())
	})
	t.Run("WrongMode", func(t *testing.T) {
		_, err := store.Open(context.Background(), c.Masters[0].URL())
		require.EqualError(t, err, fmt.Sprintf("redis store %s: a cluster node; use redis+cluster://", c.Masters[0].Addr()))
	})
	t.Run("Spread", func(t *testing.T) { testSpread(t, c) })
}

// testSpread checks that a page's keys share one slot and that pages spread
// over the masters.
func testSpread(t *testing.T, c *redistest.Cluster) {
	s := open(t, c.URL())
	defer s.Close()
	keys := []string{"spread_page_a", "spread_page_b", "spread_page_c", "spread_page_d", "spread_{odd}_e"}
	masters := map[string]bool{}
	for _, key := range keys {
		for p := range 3 {
			require.NoError(t, write(t, s, key, "m", p, []byte("0"), []byte("1"), []byte("2")))
		}
		tag := key
		if key == "spread_{odd}_e" {
			tag = "spread_%7Bodd%7D_e"
		}
		owner, slot, err := c.Owner("{" + tag + "}:3:meta")
		require.NoError(t, err)
		masters[owner.Addr()] = true
		// Every key of the page is on its owner, in one slot.
		v, err := owner.Do("CLUSTER", "GETKEYSINSLOT", strconv.Itoa(slot), "100")
		require.NoError(t, err)
		var got []string
		for _, k := range v.([]any) {
			got = append(got, k.(string))
		}
		sort.Strings(got)
		pre := "{" + tag + "}"
		require.Equal(t, []string{pre + ":3:meta", pre + ":3:p:0", pre + ":3:p:1", pre + ":3:p:2"}, got, key)
		require.Equal(t, complete("m", []byte("0"), []byte("1"), []byte("2")), query(t, s, key))
	}
	require.Len(t, masters, 3, "pages on masters %v", masters)
}
