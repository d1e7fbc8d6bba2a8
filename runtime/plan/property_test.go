package plan_test

import (
	"math/rand/v2"
	"testing"

	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/placement"
)

// randomTopology draws a TP x PP topology valid for d: TP a divisor of the
// KV-head count or a multiple of it (replicated heads), PP up to the layer
// count, with an uneven explicit layer split half of the time.
func randomTopology(r *rand.Rand, d *manifest.Descriptor) placement.Topology {
	var tps []int
	for tp := 1; tp <= d.KVHeads; tp++ {
		if d.KVHeads%tp == 0 {
			tps = append(tps, tp)
		}
	}
	tps = append(tps, 2*d.KVHeads, 3*d.KVHeads)
	t := placement.Topology{TP: tps[r.IntN(len(tps))], PP: 1 + r.IntN(min(len(d.Layers), 4))}
	if r.IntN(2) == 0 {
		// Cut the layers at PP-1 distinct random points.
		n := len(d.Layers)
		cuts := r.Perm(n - 1)[:t.PP-1]
		sorted := make([]bool, n)
		for _, c := range cuts {
			sorted[c+1] = true
		}
		last := 0
		for i := 1; i <= n; i++ {
			if i == n || sorted[i] {
				t.PPLayers = append(t.PPLayers, i-last)
				last = i
			}
		}
	}
	return t
}

// randomScenario draws a model, a writer topology and part layout, and a
// reader rank with its binding layout, slot count and slot.
func randomScenario(r *rand.Rand, parts, all []*ir.Layout) scenario {
	var s scenario
	s.srcL = parts[r.IntN(len(parts))]
	s.dstL = all[r.IntN(len(all))]
	dtype := []string{"fp32", "bf16", "fp8"}[r.IntN(3)]
	dsplit := max(s.srcL.SplitOf(ir.D), s.dstL.SplitOf(ir.D), 1)
	tsplit := max(s.srcL.SplitOf(ir.T), s.dstL.SplitOf(ir.T), 1)
	page := tsplit * (1 + r.IntN(12/tsplit))
	dims := []int{dsplit * (1 + r.IntN(16/dsplit))}
	switch {
	case r.IntN(6) == 0:
		// An MLA latent.
	case s.srcL.COuter() && s.dstL.COuter() && r.IntN(2) == 0:
		dims = append(dims, dsplit*(1+r.IntN(16/dsplit)))
	default:
		dims = append(dims, dims[0])
	}
	heads := []int{1, 2, 3, 4, 6, 8}[r.IntN(6)]
	// Global layer ids need not start at 0 nor be consecutive.
	var layers []int
	for id, n := r.IntN(3), 1+r.IntN(8); len(layers) < n; id += 1 + r.IntN(2) {
		layers = append(layers, id)
	}
	s.d = manifest.Descriptor{Layers: layers, KVHeads: heads, HeadDims: dims, Dtype: dtype, PageSize: page}
	s.d.ItemSize, _ = manifest.ItemSizeOf(dtype)
	s.src = randomTopology(r, &s.d)
	s.dst = randomTopology(r, &s.d)
	ranks := s.dst.Ranks()
	s.rank = ranks[r.IntN(len(ranks))]
	if s.dstL.Kind == ir.Pool {
		s.slots = 1 + r.IntN(4)
		s.slot = r.IntN(s.slots)
	}
	return s
}

// TestRandomPlans plans random pages, topologies and layouts (built-in and
// interpreted) with fixed seeds: every plan verifies byte for byte, maps
// exactly the elements the layout model maps, and has exactly as many ops
// as there are maximal runs contiguous on both sides, the fewest possible
// and so never more than the reference planner's merge gives.
func TestRandomPlans(t *testing.T) {
	var parts, all []*ir.Layout
	for _, n := range partNames {
		parts = append(parts, builtin(t, n))
	}
	for _, n := range poolNames {
		all = append(all, builtin(t, n))
	}
	for _, l := range custom(t) {
		if l.Kind == ir.Part {
			parts = append(parts, l)
		} else {
			all = append(all, l)
		}
	}
	all = append(all, parts...)
	n := 1000
	switch {
	case testing.Short():
		n = 60
	case raceEnabled:
		n = 150
	}
	r := rand.New(rand.NewPCG(1, 2))
	interpreted := 0
	for i := range n {
		s := randomScenario(r, parts, all)
		_, _, tpl := s.check(t)
		if tpl.Interpreted {
			interpreted++
		}
		if t.Failed() {
			t.Fatalf("case %d: %s", i, s.String())
		}
	}
	t.Logf("%d plans, %d interpreted", n, interpreted)
}
