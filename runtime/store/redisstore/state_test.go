package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/redistest"
	"github.com/kvreshard/kvreshard/runtime/store"
	"github.com/kvreshard/kvreshard/runtime/store/redisstore"
	"github.com/kvreshard/kvreshard/testkit/storetest"
)

// corruption damages the state of a complete page of two parts with raw
// commands; why is the reason its Object.Err gives.
type corruption struct {
	name   string
	damage func(t *testing.T, do raw, meta, prefix string)
	why    string
}

func hset(field, value string) func(t *testing.T, do raw, meta, prefix string) {
	return func(t *testing.T, do raw, meta, _ string) { do(t, meta, "HSET", meta, field, value) }
}

func hdel(field string) func(t *testing.T, do raw, meta, prefix string) {
	return func(t *testing.T, do raw, meta, _ string) { do(t, meta, "HDEL", meta, field) }
}

var corruptions = []corruption{
	{"meta a list", func(t *testing.T, do raw, meta, _ string) {
		do(t, meta, "DEL", meta)
		do(t, meta, "RPUSH", meta, "x")
	}, "the meta key is a list, not a hash"},
	{"meta a string", func(t *testing.T, do raw, meta, _ string) {
		do(t, meta, "DEL", meta)
		do(t, meta, "SET", meta, "garbage")
	}, "the meta key is a string, not a hash"},
	{"parts garbage", hset("parts", "abc"), `part count "abc" is not a number from 1 to 65536`},
	{"parts huge", hset("parts", "999999999999"), `part count "999999999999" is not a number from 1 to 65536`},
	{"parts past the limit", hset("parts", "65537"), `part count "65537" is not a number from 1 to 65536`},
	{"parts zero", hset("parts", "0"), `part count "0" is not a number from 1 to 65536`},
	{"parts negative", hset("parts", "-1"), `part count "-1" is not a number from 1 to 65536`},
	{"parts exponent", hset("parts", "2e0"), `part count "2e0" is not a number from 1 to 65536`},
	{"parts a MiB", hset("parts", strings.Repeat("7", 1<<20)), `part count "` + strings.Repeat("7", 40) + `" is not a number from 1 to 65536`},
	{"parts missing", hdel("parts"), "no part count"},
	{"done past parts", hset("done", "3"), `count of written parts "3" is not a number from 0 to 2`},
	{"done garbage", hset("done", "two\nlines"), `count of written parts "two\nlines" is not a number from 0 to 2`},
	{"manifest empty", hset("manifest", ""), "no manifest key"},
	{"manifest missing", hdel("manifest"), "no manifest key"},
	{"manifest too long", hset("manifest", strings.Repeat("m", 5000)), "a manifest key of 5000 bytes, longer than 4096"},
	{"mark missing", func(t *testing.T, do raw, meta, _ string) {
		do(t, meta, "HDEL", meta, "w:1")
		do(t, meta, "HSET", meta, "x", "in place of w:1")
	}, "part 1 is counted as written but has no mark"},
	{"a field too many", hset("junk", "1"), "the meta hash holds 7 fields, not the 6 of 2 written parts"},
	{"fields past the limit", func(t *testing.T, do raw, meta, _ string) {
		args := []string{"HSET", meta}
		for i := range 65539 {
			args = append(args, "junk"+strconv.Itoa(i), "1")
		}
		do(t, meta, args...)
	}, "the meta hash holds 65545 fields, more than 65540"},
	{"done under the marks", hset("done", "1"), "the meta hash holds 6 fields, not the 5 of 1 written parts"},
	{"a mark too few", hdel("w:1"), "the meta hash holds 5 fields, not the 6 of 2 written parts"},
	{"mark of the old format", hset("w:0", "0123456789abcdef"), `the mark of part 0 is "0123456789abcdef", not 1`},
	{"mark empty", hset("w:0", ""), `the mark of part 0 is "", not 1`},
	{"part a set", func(t *testing.T, do raw, _, prefix string) {
		do(t, prefix+"1", "DEL", prefix+"1")
		do(t, prefix+"1", "SADD", prefix+"1", "x")
	}, "part 1 is a set, not a string"},
}

// TestUnreadableState damages the state of one page of four, in each way
// of corruptions, on a real server: Query reports it in that page's
// Object.Err and answers for the others (before, it failed the whole
// query); ReadRanges reads the pages before it and stops at it; writes
// to it are refused with the reason until a lease has passed since the
// first refusal, and then it is taken over like an abandoned claim.
func TestUnreadableState(t *testing.T) {
	srv := redistest.StartServer(t)
	testUnreadableState(t, srv.URL(), srv.Addr(), single(srv, 0))
}

func TestUnreadableStateCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	testUnreadableState(t, c.URL(), strings.Join(c.Addrs(), ","), cluster(c))
}

func testUnreadableState(t *testing.T, url, name string, do raw) {
	s := open(t, url)
	defer s.Close()
	ctx := context.Background()
	a0, a1 := storetest.Pattern("a0", 100), storetest.Pattern("a1", 100)
	b0 := storetest.Pattern("b0", 50)
	for i, c := range corruptions {
		t.Run(c.name, func(t *testing.T) {
			var keys []string
			for p := range 4 {
				key := fmt.Sprintf("unreadable_%d_page%d", i, p)
				keys = append(keys, key)
				require.NoError(t, write(t, s, key, "a", 0, a0, a1))
				require.NoError(t, write(t, s, key, "a", 1, a0, a1))
			}
			bad := keys[2]
			meta, prefix, stamp := redisstore.PageKeys(bad)
			c.damage(t, do, meta, prefix)

			want := complete("a", a0, a1)
			objs, err := s.Query(ctx, append(keys, "unreadable_missing"))
			require.NoError(t, err)
			require.Equal(t, []store.Object{want, want, {Err: objs[2].Err}, want, {}}, objs)
			require.EqualError(t, objs[2].Err, fmt.Sprintf("redis store %s: query %s: unreadable state: %s", name, bad, c.why))

			// The pages before it are read; the read stops at it.
			var rs []store.Range
			for _, key := range keys {
				for p := range 2 {
					rs = append(rs, store.Range{Key: key, Part: p, Dst: [][]byte{make([]byte, 100)}, Manifest: "a"})
				}
			}
			n, err := s.ReadRanges(ctx, rs)
			require.Equal(t, 4, n)
			require.EqualError(t, err, fmt.Sprintf("read %s part 0 [0,100): unreadable state: %s", bad, c.why))
			var re *store.RangeError
			require.ErrorAs(t, err, &re)
			for i := range n {
				require.Equal(t, [][]byte{a0, a1}[i%2], rs[i].Dst[0], "range %d", i)
			}

			// Writes of any layout are refused, the others of the batch
			// are done.
			errs := s.WriteParts(ctx, []store.PartWrite{
				{Key: bad, Part: 0, Parts: 2, Manifest: "a", Data: [][]byte{a0}},
				{Key: keys[3] + "_new", Part: 0, Parts: 1, Manifest: "b", Data: [][]byte{b0}},
				{Key: bad, Part: 0, Parts: 1, Manifest: "b", Data: [][]byte{b0}},
			})
			refused := fmt.Sprintf("redis store %s: write %s part 0: unreadable state: %s", name, bad, c.why)
			require.EqualError(t, errs[0], refused)
			require.NoError(t, errs[1])
			require.EqualError(t, errs[2], refused)

			// A lease (10 minutes) after the first refusal, the page is
			// taken over.
			require.Equal(t, int64(1), do(t, stamp, "EXISTS", stamp))
			do(t, stamp, "DECRBY", stamp, "600001")
			require.NoError(t, write(t, s, bad, "b", 0, b0))
			require.Equal(t, []store.Object{complete("b", b0)}, queryAll(t, s, bad))
			require.Equal(t, int64(0), do(t, stamp, "EXISTS", stamp))
			got, err := read(t, s, bad, 0, 50)
			require.NoError(t, err)
			require.Equal(t, b0, got)
		})
	}
}

func queryAll(t *testing.T, s store.Store, keys ...string) []store.Object {
	t.Helper()
	objs, err := s.Query(context.Background(), keys)
	require.NoError(t, err)
	return objs
}

// TestUnreadableStampRefreshed: a refused write does not move the stamp,
// so that refusals do not put the takeover off; a stamp older than two
// leases has expired, and the next refusal stamps again.
func TestUnreadableStampRefreshed(t *testing.T) {
	srv := redistest.StartServer(t)
	do := single(srv, 0)
	s := open(t, srv.URL()+"?lease=1h")
	defer s.Close()
	p := []byte("part")
	require.NoError(t, write(t, s, "stamped", "a", 0, p))
	meta, _, stamp := redisstore.PageKeys("stamped")
	do(t, meta, "HSET", meta, "parts", "x")
	require.Error(t, write(t, s, "stamped", "a", 0, p))
	first := do(t, stamp, "GET", stamp).(string)
	ttl := do(t, stamp, "PTTL", stamp).(int64)
	require.Greater(t, ttl, int64(7100000)) // two hours, in ms, less a minute and more
	require.LessOrEqual(t, ttl, int64(7200000))
	do(t, stamp, "DECRBY", stamp, "3599000") // 59 min 59 s ago
	require.Error(t, write(t, s, "stamped", "a", 0, p))
	v, err := strconv.ParseInt(first, 10, 64)
	require.NoError(t, err)
	require.Equal(t, strconv.FormatInt(v-3599000, 10), do(t, stamp, "GET", stamp))

	// The stamp expires: the next refusal stamps again.
	do(t, stamp, "DEL", stamp)
	require.Error(t, write(t, s, "stamped", "a", 0, p))
	require.Equal(t, int64(1), do(t, stamp, "EXISTS", stamp))
	do(t, stamp, "DECRBY", stamp, "3600001")
	require.NoError(t, write(t, s, "stamped", "a", 0, p))
	require.Equal(t, []store.Object{complete("a", p)}, queryAll(t, s, "stamped"))
}

// TestMetaLimit: a stored metadata object past store.MaxMetaBytes (written
// behind the store's back) is refused without being sent: the server
// sends less than 64 KiB for GetMeta and for a PutMeta that meets it.
func TestMetaLimit(t *testing.T) {
	srv := redistest.StartServer(t)
	s := open(t, srv.URL())
	defer s.Close()
	ctx := context.Background()
	sent := func() int {
		v, err := srv.Do("INFO", "stats")
		require.NoError(t, err)
		m := regexp.MustCompile(`total_net_output_bytes:(\d+)`).FindStringSubmatch(v.(string))
		require.NotNil(t, m)
		n, err := strconv.Atoi(m[1])
		require.NoError(t, err)
		return n
	}
	big := storetest.Pattern("big", 4*store.MaxMetaBytes)
	_, err := srv.Do("SET", "meta:kv/d/manifests/big", string(big))
	require.NoError(t, err)
	before := sent()
	_, err = s.GetMeta(ctx, "kv/d/manifests/big")
	require.EqualError(t, err, fmt.Sprintf("redis store %s: metadata kv/d/manifests/big is 4194304 bytes; the limit is 1048576", srv.Addr()))
	require.Equal(t, store.ErrMetaConflict, s.PutMeta(ctx, "kv/d/manifests/big", []byte("{}")))
	require.Less(t, sent()-before, 64<<10)

	// A metadata key of the wrong type is an error, not a panic.
	_, err = srv.Do("SADD", "meta:kv/d/manifests/set", "x")
	require.NoError(t, err)
	_, err = s.GetMeta(ctx, "kv/d/manifests/set")
	require.ErrorContains(t, err, fmt.Sprintf("redis store %s: get meta kv/d/manifests/set: ", srv.Addr()))
	require.ErrorContains(t, err, "WRONGTYPE")
}

// TestLongManifestKey: a manifest key that the state check would refuse
// is refused by the writer, and nothing is written.
func TestLongManifestKey(t *testing.T) {
	srv := redistest.StartServer(t)
	s := open(t, srv.URL())
	defer s.Close()
	long := strings.Repeat("m", 4097)
	err := write(t, s, "long", long, 0, []byte("x"))
	require.EqualError(t, err, "write long part 0: manifest key of 4097 bytes is longer than 4096")
	require.False(t, errors.Is(err, store.ErrLayoutConflict))
	v, err := srv.Do("DBSIZE")
	require.NoError(t, err)
	require.Equal(t, int64(0), v)
	require.NoError(t, write(t, s, "long", long[:4096], 0, []byte("x")))
	require.Equal(t, []store.Object{complete(long[:4096], []byte("x"))}, queryAll(t, s, "long"))
}
