package bench

import (
	"context"
	"fmt"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/reshard"
	"github.com/kvreshard/kvreshard/runtime/store"
)

// checksumCost measures checksum_cost: staged reads of the two whole
// parts a page that hold the resharding reader's bytes (a gap as large as
// a part is bridged) from the file store, every byte the reader copies
// checked against its part's checksums (CheckParts: each part's trailer
// read too, and the checksum blocks of the bytes used hashed), against the
// same reads unchecked, in turns. It checks that the first reader checked
// every part and the second none.
func (c *case70) checksumCost(ctx context.Context, st store.Store, keys []string) (Figure, error) {
	tr := plan.FileTransport()
	opts := plan.Options{Strategy: plan.Staged, Transport: &tr, MaxGap: c.m.PartBytes(0)}
	checked, unchecked, ratio, err := c.checkedPair(ctx, st, keys, c.m, c.reshard, opts)
	if err != nil {
		return Figure{}, fmt.Errorf("checksum_cost: %w", err)
	}
	if checked.ops != 4 || unchecked.ops != 2 {
		return Figure{}, fmt.Errorf("checksum_cost: staged plans of %d and %d ops a page; want the 2 whole parts, and their 2 trailers when checked", checked.ops, unchecked.ops)
	}
	f := Figure{Name: "checksum_cost", Value: round(ratio), Unit: "x", Baseline: round(unchecked.gbps()), BaselineUnit: "GB/s",
		Detail: fmt.Sprintf("%d pages from the file store, TP 4/PP 2 rank 0/0, staged reads of the 2 whole parts a page (%d bytes each), every byte copied checked against its part's checksums (%.2f GB/s of pages), against the same reads unchecked; median of %d turns",
			len(keys), c.m.PartBytes(0), checked.gbps(), 3*c.sz.reps)}
	atLeast(&f, 0.9)
	return f, nil
}

// tp1 is the writer of checksum_cost_range: TP 1, one part of the whole
// page; tp2 its reader, rank 0 of TP 2 (KV heads 0-3).
var (
	tp1 = placement.Topology{TP: 1, PP: 1}
	tp2 = placement.Topology{TP: 2, PP: 1}
)

// checksumRange measures name (checksum_cost_range on the file store,
// checksum_cost_range_redis on Redis): pages of the 70B case written by
// TP 1 in PLHD (one part of 20 MiB a page) under keys of prefix, read by
// rank 0 of TP 2 (heads 0-3: half of each part, in runs of 1 KiB 1 KiB
// apart) into page_first with auto on transport tr, every byte the reader
// copies checked against its part's checksums, against the same reads
// unchecked, in turns.
func (c *case70) checksumRange(ctx context.Context, st store.Store, prefix string, tr plan.Transport, name, where string) (Figure, error) {
	keys := content.PageKeys(prefix, c.model.Domain(), c.sz.pages)
	m, err := c.writeWith(ctx, st, keys, tp1)
	if err != nil {
		return Figure{}, fmt.Errorf("%s: %w", name, err)
	}
	checked, unchecked, ratio, err := c.checkedPair(ctx, st, keys, m, tp2, plan.Options{Strategy: plan.Auto, Transport: &tr})
	if err != nil {
		return Figure{}, fmt.Errorf("%s: %w", name, err)
	}
	f := Figure{Name: name, Value: round(ratio), Unit: "x", Baseline: round(unchecked.gbps()), BaselineUnit: "GB/s",
		Detail: fmt.Sprintf("%d pages from %s written by TP 1 (one part of %d bytes a page), read by TP 2 rank 0 (half of each part, in runs of 1 KiB): every byte copied checked (%s, %d ops a page, %.2f GB/s), against the same read unchecked (auto: %s, %d ops a page); median of %d turns",
			len(keys), where, m.PartBytes(0), checked.strategy, checked.ops, checked.gbps(), unchecked.strategy, unchecked.ops, 3*c.sz.reps)}
	atLeast(&f, 0.9)
	return f, nil
}

// checkedPair times the reads of keys (written with manifest m) by rank 0
// of topology t with the planner options opts, checked (CheckParts) and
// unchecked, in turns, and returns both readings and the median of the
// turns' ratios unchecked time/checked time. It checks that the checked
// reader checked every part it read and the other none.
func (c *case70) checkedPair(ctx context.Context, st store.Store, keys []string, m *manifest.Manifest, t placement.Topology, opts plan.Options) (checked, unchecked reading, ratio float64, err error) {
	checked, checkedOnce, err := c.readerWith(ctx, st, keys, m, t, placement.Rank{}, reshard.ReaderOptions{Plan: opts, CheckParts: true})
	if err != nil {
		return checked, unchecked, 0, err
	}
	unchecked, uncheckedOnce, err := c.readerWith(ctx, st, keys, m, t, placement.Rank{}, reshard.ReaderOptions{Plan: opts})
	if err != nil {
		return checked, unchecked, 0, err
	}
	if pl, err := checked.rd.Planner().Template(m); err == nil {
		if pl, err = checked.rd.Planner().Checked(pl); err == nil {
			checked.strategy = pl.Strategy
		}
	}
	n := 3 * c.sz.reps
	if checked.best, unchecked.best, ratio, err = pairwiseErr(n, 1, checkedOnce, uncheckedOnce); err != nil {
		return checked, unchecked, 0, err
	}
	// The parts a page of the checked reads: those its rank reads.
	parts := int64(0)
	tpl, err := checked.rd.Planner().Template(m)
	if err != nil {
		return checked, unchecked, 0, err
	}
	seen := map[int32]bool{}
	for _, op := range tpl.Ops {
		if !seen[op.Part] {
			seen[op.Part] = true
			parts++
		}
	}
	reads := int64(n + 2) // the turns, the read before them, and pairwise's first
	if got, want := checked.rd.Stats().PartsChecked, parts*int64(len(keys))*reads; got != want {
		return checked, unchecked, 0, fmt.Errorf("the checking reader checked %d parts; want %d", got, want)
	}
	if got := unchecked.rd.Stats().PartsChecked; got != 0 {
		return checked, unchecked, 0, fmt.Errorf("the unchecked reader checked %d parts", got)
	}
	return checked, unchecked, ratio, nil
}

// writeWith writes the pages of keys as every rank of topology t in PLHD,
// from pools of one slot filled with the case's page, and returns the
// manifest.
func (c *case70) writeWith(ctx context.Context, st store.Store, keys []string, t placement.Topology) (*manifest.Manifest, error) {
	m, err := plan.ManifestFor(c.model.Domain(), c.d, t, c.partL)
	if err != nil {
		return nil, err
	}
	slots := make([]int, len(keys))
	for _, r := range t.Ranks() {
		part, writes, err := t.Writer(c.d, r)
		if err != nil {
			return nil, err
		}
		b, err := plan.BindingFor(c.d, t, r, c.poolL, 1)
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
		content.Fill(w.Geometry(), regions, 0, c.seed)
		res, err := w.Write(ctx, keys, slots, regions)
		if err != nil {
			return nil, err
		}
		for _, pr := range res {
			if pr.Status == reshard.Failed {
				return nil, fmt.Errorf("write %s: %w", pr.Key, pr.Err)
			}
		}
	}
	return m, nil
}
