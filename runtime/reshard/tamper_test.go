package reshard_test

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/redistest"
	"github.com/kvreshard/kvreshard/runtime/store"
	"github.com/kvreshard/kvreshard/runtime/store/filestore"
	"github.com/kvreshard/kvreshard/runtime/store/memstore"
	_ "github.com/kvreshard/kvreshard/runtime/store/redisstore" // redis://
)

// backend is a store under test, with what a test needs to corrupt the
// bytes it keeps.
type backend struct {
	name string
	st   store.Store
	dir  string            // file: the store's directory
	srv  *redistest.Server // redis: the server
}

// forEachBackend runs f on a new memstore, a new filestore, and a store on
// a new redis-server (skipped when redis-server is not installed).
func forEachBackend(t *testing.T, f func(t *testing.T, b backend)) {
	t.Run("mem", func(t *testing.T) { f(t, backend{name: "mem", st: memstore.New()}) })
	t.Run("file", func(t *testing.T) {
		dir := t.TempDir()
		st, err := filestore.Open(dir, filestore.Options{})
		require.NoError(t, err)
		t.Cleanup(func() { st.Close() })
		f(t, backend{name: "file", st: st, dir: dir})
	})
	t.Run("redis", func(t *testing.T) {
		srv := redistest.StartServer(t)
		st, err := store.Open(context.Background(), srv.URL())
		require.NoError(t, err)
		t.Cleanup(func() { st.Close() })
		f(t, backend{name: "redis", st: st, srv: srv})
	})
}

// flipStored flips the bits of byte off of part part of key where the
// backend keeps it: in the part's file of a filestore (found by its bytes,
// which the test wrote), with SETRANGE on the part's Redis key. A memstore
// keeps parts in memory that no one may change; it reports false.
func flipStored(t testing.TB, b backend, key string, part int, data []byte, off int) bool {
	t.Helper()
	switch b.name {
	case "file":
		var found []string
		require.NoError(t, filepath.WalkDir(b.dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			f, err := os.ReadFile(path)
			if err == nil && bytes.Contains(f, data) {
				found = append(found, path)
			}
			return err
		}))
		require.Len(t, found, 1, "files holding part %d of %s", part, key)
		f, err := os.ReadFile(found[0])
		require.NoError(t, err)
		at := bytes.Index(f, data) + off
		fh, err := os.OpenFile(found[0], os.O_WRONLY, 0)
		require.NoError(t, err)
		_, err = fh.WriteAt([]byte{f[at] ^ 0x40}, int64(at))
		require.NoError(t, err)
		require.NoError(t, fh.Close())
		return true
	case "redis":
		c := redisClient(t, b.srv)
		ctx := context.Background()
		k := "{" + key + "}:3:p:" + strconv.Itoa(part) // redisstore's key of a part
		got, err := c.Do(ctx, c.B().Get().Key(k).Build()).AsBytes()
		require.NoError(t, err)
		require.Equal(t, data, got, "redis key %s", k)
		require.NoError(t, c.Do(ctx, c.B().Setrange().Key(k).Offset(int64(off)).Value(string([]byte{got[off] ^ 0x40})).Build()).Error())
		return true
	}
	return false
}

// deleteStored deletes part part of key from a Redis store, as an eviction
// would.
func deleteStored(t testing.TB, srv *redistest.Server, key string, part int) {
	t.Helper()
	c := redisClient(t, srv)
	n, err := c.Do(context.Background(), c.B().Del().Key("{"+key+"}:3:p:"+strconv.Itoa(part)).Build()).AsInt64()
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
}

func redisClient(t testing.TB, srv *redistest.Server) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

// tamper wraps a store: it records the parts written through it, and
// changes writes as a corrupt disk or a forged claim would.
type tamper struct {
	store.Store
	mu    sync.Mutex
	parts map[partID]store.PartWrite // what was written, data gathered
	// flip flips the byte at the offset it gives of the stored bytes (data
	// and checksums) of the parts it names, after the writer computed their
	// checksums; claim writes the parts of the keys it names under another
	// manifest key, keeping their checksums; copyFrom writes the parts it
	// names with the bytes written before for the same part of another key.
	flip     map[partID]int
	claim    map[string]string
	copyFrom map[partID]string
}

type partID struct {
	key  string
	part int
}

// tamperViewer is a tamper of a store that lends its parts.
type tamperViewer struct{ *tamper }

func (t tamperViewer) ViewPart(ctx context.Context, key string, part int, manifest string) ([]byte, error) {
	return t.Store.(store.Viewer).ViewPart(ctx, key, part, manifest)
}

// newTamper wraps st; the result lends parts when st does.
func newTamper(st store.Store) (store.Store, *tamper) {
	tp := &tamper{Store: st, parts: map[partID]store.PartWrite{}, flip: map[partID]int{}, claim: map[string]string{}, copyFrom: map[partID]string{}}
	if _, ok := st.(store.Viewer); ok {
		return tamperViewer{tp}, tp
	}
	return tp, tp
}

func (tp *tamper) WriteParts(ctx context.Context, ws []store.PartWrite) []error {
	tp.mu.Lock()
	out := make([]store.PartWrite, len(ws))
	for i, w := range ws {
		data := bytes.Join(w.Data, nil)
		w.Data = [][]byte{data}
		tp.parts[partID{w.Key, w.Part}] = w
		if from, ok := tp.copyFrom[partID{w.Key, w.Part}]; ok {
			w.Data = tp.parts[partID{from, w.Part}].Data
		}
		if off, ok := tp.flip[partID{w.Key, w.Part}]; ok {
			data = bytes.Clone(w.Data[0])
			data[off] ^= 0x40
			w.Data = [][]byte{data}
		}
		if m, ok := tp.claim[w.Key]; ok {
			w.Manifest = m
		}
		out[i] = w
	}
	tp.mu.Unlock()
	return tp.Store.WriteParts(ctx, out)
}

// written returns what was written of part part of key.
func (tp *tamper) written(t testing.TB, key string, part int) store.PartWrite {
	t.Helper()
	tp.mu.Lock()
	defer tp.mu.Unlock()
	w, ok := tp.parts[partID{key, part}]
	require.True(t, ok, "part %d of %s was not written", part, key)
	return w
}
