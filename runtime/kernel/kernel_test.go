package kernel_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/runtime/kernel"
)

// registerRuns names each run's pair apart: the registry is global and
// keeps what an earlier run (go test -count=N) registered.
var registerRuns atomic.Int32

func TestRegister(t *testing.T) {
	run := registerRuns.Add(1)
	pair := kernel.Pair{Src: fmt.Sprintf("part(test register %d)", run), Dst: fmt.Sprintf("pool(test register %d)", run)}
	require.Nil(t, kernel.Lookup(pair))
	n := kernel.Registered()
	a := &kernel.Kernels{Pair: pair, Digest: "aaaa", Origin: "a.kvl: x -> y"}
	require.NoError(t, kernel.Register(a))
	require.Equal(t, n+1, kernel.Registered())
	require.Same(t, a, kernel.Lookup(pair))

	// The same lowering again, from another file: a no-op.
	require.NoError(t, kernel.Register(&kernel.Kernels{Pair: pair, Digest: "aaaa", Origin: "b.kvl: x2 -> y2"}))
	require.Same(t, a, kernel.Lookup(pair))
	require.Equal(t, n+1, kernel.Registered())

	// Another lowering of the same pair: an error naming both.
	err := kernel.Register(&kernel.Kernels{Pair: pair, Digest: "bbbb", Origin: "c.kvl: u -> v"})
	require.EqualError(t, err, fmt.Sprintf("kernel: conflicting kernels for part(test register %d) -> pool(test register %d): ", run, run)+
		"a.kvl: x -> y (digest aaaa) and c.kvl: u -> v (digest bbbb)")
	require.Same(t, a, kernel.Lookup(pair))
	require.PanicsWithError(t, err.Error(), func() {
		kernel.MustRegister(&kernel.Kernels{Pair: pair, Digest: "bbbb", Origin: "c.kvl: u -> v"})
	})
}

var concurrentRuns atomic.Int32

// TestRegisterConcurrent registers and looks up pairs from many
// goroutines at once (run with -race): the first registration of a pair
// wins, repeats of its lowering are no-ops, another lowering is an error,
// and a lookup sees nothing or the winner.
func TestRegisterConcurrent(t *testing.T) {
	const workers, pairs = 8, 50
	n := kernel.Registered()
	run := concurrentRuns.Add(1) // -count=N registers new pairs each run
	pair := func(i int) kernel.Pair {
		return kernel.Pair{Src: fmt.Sprintf("part(concurrent %d)", i%pairs), Dst: fmt.Sprintf("pool(run %d)", run)}
	}
	conflicts := make([][workers]bool, pairs)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range pairs {
				// Worker 3 registers another lowering of every pair.
				k := &kernel.Kernels{Pair: pair(i), Digest: "same"}
				if w == 3 {
					k.Digest = "other"
				}
				conflicts[i][w] = kernel.Register(k) != nil
				if got := kernel.Lookup(pair(i + w)); got != nil && got.Pair != pair(i+w) {
					t.Errorf("lookup of %s found %s", pair(i+w), got.Pair)
				}
			}
		}()
	}
	wg.Wait()
	require.Equal(t, n+pairs, kernel.Registered())
	for i := range pairs {
		won := kernel.Lookup(pair(i)).Digest
		for w := range workers {
			lost := (w == 3) != (won == "other")
			require.Equal(t, lost, conflicts[i][w], "pair %d, worker %d, %s won", i, w, won)
		}
	}
}

func TestEmit(t *testing.T) {
	var runs []kernel.Run
	runs = kernel.Emit(runs, kernel.Run{Src: 0, Dst: 100, Len: 8})
	runs = kernel.Emit(runs, kernel.Run{Src: 8, Dst: 108, Len: 8})                // continues both sides
	runs = kernel.Emit(runs, kernel.Run{Src: 16, Dst: 200, Len: 8})               // not the destination
	runs = kernel.Emit(runs, kernel.Run{Src: 24, Dst: 208, Len: 8, DstRegion: 1}) // not the region
	runs = kernel.Emit(runs, kernel.Run{Src: 32, Dst: 216, Len: 8, DstRegion: 1})
	runs = kernel.Emit(runs, kernel.Run{Src: 40, Dst: 224, Len: 8, DstRegion: 1, SrcRegion: 1})
	require.Equal(t, []kernel.Run{
		{Src: 0, Dst: 100, Len: 16},
		{Src: 16, Dst: 200, Len: 8},
		{Src: 24, Dst: 208, Len: 16, DstRegion: 1},
		{Src: 40, Dst: 224, Len: 8, DstRegion: 1, SrcRegion: 1},
	}, runs)
	require.Equal(t, 232, runs[3].End())
}

func TestConsecutiveLayers(t *testing.T) {
	require.True(t, kernel.ConsecutiveLayers(nil))
	require.True(t, kernel.ConsecutiveLayers([]kernel.LayerPair{{Src: 3, Dst: 0}}))
	require.True(t, kernel.ConsecutiveLayers([]kernel.LayerPair{{Src: 3, Dst: 0}, {Src: 4, Dst: 1}, {Src: 5, Dst: 2}}))
	require.False(t, kernel.ConsecutiveLayers([]kernel.LayerPair{{Src: 3, Dst: 0}, {Src: 5, Dst: 1}}))
	require.False(t, kernel.ConsecutiveLayers([]kernel.LayerPair{{Src: 3, Dst: 0}, {Src: 4, Dst: 2}}))
}
