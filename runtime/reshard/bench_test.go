package reshard_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/reshard"
	"github.com/kvreshard/kvreshard/runtime/store"
	"github.com/kvreshard/kvreshard/runtime/store/filestore"
	"github.com/kvreshard/kvreshard/runtime/store/memstore"
)

// like70B has the page shape of a 70B model (8 KV heads, head dim 128, bf16,
// 64 tokens) with 8 layers instead of 80, to keep memory modest: 2 MiB a
// page. A TP8 rank and a TP4/PP2 rank each hold 256 KiB of it.
var like70B = newModel("like-70b", 8, 8, []int{128, 128}, "bf16", 64)

const benchPages = 32

// BenchmarkRead reads benchPages pages written by TP8 in PLHD, in the same
// run, (a) resharded: by rank 0/0 of TP4/PP2 into a page_first pool, and
// (b) identity: by rank 0 of TP8 into a page_first pool (the layout PLHD
// comes from), the same number of bytes. It reports each one's GB/s and
// pages/s and the ratio resharded/identity (target >= 0.8 on the memory
// store), for the default strategy (direct) and each other strategy of the
// resharded reader. The two reads alternate, so that load on the machine
// falls on both alike.
func BenchmarkRead(b *testing.B) {
	for _, s := range []struct {
		name      string
		open      func(b *testing.B) store.Store
		transport plan.Transport
	}{
		{"mem", func(b *testing.B) store.Store { return memstore.New() }, plan.MemoryTransport()},
		{"file", func(b *testing.B) store.Store {
			st, err := filestore.Open(b.TempDir(), filestore.Options{})
			require.NoError(b, err)
			b.Cleanup(func() { st.Close() })
			return st
		}, plan.FileTransport()},
	} {
		b.Run(s.name, func(b *testing.B) {
			st := s.open(b)
			tp8 := placement.Topology{TP: 8, PP: 1}
			keys := content.PageKeys("bench", like70B.Domain(), benchPages)
			writeAll(b, st, like70B, tp8, "PLHD", keys)
			ident, iregions := newReader(b, st, like70B, tp8, placement.Rank{}, "page_first", benchPages, reshard.ReaderOptions{})
			for _, strategy := range []struct {
				name string
				s    plan.Strategy
			}{{"direct", plan.Direct}, {"scatter", plan.Scatter}, {"staged", plan.Staged}, {"auto", plan.Auto}} {
				b.Run(strategy.name, func(b *testing.B) {
					opts := reshard.ReaderOptions{Plan: plan.Options{Strategy: strategy.s, Transport: &s.transport}}
					resh, rregions := newReader(b, st, like70B, placement.Topology{TP: 4, PP: 2}, placement.Rank{}, "page_first", benchPages, opts)
					benchPair(b, keys, [2]string{"resharded", "identity"}, resh, rregions, ident, iregions)
				})
			}
		})
	}
}

// BenchmarkCopyWorkers reads benchPages pages of the memory store, as the
// resharding reader of BenchmarkRead with auto (whole parts viewed, the
// copy kernels moving the bytes), on GOMAXPROCS copy workers and on one,
// alternating, and reports each one's GB/s and the ratio
// parallel/serial.
func BenchmarkCopyWorkers(b *testing.B) {
	st := memstore.New()
	keys := content.PageKeys("bench-workers", like70B.Domain(), benchPages)
	writeAll(b, st, like70B, placement.Topology{TP: 8, PP: 1}, "PLHD", keys)
	tr := plan.MemoryTransport()
	opts := reshard.ReaderOptions{Plan: plan.Options{Strategy: plan.Auto, Transport: &tr}}
	par, pregions := newReader(b, st, like70B, placement.Topology{TP: 4, PP: 2}, placement.Rank{}, "page_first", benchPages, opts)
	opts.CopyWorkers = 1
	ser, sregions := newReader(b, st, like70B, placement.Topology{TP: 4, PP: 2}, placement.Rank{}, "page_first", benchPages, opts)
	benchPair(b, keys, [2]string{"parallel", "serial"}, par, pregions, ser, sregions)
}

// benchPair times reads of keys by resh and by ident, alternating, and
// reports their metrics under names[0] and names[1].
func benchPair(b *testing.B, keys []string, names [2]string, resh *reshard.Reader, rregions [][]byte, ident *reshard.Reader, iregions [][]byte) {
	slots := iota(len(keys))
	ctx := context.Background()
	read := func(rd *reshard.Reader, regions [][]byte) (reshard.Result, time.Duration) {
		start := time.Now()
		res, err := rd.Read(ctx, keys, slots, regions)
		d := time.Since(start)
		if err != nil || res.Hit != len(keys) {
			b.Fatalf("read %d of %d pages: %v %v", res.Hit, len(keys), err, res.Stop)
		}
		return res, d
	}
	// Check both once, before timing.
	rr, _ := read(resh, rregions)
	ir, _ := read(ident, iregions)
	require.Equal(b, ir.Bytes, rr.Bytes, "the two reads move the same bytes")
	for _, i := range []int{0, len(keys) - 1} {
		require.NoError(b, verifyPage(resh, rregions, i, keys[i]))
		require.NoError(b, verifyPage(ident, iregions, i, keys[i]))
	}

	var tr, ti time.Duration
	n := 0
	for b.Loop() {
		if n%2 == 0 {
			_, d := read(resh, rregions)
			tr += d
			_, d = read(ident, iregions)
			ti += d
		} else {
			_, d := read(ident, iregions)
			ti += d
			_, d = read(resh, rregions)
			tr += d
		}
		n++
	}
	bytes := float64(n) * float64(rr.Bytes)
	pages := float64(n * len(keys))
	r, i := names[0], names[1]
	b.ReportMetric(bytes/tr.Seconds()/1e9, r+"-GB/s")
	b.ReportMetric(bytes/ti.Seconds()/1e9, i+"-GB/s")
	b.ReportMetric(pages/tr.Seconds(), r+"-pages/s")
	b.ReportMetric(pages/ti.Seconds(), i+"-pages/s")
	b.ReportMetric(ti.Seconds()/tr.Seconds(), r+"/"+i)
	b.ReportMetric(float64(rr.Ops)/float64(len(keys)), r+"-ops/page")
	b.ReportMetric(float64(ir.Ops)/float64(len(keys)), i+"-ops/page")
}
