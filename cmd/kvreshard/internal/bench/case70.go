package bench

import (
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/internal/content"
	_ "github.com/kvreshard/kvreshard/layouts"
	"github.com/kvreshard/kvreshard/runtime/kernel"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/testkit/kerneltest"
)

// case70 is the 70B-size page of the suite: 80 layers, 8 KV heads, head
// dim 128, bf16, 64 tokens (20 MiB a page), written by TP 8 in PLHD; the
// resharding reader is rank 0/0 of TP 4 x PP 2 (layers 0-39, heads 0-1:
// 2.5 MiB a page) and the identity reader rank 0 of TP 8 (all layers, head
// 0: as many bytes), both into page_first pools.
type case70 struct {
	sz       sizes
	model    manifest.Model
	d        *manifest.Descriptor
	src      placement.Topology
	reshard  placement.Topology
	identity placement.Topology
	partL    *ir.Layout
	poolL    *ir.Layout
	m        *manifest.Manifest
	seed     uint64

	// pools holds each writer rank's pool, every slot filled with the
	// content of seed (fill).
	pools map[placement.Rank][][]byte
}

func newCase70(sz sizes) (*case70, error) {
	d := manifest.Descriptor{KVHeads: 8, HeadDims: []int{128, 128}, Dtype: "bf16", ItemSize: 2, PageSize: 64}
	for i := range 80 {
		d.Layers = append(d.Layers, i)
	}
	c := &case70{sz: sz, model: manifest.Model{Namespace: "kvreshard", ModelID: "bench-70b", Revision: "0", Descriptor: d},
		src: placement.Topology{TP: 8, PP: 1}, reshard: placement.Topology{TP: 4, PP: 2}, identity: placement.Topology{TP: 8, PP: 1},
		seed: content.Seed("bench-70b")}
	c.d = &c.model.Descriptor
	var err error
	if c.partL, err = kernel.LayoutNamed("PLHD"); err != nil {
		return nil, err
	}
	if c.poolL, err = kernel.LayoutNamed("page_first"); err != nil {
		return nil, err
	}
	if c.m, err = plan.ManifestFor(c.model.Domain(), c.d, c.src, c.partL); err != nil {
		return nil, err
	}
	return c, nil
}

// spans describes the source spans of the resharding reader in each of
// its two parts, for each component: tokens spans of span bytes (a
// token's layers 0-39 of the part's head), pitch bytes apart (all 80
// layers).
func (c *case70) spans() (span, pitch, tokens int) {
	span = len(c.d.Layers) / 2 * c.d.HeadDims[0] * c.d.ItemSize
	return span, 2 * span, c.d.PageSize
}

// planner returns a planner of the resharding reader with one slot.
func (c *case70) planner(opts plan.Options) (*plan.Planner, error) {
	b, err := plan.BindingFor(c.d, c.reshard, placement.Rank{}, c.poolL, 1)
	if err != nil {
		return nil, err
	}
	return plan.NewPlanner(c.d, b, opts)
}

// problem is the kernel problem of moving part (head) h of the page into
// the resharding reader's pool.
func (c *case70) problem(h int) *kernel.Problem {
	p := &kernel.Problem{ItemSize: 2, PageSize: 64, Dims: c.d.HeadDims,
		Src: kernel.Buffer{Layers: 80, Heads: 1, Slots: 1, Packed: true}, Dst: kernel.Buffer{Layers: 40, Heads: 2, Slots: 1},
		SrcHead: 0, DstHead: h, Heads: 1}
	for l := range 40 {
		p.Layers = append(p.Layers, kernel.LayerPair{Src: int32(l), Dst: int32(l)})
	}
	return p
}

// kernels measures copy_vs_memmove and generated_vs_interpreter.
func (c *case70) kernels(ctx context.Context, o *Options) ([]Figure, error) {
	k := kernel.Lookup(kernel.Pair{Src: c.partL.Identity(), Dst: c.poolL.Identity()})
	if k == nil {
		return nil, fmt.Errorf("no compiled kernels for %s -> %s", c.partL.Identity(), c.poolL.Identity())
	}
	r := rand.New(rand.NewPCG(7, 0))
	part := c.m.PartBytes(0)
	srcs := [][]byte{make([]byte, part), make([]byte, part)}
	for _, s := range srcs {
		for i := range s {
			s[i] = byte(r.Uint32())
		}
	}
	pool := [][]byte{make([]byte, part/2), make([]byte, part/2)}
	flat := make([]byte, part)
	probs := []*kernel.Problem{c.problem(0), c.problem(1)}
	n := 20
	if !o.Quick {
		n = 50
	}
	kernelCopy := func() {
		k.Copy(probs[0], pool, srcs[:1])
		k.Copy(probs[1], pool, srcs[1:])
	}
	// copy() of the same bytes: one call per run the kernel moves, the
	// runs precomputed; and copy() of as many contiguous bytes.
	var runs [2][]kernel.Run
	for h := range runs {
		runs[h] = k.Range(probs[h], nil)
	}
	kt, lt, lratio := pairwise(3*c.sz.reps, n, kernelCopy, func() {
		for h, rs := range runs {
			for _, r := range rs {
				copy(pool[r.DstRegion][r.Dst:r.Dst+r.Len], srcs[h][r.Src:r.Src+r.Len])
			}
		}
	})
	_, mt, mratio := pairwise(3*c.sz.reps, n, kernelCopy, func() { copy(flat, srcs[0]) })
	cp := Figure{Name: "copy_vs_memmove", Value: round(mratio), Unit: "x", Baseline: round(gbps(part, mt)), BaselineUnit: "GB/s",
		Detail: fmt.Sprintf("generated copy kernel %s moving two TP 8 parts into a TP 4/PP 2 pool (%d bytes in %d runs of 256): %.2f GB/s; one copy() of as many contiguous bytes: %.2f GB/s",
			k.Pair, part, 2*len(runs[0]), gbps(part, kt), gbps(part, mt))}
	atLeast(&cp, 0.8)
	runsFig := Figure{Name: "copy_vs_memmove_runs", Value: round(lratio), Unit: "x", Baseline: round(gbps(part, lt)), BaselineUnit: "GB/s",
		Detail: fmt.Sprintf("the same kernel copy against copy() of the same runs, one call a run (%.2f GB/s): what the kernel gains by moving the rows of a strided loop in one call", gbps(part, lt))}

	// Range kernels of every built-in part -> pool pair, generated and
	// interpreted, on the problem of part 0.
	gen, interp, err := rangeKernels(rangeParts, rangePools)
	if err != nil {
		return nil, err
	}
	scratch := make([]kernel.Run, 0, 8192)
	rangeAll := func(ks []*kernel.Kernels) func() {
		return func() {
			for _, k := range ks {
				scratch = k.Range(probs[0], scratch[:0])
			}
		}
	}
	gt, it, gratio := pairwise(3*c.sz.reps, n/4+1, rangeAll(gen), rangeAll(interp))
	gi := Figure{Name: "generated_vs_interpreter", Value: round(gratio), Unit: "x", Baseline: round(us(it)), BaselineUnit: "µs",
		Detail: fmt.Sprintf("range kernels of the 12 built-in part -> pool pairs on the 70B problem of one part: generated %.0f µs, interpreter %.0f µs", us(gt), us(it))}
	atLeast(&gi, 3)
	return []Figure{cp, runsFig, gi}, nil
}

// The built-in part and pool layouts whose range kernels
// generated_vs_interpreter times.
var (
	rangeParts = []string{"PLHD", "LPHD", "HPLD"}
	rangePools = []string{"page_first", "page_first_direct", "layer_first", "page_head"}
)

// rangeKernels returns the generated kernels and the interpreter's of
// every pair of the built-in layouts named.
func rangeKernels(parts, pools []string) (gen, interp []*kernel.Kernels, err error) {
	for _, pn := range parts {
		for _, qn := range pools {
			src, err := kernel.LayoutNamed(pn)
			if err != nil {
				return nil, nil, err
			}
			dst, err := kernel.LayoutNamed(qn)
			if err != nil {
				return nil, nil, err
			}
			g := kernel.Lookup(kernel.Pair{Src: src.Identity(), Dst: dst.Identity()})
			if g == nil {
				return nil, nil, fmt.Errorf("no compiled kernels for %s -> %s", src.Identity(), dst.Identity())
			}
			ir, err := ir.Lower(src, dst)
			if err != nil {
				return nil, nil, err
			}
			gen, interp = append(gen, g), append(interp, kernel.Interpreter{IR: ir}.Kernels())
		}
	}
	return gen, interp, nil
}

// plans measures the plan figures.
func (c *case70) plans(ctx context.Context, o *Options) ([]Figure, error) {
	direct, err := c.planner(plan.Options{RequireCompiled: true})
	if err != nil {
		return nil, err
	}
	redis := plan.RedisTransport()
	auto, err := c.planner(plan.Options{RequireCompiled: true, Strategy: plan.Auto, Transport: &redis})
	if err != nil {
		return nil, err
	}
	dpl, err := direct.Build(c.m)
	if err != nil {
		return nil, err
	}
	apl, err := auto.Build(c.m)
	if err != nil {
		return nil, err
	}
	dt, err := median(c.sz.builds, func() error { _, err := direct.Build(c.m); return err })
	if err != nil {
		return nil, err
	}
	at, err := median(c.sz.builds, func() error { _, err := auto.Build(c.m); return err })
	if err != nil {
		return nil, err
	}
	var naiveRuns int
	nt, err := best(1, 1, func() error { naiveRuns = c.naivePlan(); return nil })
	if err != nil {
		return nil, err
	}
	build := Figure{Name: "plan_build_us_70b", Value: round(us(dt)), Unit: "µs", Baseline: round(us(nt)), BaselineUnit: "µs",
		Detail: fmt.Sprintf("median of %d builds of the direct plan (%d ops), proof included; baseline: placing each of the %d elements and merging (the reference planner of the proposal takes 100-180 ms)",
			c.sz.builds, len(dpl.Ops), dpl.Bytes/c.d.ItemSize)}
	atMost(&build, 100000)
	buildAuto := Figure{Name: "plan_build_auto_us_70b", Value: round(us(at)), Unit: "µs", Baseline: round(us(dt)), BaselineUnit: "µs",
		Detail: fmt.Sprintf("median of %d builds with auto on the Redis cost model (the three strategies built, proven and estimated; %s kept); baseline: direct", c.sz.builds, apl.Strategy)}
	opsDirect := Figure{Name: "ops_direct_70b", Value: float64(dpl.OpCount()), Unit: "ops", Baseline: float64(naiveRuns), BaselineUnit: "runs",
		Detail: "ops of the direct plan (runs contiguous on both sides); baseline: runs of the element-by-element planner"}
	opsAuto := Figure{Name: "ops_auto_redis_70b", Value: float64(apl.OpCount()), Unit: "ops", Baseline: float64(dpl.OpCount()), BaselineUnit: "ops",
		Detail: fmt.Sprintf("transport ops of auto on the Redis cost model: %s, estimated %s against %s for direct; baseline: direct",
			apl.Strategy, apl.Estimate, apl.Estimates[plan.Direct])}
	atMost(&opsAuto, float64(dpl.OpCount())/10)
	return []Figure{build, buildAuto, opsDirect, opsAuto}, nil
}

// naivePlan plans the resharding reader's page as the reference planner
// does: it places every element it needs on both sides with the
// independent layout model, in the order of the part (C T L H D), and
// merges elements contiguous on both sides into runs. It returns the runs.
func (c *case70) naivePlan() int {
	d := c.d
	g := kerneltest.Shape{ItemSize: d.ItemSize, PageSize: d.PageSize, Dims: d.HeadDims}
	dst := kerneltest.Buffer{Layout: c.poolL, Layers: d.Layers[:40], HeadStart: 0, Heads: 2, Slots: 1}
	runs := 0
	var lp, ls, lr, ld int
	for pi, p := range c.m.Parts {
		if p.HeadStart >= dst.HeadStart+dst.Heads || p.HeadStart+p.HeadCount <= dst.HeadStart {
			continue
		}
		src := kerneltest.Buffer{Layout: c.partL, Layers: p.Layers, HeadStart: p.HeadStart, Heads: p.HeadCount, Slots: 1, Packed: true}
		for comp, dim := range d.HeadDims {
			for t := 0; t < d.PageSize; t++ {
				for li, layer := range p.Layers {
					if layer >= 40 {
						continue
					}
					for h := 0; h < p.HeadCount; h++ {
						gh := p.HeadStart + h
						if gh >= dst.HeadStart+dst.Heads {
							continue
						}
						for e := 0; e < dim; e++ {
							_, so := g.Offset(&src, comp, li, h, t, e)
							r, do := g.Offset(&dst, comp, layer, gh-dst.HeadStart, t, e)
							if runs == 0 || pi != lp || so != ls+d.ItemSize || r != lr || do != ld+d.ItemSize {
								runs++
							}
							lp, ls, lr, ld = pi, so, r, do
						}
					}
				}
			}
		}
	}
	return runs
}
