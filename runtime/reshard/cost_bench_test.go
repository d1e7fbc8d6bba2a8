package reshard_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/runtime/content"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/reshard"
	"github.com/kvreshard/kvreshard/runtime/store/filestore"
)

// model70B is the page of the 70B case of kvreshard bench: 80 layers,
// 8 KV heads, head dim 128, bf16, 64 tokens (20 MiB a page).
var model70B = newModel("model-70b", 80, 8, []int{128, 128}, "bf16", 64)

// BenchmarkChecksumCost is the checksum_cost figure of kvreshard bench:
// 4 pages of the 70B case written by TP8 in PLHD to the file store, read
// by rank 0/0 of TP4/PP2 into a page_first pool with staged reads of the
// two whole parts a page, checked and, in turns, with SkipPartChecks. It
// reports the median of the turns' ratios unchecked time/checked time.
func BenchmarkChecksumCost(b *testing.B) {
	st, err := filestore.Open(b.TempDir(), filestore.Options{})
	require.NoError(b, err)
	b.Cleanup(func() { st.Close() })
	const pages = 4
	keys := content.PageKeys("bench-cost", model70B.Domain(), pages)
	m := writeAll(b, st, model70B, placement.Topology{TP: 8, PP: 1}, "PLHD", keys)
	tr := plan.FileTransport()
	opts := reshard.ReaderOptions{Plan: plan.Options{Strategy: plan.Staged, Transport: &tr, MaxGap: m.PartBytes(0), RequireCompiled: true}}
	topo := placement.Topology{TP: 4, PP: 2}
	checked, cregions := newReader(b, st, model70B, topo, placement.Rank{}, "page_first", pages, opts)
	opts.SkipPartChecks = true
	unchecked, uregions := newReader(b, st, model70B, topo, placement.Rank{}, "page_first", pages, opts)
	slots := []int{3, 2, 1, 0}
	ctx := context.Background()
	read := func(rd *reshard.Reader, regions [][]byte) time.Duration {
		start := time.Now()
		res, err := rd.Read(ctx, keys, slots, regions)
		d := time.Since(start)
		if err != nil || res.Hit != pages || res.Ops != 2*pages {
			b.Fatalf("read %d of %d pages in %d ops: %v %v", res.Hit, pages, res.Ops, err, res.Stop)
		}
		return d
	}
	read(checked, cregions)
	read(unchecked, uregions)
	for i := range pages {
		require.NoError(b, verifyPage(checked, cregions, slots[i], keys[i]))
		require.NoError(b, verifyPage(unchecked, uregions, slots[i], keys[i]))
	}
	// Each turn reads pipelined and not, checked and not.
	var ratios, serialRatios, gains []float64
	var tc, tu, sc, su time.Duration
	for b.Loop() {
		c := read(checked, cregions)
		u := read(unchecked, uregions)
		reshard.SetPipeline(b, false)
		c2 := read(checked, cregions)
		u2 := read(unchecked, uregions)
		reshard.SetPipeline(b, true)
		tc, tu, sc, su = tc+c, tu+u, sc+c2, su+u2
		ratios = append(ratios, float64(u)/float64(c))
		serialRatios = append(serialRatios, float64(u2)/float64(c2))
		gains = append(gains, float64(c2)/float64(c))
	}
	med := func(s []float64) float64 { slices.Sort(s); return s[len(s)/2] }
	n := float64(len(ratios))
	bytes := n * pages * float64(m.PartBytes(0))
	b.ReportMetric(med(ratios), "checked/unchecked")
	b.ReportMetric(med(serialRatios), "serial-checked/unchecked")
	b.ReportMetric(med(gains), "pipelined/serial-checked")
	b.ReportMetric(bytes/tc.Seconds()/1e9, "checked-GB/s")
	b.ReportMetric(bytes/tu.Seconds()/1e9, "unchecked-GB/s")
	b.ReportMetric(bytes/sc.Seconds()/1e9, "serial-checked-GB/s")
	b.ReportMetric(bytes/su.Seconds()/1e9, "serial-unchecked-GB/s")
	require.Positive(b, checked.Stats().PartsChecked)
	require.Zero(b, unchecked.Stats().PartsChecked)
}
