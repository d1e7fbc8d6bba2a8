package filestore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kvreshard/kvreshard/runtime/store"
	"github.com/kvreshard/kvreshard/testkit/storetest"
)

// backend is the conformance suite's view of stores in dir.
func backend(dir string, opts Options) storetest.Backend {
	return storetest.Backend{
		Open: func(t *testing.T) store.Store {
			s, err := Open(dir, opts)
			require.NoError(t, err)
			return s
		},
		OpenLease: func(t *testing.T, lease time.Duration) store.Store {
			o := opts
			o.Lease = lease
			s, err := Open(dir, o)
			require.NoError(t, err)
			return s
		},
		Age: func(t *testing.T, s store.Store, key string, d time.Duration) {
			age(t, s.(*Store), key, d)
		},
		Corrupt: func(t *testing.T, s store.Store, key string) {
			fs := s.(*Store)
			require.NoError(t, os.WriteFile(filepath.Join(fs.objectDir(key), "claim"), []byte("garbage"), 0o666))
			fs.forget(key)
		},
	}
}

// age makes the claim of key look d older.
func age(t *testing.T, s *Store, key string, d time.Duration) {
	path := filepath.Join(s.objectDir(key), "claim")
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.NoError(t, os.Chtimes(path, fi.ModTime().Add(-d), fi.ModTime().Add(-d)))
}

// forget drops what s caches of key.
func (s *Store) forget(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.objs, key)
	for id, f := range s.files {
		if id.key == key && f.refs == 0 {
			unix.Close(f.fd)
			delete(s.files, id)
		}
	}
}

func TestConformance(t *testing.T) {
	dir := t.TempDir() // one directory for all subtests, as many processes would share it
	storetest.RunBackend(t, backend(dir, Options{}))
}

func TestConformanceSyncFewFiles(t *testing.T) {
	storetest.RunBackend(t, backend(t.TempDir(), Options{Sync: true, MaxOpenFiles: 2}))
}

// TestConformanceByURL opens a new store per subtest, as a new process
// would: nothing is cached.
func TestConformanceByURL(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := store.Open(context.Background(), "file://"+dir)
		require.NoError(t, err)
		return s
	})
}

func TestOpenURL(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "new", "store")
	s, err := store.Open(ctx, "file://"+dir)
	require.NoError(t, err)
	require.Equal(t, dir, s.(*Store).Dir())
	require.DirExists(t, dir)
	require.NoError(t, s.Close())

	s, err = store.Open(ctx, "file://localhost"+dir+"/")
	require.NoError(t, err)
	require.Equal(t, dir, s.(*Store).Dir())
	require.Equal(t, store.DefaultLease, s.(*Store).lease)
	require.NoError(t, s.Close())

	require.Equal(t, DefaultLockWait, s.(*Store).lockWait)

	s, err = store.Open(ctx, "file://"+dir+"?lease=90s")
	require.NoError(t, err)
	require.Equal(t, 90*time.Second, s.(*Store).lease)
	require.NoError(t, s.Close())

	s, err = store.Open(ctx, "file://"+dir+"?lock-wait=250ms&lease=1h")
	require.NoError(t, err)
	require.Equal(t, 250*time.Millisecond, s.(*Store).lockWait)
	require.Equal(t, time.Hour, s.(*Store).lease)
	require.NoError(t, s.Close())

	for _, c := range []struct{ url, reason string }{
		{"file://", "empty path; write file:///abs/dir"},
		{"file://localhost", "empty path; write file:///abs/dir"},
		{"file://data/kv", `host "data" is not empty or localhost; write file:///abs/dir, with three slashes`},
		{"file://./kv", `host "." is not empty or localhost; write file:///abs/dir, with three slashes`},
		{"file://host:80/kv", `host "host:80" is not empty or localhost; write file:///abs/dir, with three slashes`},
		{"file:///kv?sync=1", `unknown parameter "sync"; a file URL takes only lease and lock-wait`},
		{"file:///kv?lease=1s&sync=1", `unknown parameter "sync"; a file URL takes only lease and lock-wait`},
		{"file:///kv?lock_wait=1s", `unknown parameter "lock_wait"; a file URL takes only lease and lock-wait`},
		{"file:///kv?lease=1s&lease=1s", "lease is given more than once"},
		{"file:///kv?lease=1", `lease "1" is not a positive duration such as 30s or 10m`},
		{"file:///kv?lease=0s", `lease "0s" is not a positive duration such as 30s or 10m`},
		{"file:///kv?lease=-5m", `lease "-5m" is not a positive duration such as 30s or 10m`},
		{"file:///kv?lease=x%zz", `cannot parse the query: invalid URL escape "%zz"`},
		{"file:///kv?lock-wait=1s&lock-wait=2s", "lock-wait is given more than once"},
		{"file:///kv?lock-wait=1000000h", `lock-wait "1000000h" is more than 10m0s`},
		{"file:///kv?lock-wait=1s&lock-wait=1s", "lock-wait is given more than once"},
		{"file:///kv?lock-wait=5", `lock-wait "5" is not a positive duration such as 500ms or 5s`},
		{"file:///kv?lock-wait=0s", `lock-wait "0s" is not a positive duration such as 500ms or 5s`},
		{"file:///kv?lock-wait=-1s", `lock-wait "-1s" is not a positive duration such as 500ms or 5s`},
		{"file:///kv?lock-wait=", `lock-wait "" is not a positive duration such as 500ms or 5s`},
		{"file:///kv?lock-wait", `lock-wait "" is not a positive duration such as 500ms or 5s`},
		{"file:///kv?lock-wait=1s&lease=1s&lease=2s", "lease is given more than once"},
		{"file:///kv?lock-wait=x&lease=0s", `lease "0s" is not a positive duration such as 30s or 10m`},
		{"file:///kv?lease=1m&lock-wait=1x", `lock-wait "1x" is not a positive duration such as 500ms or 5s`},
		{"file:///kv?", "empty query string; a file URL takes only ?lease= and ?lock-wait="},
		{"file:///kv#x", "a file URL takes no fragment"},
		{"file://me@/kv", "a file URL takes no user"},
	} {
		_, err := store.Open(ctx, c.url)
		require.EqualError(t, err, `store URL "`+c.url+`": `+c.reason)
		var ue *store.URLError
		require.ErrorAs(t, err, &ue)
	}

	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o666))
	_, err = Open(filepath.Join(file, "x"), Options{})
	require.EqualError(t, err, "open file store: mkdir "+file+": not a directory")
}

func TestFileNames(t *testing.T) {
	hash := func(k string) string {
		sum := sha256.Sum256([]byte(k))
		return hex.EncodeToString(sum[:16])
	}
	for _, c := range []struct{ key, name string }{
		{"kv_1f_abc-D", "kv_1f_abc-D." + hash("kv_1f_abc-D")},
		{"../../etc/passwd", "%2E%2E%2F%2E%2E%2Fetc%2Fpasswd." + hash("../../etc/passwd")},
		{"kv/dom/manifests/ab", "kv%2Fdom%2Fmanifests%2Fab." + hash("kv/dom/manifests/ab")},
		{"", "." + hash("")},
		{"a\x00\n\xff é", "a%00%0A%FF%20%C3%A9." + hash("a\x00\n\xff é")},
		{strings.Repeat("x", 1000), strings.Repeat("x", 64) + "." + hash(strings.Repeat("x", 1000))},
		{strings.Repeat("/", 1000), strings.Repeat("%2F", 22) + "." + hash(strings.Repeat("/", 1000))},
	} {
		fanout, name := fileName(c.key)
		require.Equal(t, c.name, name)
		require.Equal(t, hash(c.key)[:2], fanout)
	}
	// Keys that differ only in case get names that differ in more than case.
	_, a := fileName("Page")
	_, b := fileName("page")
	require.NotEqual(t, strings.ToLower(a), strings.ToLower(b))
}

// TestHostileKeys stores objects and metadata under keys that would escape
// a naive mapping, and checks that every file stays inside the store.
func TestHostileKeys(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	dir := filepath.Join(root, "store")
	s, err := Open(dir, Options{})
	require.NoError(t, err)
	defer s.Close()
	keys := []string{"../../etc/passwd", "../x", "/abs", ".", "..", "a/../../b", "\x00", "C:\\x", strings.Repeat("../", 200)}
	for i, k := range keys {
		data := []byte{byte(i), 1, 2}
		require.Equal(t, []error{nil}, s.WriteParts(ctx, []store.PartWrite{{Key: k, Part: 0, Parts: 1, Manifest: "../m", Data: [][]byte{data}}}))
		require.NoError(t, s.PutMeta(ctx, k, data))
	}
	for i, k := range keys {
		data := []byte{byte(i), 1, 2}
		objs, err := s.Query(ctx, []string{k})
		require.NoError(t, err)
		require.Equal(t, []store.Object{{Complete: true, Manifest: "../m", PartSizes: []int{3}}}, objs, "%q", k)
		got := make([]byte, 3)
		n, err := s.ReadRanges(ctx, []store.Range{{Key: k, Dst: [][]byte{got}}})
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, data, got)
		meta, err := s.GetMeta(ctx, k)
		require.NoError(t, err)
		require.Equal(t, data, meta)
	}
	entries, err := os.ReadDir(root)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	files := 0
	require.NoError(t, filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files++
		}
		return err
	}))
	require.Equal(t, 3*len(keys), files) // a claim, a part and a metadata object each
}

func TestInvalidWrite(t *testing.T) {
	s, err := Open(t.TempDir(), Options{})
	require.NoError(t, err)
	defer s.Close()
	errs := s.WriteParts(context.Background(), []store.PartWrite{
		{Key: "k", Part: 0, Parts: 0, Manifest: "m"},
		{Key: "k", Part: 2, Parts: 2, Manifest: "m"},
		{Key: "k", Part: -1, Parts: 2, Manifest: "m"},
		{Key: "k", Part: 0, Parts: 2},
	})
	require.Len(t, errs, 4)
	require.EqualError(t, errs[0], "write k part 0: part count 0 is not positive")
	require.EqualError(t, errs[1], "write k part 2: part out of range [0,2)")
	require.EqualError(t, errs[2], "write k part -1: part out of range [0,2)")
	require.EqualError(t, errs[3], "write k part 0: empty manifest key")
	entries, err := os.ReadDir(filepath.Join(s.Dir(), objectsDir))
	require.NoError(t, err)
	require.Empty(t, entries)
}

func TestClosed(t *testing.T) {
	ctx := context.Background()
	s, err := Open(t.TempDir(), Options{})
	require.NoError(t, err)
	require.Equal(t, []error{nil}, s.WriteParts(ctx, []store.PartWrite{{Key: "k", Part: 0, Parts: 1, Manifest: "m", Data: [][]byte{{1}}}}))
	n, err := s.ReadRanges(ctx, []store.Range{{Key: "k", Dst: [][]byte{make([]byte, 1)}}})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close())
	require.Equal(t, []error{errClosed}, s.WriteParts(ctx, []store.PartWrite{{Key: "k2", Part: 0, Parts: 1, Manifest: "m"}}))
	_, err = s.Query(ctx, []string{"k"})
	require.EqualError(t, err, "store is closed")
	n, err = s.ReadRanges(ctx, []store.Range{{Key: "k", Dst: [][]byte{make([]byte, 1)}}})
	require.Equal(t, 0, n)
	require.EqualError(t, err, "store is closed")
	require.EqualError(t, s.PutMeta(ctx, "m", nil), "store is closed")
	_, err = s.GetMeta(ctx, "m")
	require.EqualError(t, err, "store is closed")
}

func TestReadRangesAllocs(t *testing.T) {
	ctx := context.Background()
	s, err := Open(t.TempDir(), Options{})
	require.NoError(t, err)
	defer s.Close()
	for _, k := range []string{"a", "b"} {
		require.Equal(t, []error{nil, nil}, s.WriteParts(ctx, []store.PartWrite{
			{Key: k, Part: 0, Parts: 2, Manifest: "m", Data: [][]byte{make([]byte, 4096)}},
			{Key: k, Part: 1, Parts: 2, Manifest: "m", Data: [][]byte{make([]byte, 4096)}},
		}))
	}
	var rs []store.Range
	for i := range 32 {
		rs = append(rs, store.Range{Key: []string{"a", "b"}[i/16], Part: i / 8 % 2, Off: i % 8 * 256, Dst: [][]byte{make([]byte, 256)}})
	}
	allocs := testing.AllocsPerRun(100, func() {
		if n, err := s.ReadRanges(ctx, rs); n != len(rs) || err != nil {
			t.Fatal(n, err)
		}
	})
	require.Equal(t, 0.0, allocs)
}

func BenchmarkReadRanges(b *testing.B) {
	s, err := Open(b.TempDir(), Options{})
	require.NoError(b, err)
	defer s.Close()
	storetest.BenchReadRanges(b, s)
}
