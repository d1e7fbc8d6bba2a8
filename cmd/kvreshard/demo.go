package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/internal/content"
	_ "github.com/kvreshard/kvreshard/layouts"
	"github.com/kvreshard/kvreshard/runtime/kernel"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/reshard"
	_ "github.com/kvreshard/kvreshard/runtime/store/filestore"
	_ "github.com/kvreshard/kvreshard/runtime/store/memstore"
	_ "github.com/kvreshard/kvreshard/runtime/store/redisstore"
)

// The demo's model: small enough to run in seconds, with uneven PP stages
// for TP1/PP3 (12 layers: 4/4/4) and TP2/PP2 (6/6), and K and V head dims
// that differ.
const demoModel = "layers=12,kv-heads=4,head-dim=64,v-head-dim=32,dtype=bf16,page=16,name=demo"

func demoCmd(e env, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("demo", stderr)
	storeURL := fs.String("store", "", "store `URL` (default: a file store in a new temporary directory)")
	pages := intFlag(fs, "pages", 16, "`pages` per writer layout")
	strategy := fs.String("strategy", "auto", "how readers move the bytes: direct, scatter, staged or auto (the store's cost model chooses)")
	costs := fs.String("costs", "", "cost models `file` from bench --calibrate --out (default: the configured ones)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *pages < 1 {
		return usagef("--pages %d: need at least one page", *pages)
	}
	ms, err := parseModel(demoModel)
	if err != nil {
		return err
	}
	d := &ms.model.Descriptor
	if err := e.checkPages("--pages", *pages, d.PageBytes()); err != nil {
		return err
	}
	ctx := context.Background()
	url := *storeURL
	if url == "" {
		dir, err := os.MkdirTemp("", "kvreshard-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		url = "file://" + dir
	}
	ropts, err := readOptions(url, *strategy)
	if err != nil {
		return err
	}
	if err := applyCosts(&ropts.Plan, *costs); err != nil {
		return err
	}
	st, err := e.openStore(ctx, url)
	if err != nil {
		return err
	}
	defer st.Close()
	domain := ms.model.Domain()
	fmt.Fprintf(stdout, "kvreshard demo: store %s\n", url)
	fmt.Fprintf(stdout, "model: %d layers, %d KV heads, K/V head dims %d/%d, %s, page %d tokens (%d bytes a page)\n",
		len(d.Layers), d.KVHeads, d.HeadDims[0], d.HeadDims[1], d.Dtype, d.PageSize, d.PageBytes())
	fmt.Fprintf(stdout, "readers: strategy %s on the %s transport's cost model; ops are store reads\n\n", *strategy, ropts.Plan.Transport.Name)

	type topo struct {
		name string
		t    placement.Topology
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "writer\tpart layout\treader\tpool layout\tpages\tbytes\tops\ttime\tGB/s\tverified\t")
	failed, reads := 0, 0
	// run writes the pages of w in part layout partName and reads them back
	// as every rank of r into each pool layout, verifying every element.
	run := func(w topo, partName string, r topo, pools []string) error {
		pl, err := kernel.LayoutNamed(partName)
		if err != nil {
			return err
		}
		m, err := plan.ManifestFor(domain, d, w.t, pl)
		if err != nil {
			return err
		}
		keys := content.PageKeys(fmt.Sprintf("demo-%s-%s", strings.ReplaceAll(w.name, "/", ""), partName), domain, *pages)
		for _, rank := range w.t.Ranks() {
			if _, err := writeRank(ctx, st, m, w.t, rank, poolFor(pl), keys); err != nil {
				return fmt.Errorf("%s rank %s writing %s: %w", w.name, rankName(w.t, rank), partName, err)
			}
		}
		for _, poolName := range pools {
			pool, err := kernel.LayoutNamed(poolName)
			if err != nil {
				return err
			}
			var bytes, ops, hit int
			var elapsed time.Duration
			ok := true
			for _, rank := range r.t.Ranks() {
				b, err := plan.BindingFor(d, r.t, rank, pool, *pages)
				if err != nil {
					return err
				}
				rd, err := reshard.NewReader(st, domain, d, b, ropts)
				if err != nil {
					return err
				}
				regions := rd.Geometry().NewRegions()
				slots := make([]int, len(keys))
				for i := range slots {
					slots[i] = len(keys) - 1 - i // pages land in reverse slot order
				}
				start := time.Now()
				res, err := rd.Read(ctx, keys, slots, regions)
				elapsed += time.Since(start)
				if err != nil {
					return err
				}
				bytes += res.Bytes
				ops += res.Ops
				hit += res.Hit
				if res.Hit != len(keys) {
					fmt.Fprintf(stderr, "%s rank %s read %d of %d pages: %v\n", r.name, rankName(r.t, rank), res.Hit, len(keys), res.Stop)
					ok = false
				}
				for i := 0; i < res.Hit; i++ {
					if err := content.Verify(rd.Geometry(), regions, slots[i], content.Seed(keys[i])); err != nil {
						fmt.Fprintf(stderr, "%s rank %s page %d: %v\n", r.name, rankName(r.t, rank), i, err)
						ok = false
						break
					}
				}
			}
			reads++
			if !ok {
				failed++
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%.2f\t%v\t\n", w.name, partName, r.name, poolName,
				hit/len(r.t.Ranks()), bytes, ops, elapsed.Round(time.Microsecond), gbps(bytes, elapsed), ok)
		}
		return nil
	}
	topos := []topo{{"TP1/PP3", placement.Topology{TP: 1, PP: 3}}, {"TP2/PP2", placement.Topology{TP: 2, PP: 2}}}
	// Every registered part layout, read into every registered pool layout:
	// the built-ins (layouts/builtin.kvl).
	pools := kernel.LayoutsOf(ir.Pool)
	for wi, w := range topos {
		for _, partName := range kernel.LayoutsOf(ir.Part) {
			if err := run(w, partName, topos[1-wi], pools); err != nil {
				return err
			}
		}
	}
	// Context parallelism: a writer whose CP ranks hold alternate tokens,
	// read by ranks that each hold a contiguous quarter of the page.
	cpW := topo{"TP2/CP2", placement.Topology{TP: 2, PP: 1, CP: 2, Interleave: 1}}
	cpR := topo{"TP1/CP4", placement.Topology{TP: 1, PP: 1, CP: 4, Interleave: 4}}
	if err := run(cpW, "PLHD", cpR, []string{"page_first"}); err != nil {
		return err
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if failed > 0 {
		fmt.Fprintf(stdout, "\n%d of %d reads did not verify\n", failed, reads)
		return errFailed
	}
	_, err = fmt.Fprintf(stdout, "\nevery byte of every page verified, by every reader rank, in both directions and across context parallelism.\n")
	return err
}

func gbps(bytes int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(bytes) / d.Seconds() / 1e9
}
