package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/runtime/store"
)

// testConcurrentLayouts races writers of two layouts on the same keys.
func testConcurrentLayouts(t *testing.T, s store.Store, k keys) {
	a := layout{k.manifest("a"), []int{1000, 2000}}
	b := layout{k.manifest("b"), []int{700, 800, 900}}
	ks := make([]string, 24)
	for i := range ks {
		ks[i] = k.key(fmt.Sprintf("page%d", i))
	}
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	for g := range 8 {
		l := a
		if g%2 == 1 {
			l = b
		}
		wg.Go(func() {
			errc <- RaceWrite(s, l.manifest, l.sizes, ks, uint64(g))
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		require.NoError(t, err)
	}
	CheckRaced(t, s, ks, map[string][]int{a.manifest: a.sizes, b.manifest: b.sizes})
}

// RaceWrite writes every part of every key in one layout, in an order drawn
// from seed, one part per call, with Pattern(manifest/key/part) bytes. A
// write may succeed or give ErrComplete or ErrLayoutConflict; any other
// error is returned. Multi-process tests run it in several processes.
func RaceWrite(s store.Store, manifest string, sizes []int, ks []string, seed uint64) error {
	l := layout{manifest, sizes}
	type kp struct {
		key  string
		part int
	}
	var todo []kp
	for _, key := range ks {
		for p := range sizes {
			todo = append(todo, kp{key, p})
		}
	}
	r := rand.New(rand.NewPCG(seed, 1))
	r.Shuffle(len(todo), func(i, j int) { todo[i], todo[j] = todo[j], todo[i] })
	for _, w := range todo {
		err := s.WriteParts(context.Background(), []store.PartWrite{l.write(w.key, w.part)})[0]
		if err != nil && err != store.ErrComplete && err != store.ErrLayoutConflict {
			return fmt.Errorf("write %s part %d: %w", w.key, w.part, err)
		}
	}
	return nil
}

// CheckRaced checks that every key that RaceWrite wrote with the given
// layouts is complete in exactly one of them, with that layout's bytes.
func CheckRaced(t *testing.T, s store.Store, ks []string, layouts map[string][]int) {
	t.Helper()
	objs := query(t, s, ks...)
	for i, key := range ks {
		sizes, ok := layouts[objs[i].Manifest]
		require.True(t, ok, "%s: %+v", key, objs[i])
		requireStored(t, s, layout{objs[i].Manifest, sizes}, key)
	}
}

func testEmptyInputs(t *testing.T, s store.Store, k keys) {
	ctx := context.Background()
	require.Empty(t, s.WriteParts(ctx, nil))
	objs, err := s.Query(ctx, nil)
	require.NoError(t, err)
	require.Empty(t, objs)
	n, err := s.ReadRanges(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, 0, n)
	n, err = s.ReadRanges(ctx, []store.Range{})
	require.NoError(t, err)
	require.Equal(t, 0, n)
}

// testMetaLimit: PutMeta refuses what no reader accepts, and stores nothing.
func testMetaLimit(t *testing.T, s store.Store, k keys) {
	ctx := context.Background()
	key := k.manifest("limit")
	max := Pattern("max meta", store.MaxMetaBytes)
	require.NoError(t, s.PutMeta(ctx, key, max))
	got, err := s.GetMeta(ctx, key)
	require.NoError(t, err)
	require.Equal(t, max, got)

	over := k.manifest("over")
	err = s.PutMeta(ctx, over, Pattern("over meta", store.MaxMetaBytes+1))
	require.EqualError(t, err, fmt.Sprintf("metadata %s is 1048577 bytes; the limit is 1048576", over))
	_, err = s.GetMeta(ctx, over)
	require.Equal(t, store.ErrNotFound, err)
}
