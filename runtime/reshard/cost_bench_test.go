package reshard_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/internal/redistest"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/reshard"
	"github.com/kvreshard/kvreshard/runtime/store"
	"github.com/kvreshard/kvreshard/runtime/store/filestore"
)

// model70B is the page of the 70B case of kvreshard bench: 80 layers,
// 8 KV heads, head dim 128, bf16, 64 tokens (20 MiB a page).
var model70B = newModel("model-70b", 80, 8, []int{128, 128}, "bf16", 64)

// model8B is an 8B model's page: 32 layers, 8 KV heads, head dim 128,
// bf16, 64 tokens (8 MiB a page).
var model8B = newModel("model-8b", 32, 8, []int{128, 128}, "bf16", 64)

// BenchmarkChecksumCost reads pages from the file store with every byte
// checked (CheckParts) and, in turns, unchecked, both with auto on the
// file transport, and reports the median of the turns' ratios unchecked
// time/checked time (the checksum_cost figures of kvreshard bench):
//
//   - whole: 4 pages of the 70B case written by TP8 in PLHD, read by rank
//     0/0 of TP4/PP2 into page_first (half of two parts a page, which
//     auto reads on the file store in spans of 10 KiB, 10 KiB apart);
//   - range: 8 pages of the 8B case written by TP1 in PLHD, read by rank
//     0 of TP2 into page_first (half of each part: runs of 1 KiB);
//   - range-70b: the same with 4 pages of the 70B case (20 MiB parts),
//     as checksum_cost_range of kvreshard bench.
func BenchmarkChecksumCost(b *testing.B) {
	for _, c := range []struct {
		name     string
		m        manifest.Model
		pages    int
		src, dst placement.Topology
		redis    bool
	}{
		{"whole", model70B, 4, placement.Topology{TP: 8, PP: 1}, placement.Topology{TP: 4, PP: 2}, false},
		{"range", model8B, 8, placement.Topology{TP: 1, PP: 1}, placement.Topology{TP: 2, PP: 1}, false},
		{"range-70b", model70B, 4, placement.Topology{TP: 1, PP: 1}, placement.Topology{TP: 2, PP: 1}, false},
		{"range-redis", model8B, 8, placement.Topology{TP: 1, PP: 1}, placement.Topology{TP: 2, PP: 1}, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			var st store.Store
			tr := plan.FileTransport()
			if c.redis {
				srv := redistest.StartServer(b)
				var err error
				st, err = store.Open(context.Background(), srv.URL())
				require.NoError(b, err)
				tr = plan.RedisTransport()
			} else {
				fs, err := filestore.Open(b.TempDir(), filestore.Options{})
				require.NoError(b, err)
				st = fs
			}
			b.Cleanup(func() { st.Close() })
			keys := content.PageKeys("bench-cost", c.m.Domain(), c.pages)
			writeAll(b, st, c.m, c.src, "PLHD", keys)
			opts := reshard.ReaderOptions{Plan: plan.Options{Strategy: plan.Auto, Transport: &tr, RequireCompiled: true}, CheckParts: true}
			checked, cregions := newReader(b, st, c.m, c.dst, placement.Rank{}, "page_first", c.pages, opts)
			opts.CheckParts = false
			unchecked, uregions := newReader(b, st, c.m, c.dst, placement.Rank{}, "page_first", c.pages, opts)
			slots := make([]int, c.pages)
			for i := range slots {
				slots[i] = c.pages - 1 - i
			}
			ctx := context.Background()
			var bytes int
			read := func(rd *reshard.Reader, regions [][]byte) time.Duration {
				start := time.Now()
				res, err := rd.Read(ctx, keys, slots, regions)
				d := time.Since(start)
				if err != nil || res.Hit != c.pages {
					b.Fatalf("read %d of %d pages: %v %v", res.Hit, c.pages, err, res.Stop)
				}
				bytes = res.Bytes
				return d
			}
			read(checked, cregions)
			read(unchecked, uregions)
			for i := range c.pages {
				require.NoError(b, verifyPage(checked, cregions, slots[i], keys[i]))
				require.NoError(b, verifyPage(unchecked, uregions, slots[i], keys[i]))
			}
			var ratios []float64
			var tc, tu time.Duration
			for b.Loop() {
				c := read(checked, cregions)
				u := read(unchecked, uregions)
				tc, tu = tc+c, tu+u
				ratios = append(ratios, float64(u)/float64(c))
			}
			slices.Sort(ratios)
			n := float64(len(ratios))
			b.ReportMetric(ratios[len(ratios)/2], "checked/unchecked")
			b.ReportMetric(n*float64(bytes)/tc.Seconds()/1e9, "checked-GB/s")
			b.ReportMetric(n*float64(bytes)/tu.Seconds()/1e9, "unchecked-GB/s")
			require.Positive(b, checked.Stats().PartsChecked)
			require.Zero(b, unchecked.Stats().PartsChecked)
		})
	}
}
