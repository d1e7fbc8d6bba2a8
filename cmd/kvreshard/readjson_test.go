package main

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/runtime/store"
)

// failReadsOf is a store whose reads fail from the first range of page
// key on (the ranges before it are read): a store that breaks mid-read.
type failReadsOf struct {
	store.Store
	key string
}

func (s *failReadsOf) ReadRanges(ctx context.Context, rs []store.Range) (int, error) {
	for i, r := range rs {
		if r.Key == s.key {
			n, err := s.Store.ReadRanges(ctx, rs[:i])
			if err != nil {
				return n, err
			}
			return i, errors.New("the disk is on fire")
		}
	}
	return s.Store.ReadRanges(ctx, rs)
}

// timings matches the two fields of read --json that vary run to run.
var timings = regexp.MustCompile(`"seconds":[0-9.e+-]+,"gbps":[0-9.e+-]+,`)

// Issue 18, item 4: read --json says "verified": true only when --verify
// was given, every page read verified and the read did not fail: false
// without --verify, after a failed read (it said true) and when a page did
// not verify. A miss, a cache's answer (exit 0), keeps it true for the
// pages read, as the text output's "verified every element".
func TestReadJSONVerified(t *testing.T) {
	dir := t.TempDir()
	url := "file://" + dir
	const model = "layers=2,kv-heads=2,head-dim=4,dtype=fp32,page=2"
	ms, err := parseModel(model)
	require.NoError(t, err)
	keys := content.PageKeys("kvreshard", ms.model.Domain(), 3)
	code, _, stderr := runArgs("write", "--store", url, "--model", model, "--src", "tp=2,layout=PLHD", "--pages", "2")
	require.Equal(t, 0, code, stderr)
	read := func(t *testing.T, e env, pages string, more ...string) (int, string, string) {
		t.Helper()
		code, stdout, stderr := runIn(e, append([]string{"read", "--store", url, "--model", model, "--dst", "tp=1,rank=0/0,layout=page_first",
			"--pages", pages, "--strategy", "direct", "--json"}, more...)...)
		require.Len(t, timings.FindAllString(stdout, -1), 1, stdout)
		return code, timings.ReplaceAllString(stdout, `"seconds":S,"gbps":G,`), stderr
	}
	const miss = "page missing or incomplete: "

	for _, c := range []struct {
		name, pages string
		more        []string
		json        string
	}{
		{"every page verified", "2", []string{"--verify"},
			`{"requested":2,"hit":2,"verified":true,"bytes":512,"ops":32,"seconds":S,"gbps":G,"interpreter_plans":0}`},
		{"without --verify", "2", nil,
			`{"requested":2,"hit":2,"verified":false,"bytes":512,"ops":32,"seconds":S,"gbps":G,"interpreter_plans":0}`},
		{"a miss after the pages read", "3", []string{"--verify"},
			`{"requested":3,"hit":2,"verified":true,"bytes":512,"ops":32,"seconds":S,"gbps":G,"interpreter_plans":0,"stop":"` + miss + keys[2] + `"}`},
		{"a miss at the first page: nothing to verify", "1", []string{"--verify", "--prefix", "other"},
			`{"requested":1,"hit":0,"verified":true,"bytes":0,"ops":0,"seconds":S,"gbps":G,"interpreter_plans":0,"stop":"` + miss +
				content.PageKeys("other", ms.model.Domain(), 1)[0] + `"}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, stdout, stderr := read(t, hostEnv, c.pages, c.more...)
			require.Equal(t, 0, code, stderr)
			require.Empty(t, stderr)
			require.Equal(t, c.json+"\n", stdout)
		})
	}

	// A read that fails at the second page: exit 1, the first page read
	// and verified, the read not.
	t.Run("a failed read", func(t *testing.T) {
		e := wrapStores(func(st store.Store) store.Store { return &failReadsOf{Store: st, key: keys[1]} })
		code, stdout, stderr := read(t, e, "2", "--verify")
		require.Equal(t, 1, code, stderr)
		require.Equal(t, `{"requested":2,"hit":1,"verified":false,"bytes":256,"ops":16,"seconds":S,"gbps":G,"interpreter_plans":0,"stop":"page `+
			keys[1]+`: the disk is on fire"}`+"\n", stdout)
		require.Equal(t, "kvreshard read: read 1 of 2 pages: page "+keys[1]+": the disk is on fire\n", stderr)
	})

	// A page that does not verify (a flipped byte, read unchecked): exit
	// 1, with the page in error.
	require.NoError(t, filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil || !strings.HasPrefix(e.Name(), "part-") {
			return err
		}
		data, err := os.ReadFile(path)
		if err == nil {
			data[0] ^= 1
			err = os.WriteFile(path, data, 0o666)
		}
		return err
	}))
	code, stdout, stderr := read(t, hostEnv, "2", "--verify")
	require.Equal(t, 1, code)
	require.Empty(t, stderr)
	require.Regexp(t, `^\{"requested":2,"hit":2,"verified":false,"bytes":512,"ops":32,"seconds":S,"gbps":G,"interpreter_plans":0,"error":"page 0 \(`+
		keys[0]+`\): [^"\n]+"\}\n$`, stdout)
}

// A store that cannot be opened is still one JSON object on stdout, the
// read not verified, with exit 1 and the reason on stderr too.
func TestReadJSONStoreDown(t *testing.T) {
	want := errors.New("no route to the store")
	e := hostEnv
	e.open = func(context.Context, string) (store.Store, error) { return nil, want }
	code, stdout, stderr := runIn(e, "read", "--store", "mem://", "--model", "layers=2,kv-heads=2,head-dim=4,dtype=fp32,page=2",
		"--dst", "tp=1,rank=0/0,layout=page_first", "--pages", "3", "--json")
	require.Equal(t, 1, code)
	require.Equal(t, `{"requested":3,"hit":0,"verified":false,"bytes":0,"ops":0,"seconds":0,"gbps":0,"interpreter_plans":0,"error":"no route to the store"}`+"\n", stdout)
	require.Equal(t, "kvreshard read: no route to the store\n", stderr)
}
