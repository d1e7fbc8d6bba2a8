package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/internal/spec"
	"github.com/kvreshard/kvreshard/runtime/reshard"
)

// A Go function that C calls runs on a goroutine locked to the C thread,
// as a goroutine that called runtime.LockOSThread: these benchmarks run
// the library's Go side on such a goroutine ("locked", what C and Python
// get) and on a plain one ("go", a Go program), in the same process.

// BenchmarkForkJoin is one group of copies of a read: start a copy
// worker, copy a share on the calling goroutine, wait for the worker.
// On a locked goroutine the wait gives the thread's P away and takes it
// back through two thread wakeups; on a plain one the worker's thread
// runs the waiting goroutine itself.
func BenchmarkForkJoin(b *testing.B) {
	src, dst := make([]byte, 1<<20), make([]byte, 1<<20)
	for _, share := range []int{4 << 10, 512 << 10} {
		for _, locked := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/share=%dKiB", lockedName(locked), share>>10), func(b *testing.B) {
				onThread(locked, func() {
					for b.Loop() {
						var wg sync.WaitGroup
						wg.Go(func() { copy(dst[:share], src[:share]) })
						copy(dst[512<<10:512<<10+share], src[512<<10:512<<10+share])
						wg.Wait()
					}
				})
			})
		}
	}
}

func lockedName(locked bool) string {
	if locked {
		return "locked"
	}
	return "go"
}

// onThread runs f on the calling goroutine, locked to its thread while f
// runs when locked is set.
func onThread(locked bool, f func()) {
	if locked {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	}
	f()
}

// The 70B-size page of python -m kvreshard.bench: 80 layers, 8 KV heads,
// head dim 128, bf16, 64 tokens, written by TP 8 in PLHD, read by rank 0/0
// of TP 4 x PP 2 into a page_first pool.
var bench70B = modelArgs{layers: 80, kvHeads: 8, headDim: 128, page: 64, dtype: "bf16",
	name: "bench-70b", revision: "0", namespace: "kvreshard"}

// BenchmarkRead70B reads the 70B-size pages of python -m kvreshard.bench
// from the file store at $KVRESHARD_BENCH_URL (with the --pages it was
// written with in $KVRESHARD_BENCH_PAGES, default 64), or from 16 pages
// it writes into a temporary file store, each way in the same process:
//
//	go            reshard's Read on a plain goroutine (a Go program)
//	locked        reshard's Read on a locked goroutine (C before offload)
//	locked-lib    the library's read on a locked goroutine (C now)
//	locked-cw1    the library's read, one copy worker, locked goroutine
//
// It reports each mode's median read in ms and its ratio to go's (the
// ratios are the figures: the machine's load moves absolute times), go's
// best read (to compare with python -m kvreshard.bench's read_seconds,
// a best), and the goroutines a read starts.
func BenchmarkRead70B(b *testing.B) {
	url, pages := os.Getenv("KVRESHARD_BENCH_URL"), 64
	if url == "" {
		url, pages = "file://"+b.TempDir(), 16
		write70B(b, url, pages)
	} else if v := os.Getenv("KVRESHARD_BENCH_PAGES"); v != "" {
		_, err := fmt.Sscan(v, &pages)
		require.NoError(b, err)
	}
	sh, err := openStore(url)
	require.NoError(b, err)
	defer closeStore(sh)
	model, err := buildModel(bench70B)
	require.NoError(b, err)
	pa := placementArgs{tp: 4, pp: 2, ppLayers: []int{40, 40}}
	a, _ := testPool(b, "page_first", &model.Descriptor, pa, pages)
	keys := content.PageKeys(spec.KeyPrefix, model.Domain(), pages)
	slots := make([]int, pages)
	for i := range slots {
		slots[i] = pages - 1 - i
	}

	cw := int64(runtime.GOMAXPROCS(0))
	modes := []struct {
		name    string
		locked  bool
		lib     bool
		workers int64
	}{
		{"go", false, false, cw}, {"locked", true, false, cw}, {"locked-lib", true, true, cw}, {"locked-cw1", true, true, 1},
	}
	// A reader a mode, on the one pool (the reads take turns), each with
	// its caches filled by a first read.
	rhs := make([]*readerHandle, len(modes))
	for m, c := range modes {
		rv, err := openReader(sh, bench70B, pa, a)
		require.NoError(b, err)
		rh, err := lookup[*readerHandle](rv, "reader")
		require.NoError(b, err)
		defer rh.close(rv, "reader")
		require.NoError(b, rh.setOptions(rv, readerOptions{copyWorkers: c.workers, maxPages: 0, maxBytes: 0}))
		res, err := rh.read(keys, slots)
		require.NoError(b, err)
		require.Equal(b, pages, res.Hit, "%v", res.Stop)
		rhs[m] = rh
	}
	// One read of each mode an iteration, the first mode rotating, so
	// that the load the machine has at a time weighs on every mode alike;
	// each mode's median.
	times := make([][]time.Duration, len(modes))
	started := make([]uint64, len(modes))
	for it := 0; b.Loop(); it++ {
		for k := range modes {
			m := (it + k) % len(modes)
			c, rh := modes[m], rhs[m]
			onThread(c.locked, func() {
				g0 := goroutinesStarted()
				t0 := time.Now()
				var r reshard.Result
				var err error
				if c.lib {
					r, err = rh.read(keys, slots)
				} else {
					r, err = rh.r.Read(context.Background(), keys, slots, rh.regions)
				}
				times[m] = append(times[m], time.Since(t0))
				started[m] += goroutinesStarted() - g0
				if err != nil || r.Hit != pages {
					b.Fatalf("%s: read %d of %d pages: %v %v", c.name, r.Hit, pages, err, r.Stop)
				}
			})
		}
	}
	med := make([]float64, len(modes))
	for m, c := range modes {
		slices.Sort(times[m])
		med[m] = float64(times[m][len(times[m])/2].Microseconds()) / 1e3
		b.ReportMetric(med[m], c.name+"-ms")
	}
	for m, c := range modes[1:] {
		b.ReportMetric(med[m+1]/med[0], c.name+"/go")
	}
	b.ReportMetric(float64(times[0][0].Microseconds())/1e3, "go-best-ms")
	// The copy workers started by a read: one a group of copies run on
	// two workers, each a join of the calling goroutine.
	b.ReportMetric(float64(started[0])/float64(len(times[0])), "workers/read")
	b.ReportMetric(float64(started[2])/float64(len(times[2])), "lib-goroutines/read")
	b.ReportMetric(0, "ns/op")
}

// goroutinesStarted returns the goroutines the process started so far.
func goroutinesStarted() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// write70B writes pages pages of bench70B into the store at url, as the
// eight TP ranks of python -m kvreshard.bench --write do.
func write70B(b testing.TB, url string, pages int) {
	sh, err := openStore(url)
	require.NoError(b, err)
	defer closeStore(sh)
	model, err := buildModel(bench70B)
	require.NoError(b, err)
	keys := content.PageKeys(spec.KeyPrefix, model.Domain(), pages)
	for tp := range 8 {
		pa := placementArgs{tp: 8, pp: 1, tpRank: tp}
		a, regs := testPool(b, "page_first", &model.Descriptor, pa, pages)
		wv, err := openWriter(sh, bench70B, pa, a, "PLHD")
		require.NoError(b, err)
		wh, err := lookup[*writerHandle](wv, "writer")
		require.NoError(b, err)
		slots := make([]int, pages)
		for i, k := range keys {
			content.Fill(wh.w.Geometry(), regs, i, content.Seed(k))
			slots[i] = i
		}
		st := make([]uint8, pages)
		_, err = wh.write(keys, slots, st)
		require.NoError(b, err)
		require.Equal(b, make([]uint8, pages), st, "statuses of TP rank %d", tp)
		require.NoError(b, wh.close(wv, "writer"))
	}
}
