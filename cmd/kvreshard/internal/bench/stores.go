package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/runtime/kernel"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/reshard"
	"github.com/kvreshard/kvreshard/runtime/store"
	"github.com/kvreshard/kvreshard/runtime/store/filestore"
	"github.com/kvreshard/kvreshard/runtime/store/memstore"
)

// fill fills each writer rank's pool of one slot with the page of seed:
// every page the suite writes has that content.
func (c *case70) fill(ctx context.Context, o *Options) ([]Figure, error) {
	c.pools = map[placement.Rank][][]byte{}
	for _, r := range c.src.Ranks() {
		b, err := plan.BindingFor(c.d, c.src, r, c.poolL, 1)
		if err != nil {
			return nil, err
		}
		g, err := plan.NewGeometry(c.d, b)
		if err != nil {
			return nil, err
		}
		regions := g.NewRegions()
		content.Fill(g, regions, 0, c.seed)
		c.pools[r] = regions
	}
	return nil, nil
}

// write writes the pages of keys as every TP 8 rank, all from slot 0 of
// its pool.
func (c *case70) write(ctx context.Context, st store.Store, keys []string) error {
	slots := make([]int, len(keys))
	for _, r := range c.src.Ranks() {
		part, writes, err := c.src.Writer(c.d, r)
		if err != nil {
			return err
		}
		b, err := plan.BindingFor(c.d, c.src, r, c.poolL, 1)
		if err != nil {
			return err
		}
		w, err := reshard.NewWriter(st, c.m, part, writes, b)
		if err != nil {
			return err
		}
		if err := w.Publish(ctx); err != nil {
			return err
		}
		res, err := w.Write(ctx, keys, slots, c.pools[r])
		if err != nil {
			return err
		}
		for _, pr := range res {
			if pr.Status == reshard.Failed {
				return fmt.Errorf("write %s: %w", pr.Key, pr.Err)
			}
		}
	}
	return nil
}

// reading is one measured read of every page of a run.
type reading struct {
	bytes    int
	best     time.Duration
	ops      int // transport ops of one page
	strategy plan.Strategy
	rd       *reshard.Reader
}

func (r reading) gbps() float64 { return gbps(r.bytes, r.best) }

// reader makes a reader of every page of keys by rank rank of topology t
// with the planner options, reads once, which fills the caches, checks
// the first and last pages element by element, and returns the reading
// without its time and the read to time.
func (c *case70) reader(ctx context.Context, st store.Store, keys []string, t placement.Topology, rank placement.Rank, opts plan.Options) (reading, func() error, error) {
	return c.readerWith(ctx, st, keys, c.m, t, rank, reshard.ReaderOptions{Plan: opts})
}

// readerWith is reader with every reader option, of pages written with
// manifest m.
func (c *case70) readerWith(ctx context.Context, st store.Store, keys []string, m *manifest.Manifest, t placement.Topology, rank placement.Rank, ro reshard.ReaderOptions) (reading, func() error, error) {
	var out reading
	b, err := plan.BindingFor(c.d, t, rank, c.poolL, len(keys))
	if err != nil {
		return out, nil, err
	}
	ro.Plan.RequireCompiled = true
	rd, err := reshard.NewReader(st, c.model.Domain(), c.d, b, ro)
	if err != nil {
		return out, nil, err
	}
	g := rd.Geometry()
	regions := g.NewRegions()
	slots := make([]int, len(keys))
	for i := range slots {
		slots[i] = len(keys) - 1 - i
	}
	once := func() error {
		res, err := rd.Read(ctx, keys, slots, regions)
		if err != nil {
			return err
		}
		if res.Hit != len(keys) {
			return fmt.Errorf("read %d of %d pages: %v", res.Hit, len(keys), res.Stop)
		}
		out.bytes, out.ops = res.Bytes, res.Ops/len(keys)
		return nil
	}
	if err := once(); err != nil {
		return out, nil, err
	}
	for _, s := range []int{slots[0], slots[len(slots)-1]} {
		if err := content.Verify(g, regions, s, c.seed); err != nil {
			return out, nil, fmt.Errorf("tp=%d pp=%d rank %d/%d, after the read: %w", t.TP, t.PP, rank.TP, rank.PP, err)
		}
	}
	tpl, err := rd.Planner().Template(m)
	if err != nil {
		return out, nil, err
	}
	out.strategy, out.rd = tpl.Strategy, rd
	return out, once, nil
}

// auto returns auto planner options on transport t.
func auto(t plan.Transport) plan.Options { return plan.Options{Strategy: plan.Auto, Transport: &t} }

// memory measures reshard_vs_identity_mem.
func (c *case70) memory(ctx context.Context, o *Options) ([]Figure, error) {
	st := memstore.New()
	defer st.Close()
	keys := content.PageKeys("bench-mem", c.model.Domain(), c.sz.memPages)
	if err := c.write(ctx, st, keys); err != nil {
		return nil, err
	}
	tr := plan.MemoryTransport()
	rs, reshardOnce, err := c.reader(ctx, st, keys, c.reshard, placement.Rank{}, auto(tr))
	if err != nil {
		return nil, err
	}
	id, identityOnce, err := c.reader(ctx, st, keys, c.identity, placement.Rank{}, auto(tr))
	if err != nil {
		return nil, err
	}
	// In turns, so that both see the same load: the ratio is the median
	// of the turns'.
	var ratio float64
	if rs.best, id.best, ratio, err = pairwiseErr(3*c.sz.reps, 1, reshardOnce, identityOnce); err != nil {
		return nil, err
	}
	f := Figure{Name: "reshard_vs_identity_mem", Value: round(ratio), Unit: "x", Baseline: round(id.gbps()), BaselineUnit: "GB/s",
		Detail: fmt.Sprintf("%d pages: TP 4/PP 2 rank 0/0 %.2f GB/s (%s, %d ops a page); TP 8 rank 0 %.2f GB/s (%s, %d ops a page); both copying on up to %d goroutines",
			len(keys), rs.gbps(), rs.strategy, rs.ops, id.gbps(), id.strategy, id.ops, runtime.GOMAXPROCS(0))}
	atLeast(&f, 0.8)
	g, err := c.gapped(ctx, st, keys)
	if err != nil {
		return nil, err
	}
	return []Figure{f, g}, nil
}

// gapped measures gapped_vs_contiguous_mem: the source bytes of the
// resharding reader, spans of a token's layers 0-39 that are 10 KiB long
// and 10 KiB apart in two parts, moved by the copy kernels' row mover
// into contiguous memory, against the same mover on one whole part a
// page, as the identity reader reads it. Both split the pages among
// GOMAXPROCS goroutines, as the readers' copy workers do. Neither side
// does any of kvreshard's work (planning, views, layout): the ratio is
// what the access pattern alone costs on the machine, the bound it puts
// on reshard_vs_identity_mem.
func (c *case70) gapped(ctx context.Context, st *memstore.Store, keys []string) (Figure, error) {
	part := c.m.PartBytes(0)
	views := make([][2][]byte, len(keys))
	for i, k := range keys {
		for h := range views[i] {
			v, err := st.ViewPart(ctx, k, h, "")
			if err != nil {
				return Figure{}, err
			}
			views[i][h] = v
		}
	}
	dst := make([]byte, len(keys)*part)
	span, pitch, tokens := c.spans()
	w := runtime.GOMAXPROCS(0)
	spans := func() {
		shares(w, len(views), func(i int) {
			o := i * part
			for _, src := range views[i] {
				for comp := range c.d.HeadDims {
					kernel.Stream2D(dst[o:], span, src[comp*tokens*pitch:], pitch, span, tokens)
					o += tokens * span
				}
			}
		})
	}
	whole := func() {
		shares(w, len(views), func(i int) { kernel.Stream2D(dst[i*part:], part, views[i][0], part, part, 1) })
	}
	spans()
	for h, src := range views[0] {
		for comp := range c.d.HeadDims {
			for t := range tokens {
				at := ((h*len(c.d.HeadDims)+comp)*tokens + t) * span
				from := (comp*tokens + t) * pitch
				if !bytes.Equal(dst[at:at+span], src[from:from+span]) {
					return Figure{}, fmt.Errorf("gapped copy: span %d of part %d differs", comp*tokens+t, h)
				}
			}
		}
	}
	ts, tw, ratio := pairwise(3*c.sz.reps, 1, spans, whole)
	moved := len(keys) * part
	f := Figure{Name: "gapped_vs_contiguous_mem", Value: round(ratio), Unit: "x", Baseline: round(gbps(moved, tw)), BaselineUnit: "GB/s",
		Detail: fmt.Sprintf("the access pattern alone, without kvreshard: the resharding reader's source spans (%d bytes, %d apart, in two parts a page) moved into contiguous memory (%.2f GB/s), against one whole part a page, each on %d goroutines; the bound that pattern puts on reshard_vs_identity_mem here; median of %d turns",
			span, pitch, gbps(moved, ts), w, 3*c.sz.reps)}
	return f, nil
}

// shares runs f(0) ... f(n-1) on w goroutines, each a contiguous share
// of about n/w, and fences their streamed stores.
func shares(w, n int, f func(i int)) {
	var wg sync.WaitGroup
	for s := range w {
		wg.Go(func() {
			for i := s * n / w; i < (s+1)*n/w; i++ {
				f(i)
			}
			kernel.Fence()
		})
	}
	wg.Wait()
}

// file measures reshard_gbps_file, auto_regret_file, checksum_cost and
// checksum_cost_range.
func (c *case70) file(ctx context.Context, o *Options) ([]Figure, error) {
	dir, err := os.MkdirTemp(o.TempDir, "kvreshard-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	st, err := filestore.Open(dir, filestore.Options{})
	if err != nil {
		return nil, err
	}
	defer st.Close()
	keys := content.PageKeys("bench-file", c.model.Domain(), c.sz.pages)
	if err := c.write(ctx, st, keys); err != nil {
		return nil, err
	}
	regret, runs, err := c.regret(ctx, st, keys, plan.FileTransport(), "auto_regret_file")
	if err != nil {
		return nil, err
	}
	rs, dr := runs[regret.pick], runs[plan.Direct]
	sums, err := c.checksumCost(ctx, st, keys)
	if err != nil {
		return nil, err
	}
	ranges, err := c.checksumRange(ctx, st, "bench-file-tp1", plan.FileTransport(), "checksum_cost_range", "the file store")
	if err != nil {
		return nil, err
	}
	return []Figure{{Name: "reshard_gbps_file", Value: round(rs.gbps()), Unit: "GB/s", Baseline: round(dr.gbps()), BaselineUnit: "GB/s",
		Detail: fmt.Sprintf("%d pages from the file store (page cache), TP 4/PP 2 rank 0/0: auto %s (%d ops a page); baseline: direct (%d ops a page); best of %d turns",
			len(keys), rs.strategy, rs.ops, dr.ops, regret.turns)}, regret.fig, sums, ranges}, nil
}

// regretResult is what regret measured: the figure, auto's choice, and
// the turns taken.
type regretResult struct {
	fig   Figure
	pick  plan.Strategy
	turns int
}

// regret measures the figure of a name (auto_regret_file,
// auto_regret_redis): reads of the pages by the resharding reader with
// the plan of each of direct, scatter and staged on transport tr, timed in
// turns (each turn reads with the three, in an order rotated from turn to
// turn, so that the three see the same load), and the best time of the
// strategy auto picks on tr over the best time of the fastest, as the
// suite's other times are bests. Not the median of the turns' ratios to
// the fastest of each turn: when two strategies are about as fast, noise
// makes either the fastest of a turn, and such ratios count it against
// auto; the medians of each strategy's times, given in the detail, swing
// with the load of a shared machine. Auto's plan is the plan of the
// strategy it picks (checked: same strategy and ops), so its time is that
// strategy's. It returns each strategy's reading, with its best time.
func (c *case70) regret(ctx context.Context, st store.Store, keys []string, tr plan.Transport, name string) (regretResult, [plan.Auto]reading, error) {
	var runs [plan.Auto]reading
	var reads [plan.Auto]func() error
	for s := range plan.Auto {
		var err error
		if runs[s], reads[s], err = c.reader(ctx, st, keys, c.reshard, placement.Rank{}, plan.Options{Strategy: s, Transport: &tr}); err != nil {
			return regretResult{}, runs, err
		}
	}
	a, _, err := c.reader(ctx, st, keys, c.reshard, placement.Rank{}, auto(tr))
	if err != nil {
		return regretResult{}, runs, err
	}
	if p := runs[a.strategy]; p.strategy != a.strategy || p.ops != a.ops {
		return regretResult{}, runs, fmt.Errorf("%s: auto's plan (%s, %d ops) is not the %s plan (%d ops)", name, a.strategy, a.ops, p.strategy, p.ops)
	}
	n := 3 * c.sz.reps
	times, err := inTurns(n, reads[:])
	if err != nil {
		return regretResult{}, runs, err
	}
	var wins [plan.Auto]int
	for _, t := range times {
		wins[slices.Index(t, slices.Min(t))]++
	}
	// Each strategy's best and median time over the turns; the fastest
	// is the one of the lowest best time.
	var medians [plan.Auto]time.Duration
	fastest := plan.Direct
	for s := range plan.Auto {
		ts := make([]time.Duration, n)
		for i, t := range times {
			ts[i] = t[s]
		}
		slices.Sort(ts)
		medians[s], runs[s].best = ts[n/2], ts[0]
		if runs[s].best < runs[fastest].best {
			fastest = s
		}
	}
	var each []string
	for s := range plan.Auto {
		each = append(each, fmt.Sprintf("%s %.2f GB/s (median %.2f; %d ops a page; fastest in %d turns)", s, runs[s].gbps(), gbps(runs[s].bytes, medians[s]), runs[s].ops, wins[s]))
	}
	f := Figure{Name: name, Value: round(float64(runs[a.strategy].best) / float64(max(runs[fastest].best, 1))), Unit: "x", Baseline: round(runs[fastest].gbps()), BaselineUnit: "GB/s",
		Detail: fmt.Sprintf("%d pages, TP 4/PP 2 rank 0/0, %s cost model: auto picks %s; %s; the best time of auto's plan over the best of the fastest, %d turns",
			len(keys), tr.Name, a.strategy, strings.Join(each, ", "), n)}
	atMost(&f, 1.1)
	return regretResult{fig: f, pick: a.strategy, turns: n}, runs, nil
}

// inTurns runs the reads n turns, each read once a turn, starting turn i
// with read i mod len(reads), and returns the times of each turn, by
// read.
func inTurns(n int, reads []func() error) ([][]time.Duration, error) {
	times := make([][]time.Duration, n)
	for i := range times {
		times[i] = make([]time.Duration, len(reads))
		for j := range reads {
			k := (i + j) % len(reads)
			start := time.Now()
			if err := reads[k](); err != nil {
				return nil, err
			}
			times[i][k] = time.Since(start)
		}
	}
	return times, nil
}
