package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/internal/redistest"
	"github.com/kvreshard/kvreshard/runtime/store"
)

// evictModel has pages of 64 KiB.
const evictModel = "layers=4,kv-heads=4,head-dim=64,dtype=bf16,page=16"

// Issue 18, defect 5, on the command line: on a Redis of 2 MiB under
// allkeys-lru, 100 pages of 64 KiB written TP2/PP2 are evicted in part
// and their manifest with them; read then exits 0 and names the miss
// (before, a page whose manifest was gone made it exit 1, "manifest
// rejected"). Once the server has room, write puts the manifest back and
// every page reads and verifies. With the manifest deleted (DEL) under
// complete pages, read names it, exit 0, and the next write restores it.
func TestReadEvictedRedis(t *testing.T) {
	srv := redistest.StartServer(t, "--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru")
	url := srv.URL()
	ms, err := parseModel(evictModel)
	require.NoError(t, err)
	keys := content.PageKeys("kvreshard", ms.model.Domain(), 100)
	write := func() string {
		t.Helper()
		code, stdout, stderr := runArgs("write", "--store", url, "--model", evictModel, "--src", "tp=2,pp=2,layout=PLHD", "--pages", "100")
		require.Equal(t, 0, code, stderr)
		require.Empty(t, stderr)
		for _, r := range []string{"0/0", "1/0", "0/1", "1/1"} {
			require.Regexp(t, `(?m)^rank `+r+`: \d+ written, \d+ already complete, 0 refused \(another layout\), 0 replica in \S+$`, stdout)
		}
		return stdout
	}
	read := func(more ...string) (int, string, string) {
		t.Helper()
		return runArgs(append([]string{"read", "--store", url, "--model", evictModel, "--dst", "tp=1,rank=0/0,layout=page_first", "--pages", "100", "--verify"}, more...)...)
	}
	readJSONOf := func() readJSON {
		t.Helper()
		code, stdout, stderr := read("--json")
		require.Equal(t, 0, code, stderr)
		require.Empty(t, stderr)
		var res readJSON
		require.NoError(t, json.Unmarshal([]byte(stdout), &res), stdout)
		res.Seconds, res.GBps, res.Ops, res.Bytes = 0, 0, 0, 0
		return res
	}

	out := write()
	m := regexp.MustCompile(`(?m)^manifest sha256:[0-9a-f]{64} \(PLHD\): (\S+)$`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	manifestKey := m[1]
	notStored := func(key string) string {
		return fmt.Sprintf("page %s: page missing or incomplete: manifest %s is not in the store", key, manifestKey)
	}

	// Under eviction: a miss, exit 0, and what was read verifies.
	res := readJSONOf()
	require.True(t, res.Verified)
	require.Less(t, res.Hit, 100)
	q := regexp.QuoteMeta(keys[res.Hit])
	require.Regexp(t, "^(page missing or incomplete: "+q+`(: read `+q+` part \d \[\d+,\d+\): not found)?|`+regexp.QuoteMeta(notStored(keys[res.Hit]))+")$", res.Stop)

	// Evict the manifest: other keys until it has gone.
	filler := strings.Repeat("f", 64<<10)
	for i := 0; ; i++ {
		n, err := srv.Do("EXISTS", "meta:"+manifestKey)
		require.NoError(t, err)
		if n == int64(0) {
			break
		}
		require.Less(t, i, 10000, "the manifest is still there")
		_, err = srv.Do("SET", fmt.Sprintf("filler:%d", i), filler)
		require.NoError(t, err)
	}
	// Stop evicting, so that what read meets is what the query below
	// finds: page 0 missing, or complete without its manifest.
	_, err = srv.Do("CONFIG", "SET", "maxmemory", "0")
	require.NoError(t, err)
	st, err := store.Open(context.Background(), url)
	require.NoError(t, err)
	defer st.Close()
	objs, err := st.Query(context.Background(), keys[:1])
	require.NoError(t, err)
	want := "page missing or incomplete: " + keys[0]
	if objs[0].Complete {
		want = notStored(keys[0])
	}
	t.Logf("page 0 complete: %v", objs[0].Complete)
	require.Equal(t, readJSON{Requested: 100, Verified: true, Stop: want}, readJSONOf())
	code, stdout, stderr := read()
	require.Equal(t, 0, code, stderr)
	require.Empty(t, stderr)
	require.Regexp(t, `^read 0 of 100 pages: 0 bytes in 0 ops, \S+ \([\d.]+ GB/s\)\nstopped: `+regexp.QuoteMeta(want)+`\n$`, stdout)

	// With room, write puts the manifest back: every page reads.
	write()
	require.Equal(t, readJSON{Requested: 100, Hit: 100, Verified: true}, readJSONOf())

	// The manifest deleted under complete pages: a miss that names it.
	n, err := srv.Do("DEL", "meta:"+manifestKey)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	code, stdout, stderr = read()
	require.Equal(t, 0, code, stderr)
	require.Empty(t, stderr)
	require.Regexp(t, `^read 0 of 100 pages: 0 bytes in 0 ops, \S+ \([\d.]+ GB/s\)\nstopped: `+regexp.QuoteMeta(notStored(keys[0]))+`\n$`, stdout)
	out = write()
	require.Contains(t, out, "rank 1/1: 0 written, 100 already complete, 0 refused (another layout), 0 replica in ")
	code, stdout, stderr = read()
	require.Equal(t, 0, code, stderr)
	require.Empty(t, stderr)
	require.Regexp(t, `^read 100 of 100 pages: 6553600 bytes in \d+ ops, \S+ \([\d.]+ GB/s\)\nverified every element of 100 pages\n$`, stdout)
}

// On a full Redis under noeviction, write exits 1 with the server's OOM
// error for the first part it refused; the ranks after it do not write,
// so every page is a miss (6.25 MiB of pages do not fit in 2 MiB: the
// last rank is never reached).
func TestWriteFullRedis(t *testing.T) {
	srv := redistest.StartServer(t, "--maxmemory", "2mb", "--maxmemory-policy", "noeviction")
	url := srv.URL()
	ms, err := parseModel(evictModel)
	require.NoError(t, err)
	keys := content.PageKeys("kvreshard", ms.model.Domain(), 100)
	code, stdout, stderr := runArgs("write", "--store", url, "--model", evictModel, "--src", "tp=2,pp=2,layout=PLHD", "--pages", "100")
	require.Equal(t, 1, code, stdout)
	m := regexp.MustCompile(`^kvreshard write: rank (\d/\d): write (\S+): redis store ` + regexp.QuoteMeta(srv.Addr()) +
		`: write (\S+) part (\d): OOM command not allowed when used memory > 'maxmemory'\. script: [0-9a-f]{40}, on @user_script:\d+\.\n$`).FindStringSubmatch(stderr)
	require.NotNil(t, m, stderr)
	require.Equal(t, m[2], m[3])
	require.Contains(t, keys, m[2])
	require.NotEqual(t, "1/1", m[1], "the last rank")
	require.NotContains(t, stdout, "rank "+m[1]+":")

	code, stdout, stderr = runArgs("read", "--store", url, "--model", evictModel, "--dst", "tp=1,rank=0/0,layout=page_first", "--pages", "100", "--json")
	require.Equal(t, 0, code, stderr)
	var res readJSON
	require.NoError(t, json.Unmarshal([]byte(stdout), &res), stdout)
	require.Equal(t, 0, res.Hit)
	require.Equal(t, "page missing or incomplete: "+keys[0], res.Stop)
}
