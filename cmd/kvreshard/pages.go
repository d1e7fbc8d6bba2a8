package main

import (
	"context"
	"fmt"

	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/internal/content"
	_ "github.com/kvreshard/kvreshard/layouts"
	"github.com/kvreshard/kvreshard/runtime/kernel"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/reshard"
	"github.com/kvreshard/kvreshard/runtime/store"
)

// poolFor is the pool layout a writer of part layout l keeps its pages in
// when it names none: the first registered pool layout that writes l (for
// the built-ins, SGLang's pairing: page_first writes PLHD,
// page_first_direct LPHD, page_head HPLD), and for any other part layout
// its pages one slot after another.
func poolFor(l *ir.Layout) *ir.Layout {
	if p := kernel.PoolWriting(l); p != nil {
		return p
	}
	return l.SlotPool()
}

// readerPool is the pool a reader of layout l reads pages into: l itself
// when it is a pool layout; for a part layout (one page), a pool of its
// pages one slot after another, which is a registered pool where one has
// that order (PLHD: page_first), so that its compiled kernels serve it.
func readerPool(l *ir.Layout) *ir.Layout {
	if l.Kind != ir.Part {
		return l
	}
	p := l.SlotPool()
	for _, b := range kernel.Layouts() {
		if b.Identity() == p.Identity() {
			return b
		}
	}
	return p
}

// checkPool returns a usage error when the pool of a writer topology
// cannot hold pages pages of the model as rank r.
func checkPool(d *manifest.Descriptor, ts *topoSpec, r placement.Rank, pages int) error {
	b, err := plan.BindingFor(d, ts.topo, r, ts.pool, pages)
	if err == nil {
		_, err = plan.NewGeometry(d, b)
	}
	if err != nil {
		return usagef("--src: the writer's pool: %v", err)
	}
	return nil
}

// writeRank writes the pages of keys as rank r of topology t, from a pool
// laid out as pool and filled with each page's content, into parts of
// manifest m. It returns the count of pages by status.
func writeRank(ctx context.Context, st store.Store, m *manifest.Manifest, t placement.Topology, r placement.Rank, pool *ir.Layout, keys []string) (map[reshard.Status]int, error) {
	d := &m.Descriptor
	part, writes, err := t.Writer(d, r)
	if err != nil {
		return nil, err
	}
	b, err := plan.BindingFor(d, t, r, pool, len(keys))
	if err != nil {
		return nil, err
	}
	w, err := reshard.NewWriter(st, m, part, writes, b)
	if err != nil {
		return nil, err
	}
	if err := w.Publish(ctx); err != nil {
		return nil, err
	}
	regions := w.Geometry().NewRegions()
	slots := make([]int, len(keys))
	for i, k := range keys {
		slots[i] = i
		content.Fill(w.Geometry(), regions, i, content.Seed(k))
	}
	res, err := w.Write(ctx, keys, slots, regions)
	if err != nil {
		return nil, err
	}
	count := map[reshard.Status]int{}
	for _, pr := range res {
		count[pr.Status]++
		if pr.Status == reshard.Failed {
			return count, fmt.Errorf("write %s: %w", pr.Key, pr.Err)
		}
	}
	return count, nil
}
