package enginestore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/runtime/store"
	. "github.com/kvreshard/kvreshard/runtime/store/enginestore"
	"github.com/kvreshard/kvreshard/testkit/enginetest"
	"github.com/kvreshard/kvreshard/testkit/storetest"
)

func engineOf(s store.Store) *enginetest.Engine { return EngineOf(s).(*enginetest.Engine) }

// TestConformance runs the store conformance suite on the in-memory
// engine, reads and writes through registered memory only.
func TestConformance(t *testing.T) {
	open := func(t *testing.T, lease time.Duration) store.Store {
		return New(enginetest.New(), Options{Lease: lease})
	}
	storetest.RunBackend(t, storetest.Backend{
		Open:      func(t *testing.T) store.Store { return open(t, 0) },
		OpenLease: open,
		Age: func(t *testing.T, s store.Store, key string, d time.Duration) {
			e := engineOf(s)
			require.NoError(t, AgeClaim(s, key, d, e.Value, e.Set))
		},
		Corrupt: func(t *testing.T, s store.Store, key string) {
			engineOf(s).Set(DoneKey(key), []byte("garbage"))
			Forget(s, key)
		},
		LeaseFromClaim: true,
	})
}

// write writes part p of a page of parts parts of size bytes each, under
// manifest m, with the bytes of fill(p).
func write(t *testing.T, s store.Store, key, m string, p, parts, size int) error {
	t.Helper()
	return s.WriteParts(context.Background(), []store.PartWrite{{Key: key, Part: p, Parts: parts, Manifest: m, Data: [][]byte{fill(m, key, p, size)}}})[0]
}

func fill(m, key string, p, size int) []byte {
	b := make([]byte, size)
	seed := m + "/" + key + "/" + strconv.Itoa(p)
	for i := range b {
		b[i] = seed[i%len(seed)] ^ byte(i)
	}
	return b
}

func query(t *testing.T, s store.Store, keys ...string) []store.Object {
	t.Helper()
	objs, err := s.Query(context.Background(), keys)
	require.NoError(t, err)
	return objs
}

// TestObjects: a page is kept as its claim, parts named by their manifest
// and a commit, with exactly these keys.
func TestObjects(t *testing.T) {
	e := enginetest.New()
	s := New(e, Options{})
	require.NoError(t, write(t, s, "page", "kv/d/manifests/a", 1, 2, 100))
	d := ManifestDigest("kv/d/manifests/a")
	require.Equal(t, []string{"page/claim", "page/p/" + d + "/1"}, e.Keys("page"))
	require.Equal(t, []store.Object{{}}, query(t, s, "page"))
	require.NoError(t, write(t, s, "page", "kv/d/manifests/a", 0, 2, 100))
	require.Equal(t, []string{"page/claim", "page/done", "page/p/" + d + "/0", "page/p/" + d + "/1"}, e.Keys("page"))
	require.Equal(t, "kv/d/manifests/a\n100 100", string(e.Value("page/done")))
	parts, m, err := ClaimOf(e.Value("page/claim"))
	require.NoError(t, err)
	require.Equal(t, 2, parts)
	require.Equal(t, "kv/d/manifests/a", m)
	require.NoError(t, s.PutMeta(context.Background(), "kv/d/manifests/a", []byte("{}")))
	require.Equal(t, "{}", string(e.Value("meta/kv/d/manifests/a")))
}

// TestLostPart: a part that vanished under a page's commit (eviction) is a
// miss, never a partial page; the store then drops the page whole (its
// parts, commit and claim), so that the page is written again instead of
// skipped, every part of it anew.
func TestLostPart(t *testing.T) {
	e := enginetest.New()
	s := New(e, Options{})
	const m = "kv/d/manifests/a"
	for p := range 2 {
		require.NoError(t, write(t, s, "page", m, p, 2, 64))
	}
	require.True(t, query(t, s, "page")[0].Complete)
	e.Evict(PartKey("page", ManifestDigest(m), 1))
	got := make([]byte, 64)
	n, err := s.ReadRanges(context.Background(), []store.Range{
		{Key: "page", Part: 0, Dst: [][]byte{got}, Manifest: m},
		{Key: "page", Part: 1, Dst: [][]byte{make([]byte, 64)}, Manifest: m},
	})
	require.Equal(t, 1, n)
	require.Equal(t, fill(m, "page", 0, 64), got)
	require.ErrorIs(t, err, store.ErrNotFound)
	require.EqualError(t, err, "read page part 1 [0,64): engine: read: not found")
	require.Equal(t, []store.Object{{}}, query(t, s, "page"), "the page is a miss")
	require.Empty(t, e.Keys("page"), "parts, commit and claim gone")
	// Written again, it reads again.
	require.NoError(t, write(t, s, "page", m, 1, 2, 64))
	require.Equal(t, []store.Object{{}}, query(t, s, "page"), "one part of two")
	require.NoError(t, write(t, s, "page", m, 0, 2, 64))
	require.True(t, query(t, s, "page")[0].Complete)
	require.Equal(t, store.ErrComplete, write(t, s, "page", m, 0, 2, 64))
}

// TestPutMetaLostOnce: a manifest the engine lists but has lost (a holder
// that died) is kept by a put and not found when read back; the engine
// drops it then, and PutMeta puts it again. Lost each time, it is an error.
func TestPutMetaLostOnce(t *testing.T) {
	const key, meta = "kv/d/manifests/a", "meta/kv/d/manifests/a"
	for _, c := range []struct {
		losses int
		err    string
		puts   int
	}{
		{1, "", 2},
		{2, "engine: put meta " + key + ": stored but not found when read back", 2},
	} {
		e := enginetest.New()
		s := New(e, Options{})
		lost := 0
		e.Hook = func(call string, keys []string) error {
			if call == "Get" && keys[0] == meta && lost < c.losses {
				lost++
				e.Evict(meta)
			}
			return nil
		}
		err := s.PutMeta(context.Background(), key, []byte("{}"))
		if c.err == "" {
			require.NoError(t, err)
			require.Equal(t, "{}", string(e.Value(meta)))
		} else {
			require.EqualError(t, err, c.err)
		}
		require.Equal(t, c.puts, e.Calls("Put"))
	}
}

// TestLostCommit: a commit that vanished (eviction) makes its page a miss;
// the next write of a part of it commits it again.
func TestLostCommit(t *testing.T) {
	e := enginetest.New()
	s := New(e, Options{})
	const m = "kv/d/manifests/a"
	for p := range 2 {
		require.NoError(t, write(t, s, "page", m, p, 2, 64))
	}
	require.True(t, query(t, s, "page")[0].Complete)
	e.Evict(DoneKey("page"))
	require.Equal(t, []store.Object{{}}, query(t, s, "page"))
	require.NoError(t, write(t, s, "page", m, 0, 2, 64), "a retry of a part is written (kept)")
	require.Equal(t, []store.Object{{Complete: true, Manifest: m, PartSizes: []int{64, 64}}}, query(t, s, "page"))
}

// TestLayoutsRace: writers of two layouts race for the same pages from
// many goroutines: each page completes in one layout, with that layout's
// bytes in every part, never a mix.
func TestLayoutsRace(t *testing.T) {
	e := enginetest.New()
	s := New(e, Options{})
	layouts := []struct {
		m     string
		parts int
	}{{"kv/d/manifests/a", 2}, {"kv/d/manifests/b", 3}}
	const pages = 40
	var wg sync.WaitGroup
	for _, l := range layouts {
		for p := range l.parts {
			wg.Go(func() {
				for i := range pages {
					err := write(t, s, "page"+strconv.Itoa(i), l.m, p, l.parts, 96)
					if err != nil && !errors.Is(err, store.ErrLayoutConflict) && !errors.Is(err, store.ErrComplete) {
						t.Errorf("page %d: %v", i, err)
					}
				}
			})
		}
	}
	wg.Wait()
	for i := range pages {
		key := "page" + strconv.Itoa(i)
		o := query(t, s, key)[0]
		require.True(t, o.Complete, key)
		parts := map[string]int{layouts[0].m: 2, layouts[1].m: 3}[o.Manifest]
		require.Len(t, o.PartSizes, parts)
		for p := range parts {
			got := make([]byte, 96)
			n, err := s.ReadRanges(context.Background(), []store.Range{{Key: key, Part: p, Dst: [][]byte{got}, Manifest: o.Manifest}})
			require.NoError(t, err)
			require.Equal(t, 1, n)
			require.Equal(t, fill(o.Manifest, key, p, 96), got, "%s part %d", key, p)
		}
	}
}

// TestRegisteredMemory: with an engine that transfers only to and from
// registered memory, reads into memory that is not registered go through
// the store's bounce buffers, pieces of them across buffers too; reads
// into registered memory and the store's own go straight in.
func TestRegisteredMemory(t *testing.T) {
	e := enginetest.New()
	e.RequireRegistered = true
	s := New(e, Options{})
	const m = "kv/d/manifests/a"
	size := BounceBytes + BounceBytes/2
	pool, err := s.Alloc(2 * size)
	require.NoError(t, err)
	for p := range 2 {
		copy(pool[p*size:], fill(m, "page", p, size))
		err := s.WriteParts(context.Background(), []store.PartWrite{{Key: "page", Part: p, Parts: 2, Manifest: m, Data: [][]byte{pool[p*size : (p+1)*size]}}})[0]
		require.NoError(t, err)
	}
	plain := make([]byte, 2*size)
	n, err := s.ReadRanges(context.Background(), []store.Range{
		{Key: "page", Part: 0, Dst: [][]byte{plain[:size]}},
		{Key: "page", Part: 1, Off: 10, Dst: [][]byte{plain[size : 2*size-10]}},
	})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, fill(m, "page", 0, size), plain[:size])
	require.Equal(t, fill(m, "page", 1, size)[10:], plain[size:2*size-10])
	reads := e.Calls("Read")
	require.Equal(t, 3, reads, "12 MiB less 10 bytes, in rounds of a 4 MiB bounce buffer")

	clear(pool)
	n, err = s.ReadRanges(context.Background(), []store.Range{{Key: "page", Part: 1, Dst: [][]byte{pool[:size]}}})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, fill(m, "page", 1, size), pool[:size])
	require.Equal(t, reads+1, e.Calls("Read"))
	s.Free(pool)
	require.NoError(t, s.Close())
	require.Zero(t, e.Registered(), "every mapping unregistered")
}

// TestReadTimeout: an engine read that does not return in time fails the
// read within the timeout; the store's memory it may still write into
// stays mapped and registered until it returns, even once freed; and with
// a timeout, reads into a caller's registered memory go through the
// store's own.
func TestReadTimeout(t *testing.T) {
	e := enginetest.New()
	release := make(chan struct{})
	var hang sync.Once
	s := New(e, Options{ReadTimeout: 100 * time.Millisecond})
	const m = "kv/d/manifests/a"
	require.NoError(t, write(t, s, "page", m, 0, 1, 4096))
	stage, err := s.Alloc(4096)
	require.NoError(t, err)
	e.Hook = func(call string, keys []string) error {
		if call == "Read" {
			hang.Do(func() { <-release })
		}
		return nil
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		n, err := s.ReadRanges(context.Background(), []store.Range{{Key: "page", Part: 0, Dst: [][]byte{stage}}})
		require.Zero(t, n)
		require.EqualError(t, err, "read page part 0 [0,4096): engine: read: the engine's read of 1 ranges did not return within 100ms")
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the read did not fail at its timeout")
	}
	registered := e.Registered()
	s.Free(stage)
	require.Equal(t, registered, e.Registered(), "freed, but the engine may write into it: still registered")
	close(release)
	require.Eventually(t, func() bool { return e.Registered() == registered-4096 }, time.Minute, time.Millisecond)

	// A caller's registered memory is read through a bounce buffer.
	e.RequireRegistered = true
	pool := make([]byte, 4096)
	require.NoError(t, s.Register(pool))
	reads := e.Calls("Read")
	n, err := s.ReadRanges(context.Background(), []store.Range{{Key: "page", Part: 0, Dst: [][]byte{pool}}})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, fill(m, "page", 0, 4096), pool)
	require.Equal(t, reads+1, e.Calls("Read"))
	require.NoError(t, s.Unregister(pool))
}

// TestEngineErrors: an engine's failure is the batch's error, naming the
// store and the call; a corrupt claim is refused until the lease passes.
func TestEngineErrors(t *testing.T) {
	e := enginetest.New()
	s := New(e, Options{Name: "mooncake 127.0.0.1:1"})
	e.Hook = func(call string, keys []string) error {
		if call == "Exists" {
			return errors.New("rpc failed (-900)")
		}
		return nil
	}
	_, err := s.Query(context.Background(), []string{"a"})
	require.EqualError(t, err, "mooncake 127.0.0.1:1: query: rpc failed (-900)")
	err = write(t, s, "a", "kv/d/manifests/a", 0, 1, 10)
	require.EqualError(t, err, "mooncake 127.0.0.1:1: write: mooncake 127.0.0.1:1: query: rpc failed (-900)")
	e.Hook = nil
	e.Set(ClaimKey("b"), []byte("not a claim"))
	now := time.Unix(1e9, 0)
	SetClock(s, func() time.Time { return now }, time.Minute)
	// Unparsable claims carry no time: they are replaced.
	require.NoError(t, write(t, s, "b", "kv/d/manifests/a", 0, 1, 10))
	require.True(t, query(t, s, "b")[0].Complete)
	err = ParseClaim([]byte(strings.Repeat("1", 30) + " 5\nm"))
	require.EqualError(t, err, fmt.Sprintf("corrupt claim %.60q: part count %.20q", strings.Repeat("1", 30)+" 5\nm", strings.Repeat("1", 30)))
}
