// Package placement says which part of a page each rank of a TP x PP
// topology owns: the layers of its PP stage and the KV-head interval of its
// TP rank.
//
// Layers: PP stage p owns a contiguous slice of the descriptor's layers.
// PPLayers gives the size of each slice; when it is nil the layers are split
// evenly and the remainder goes to the first stages (10 layers on PP 3:
// 4, 3, 3).
//
// Heads: when TP <= KVHeads, KVHeads must be a multiple of TP and TP rank t
// owns heads [t*KVHeads/TP, (t+1)*KVHeads/TP). When TP > KVHeads, TP must be
// a multiple of KVHeads and each head is replicated on TP/KVHeads
// consecutive ranks: rank t owns head t/(TP/KVHeads). A replicated part is
// stored once, written by the lowest TP rank that holds it.
//
// Bounds: TP is at most MaxTP and replicates a head on at most
// MaxReplication ranks; PP is at most the layer count. Validate refuses
// anything larger before a rank, share or part is built, so that a flag
// like tp=1000000000 is one error, not gigabytes of ranks.
package placement

import (
	"fmt"
	"math"

	"github.com/kvreshard/kvreshard/runtime/manifest"
)

// MaxTP bounds a topology's TP degree: past the largest tensor-parallel
// groups deployed (tens of ranks), and small enough that every rank of a
// topology can be listed.
const MaxTP = 1024

// MaxReplication bounds how many TP ranks hold one KV head when TP is above
// the KV-head count: an MLA model (one latent head) runs on at most 64 TP
// ranks.
const MaxReplication = 64

// Topology is a TP x PP placement.
type Topology struct {
	TP, PP int
	// PPLayers optionally gives the layer count of each PP stage: len PP,
	// every entry positive, summing to the descriptor's layer count. nil
	// splits evenly with the remainder to the first stages.
	PPLayers []int
}

// Rank is one rank of a topology.
type Rank struct{ TP, PP int }

// Share is what one rank owns: global layer ids and a KV-head interval.
type Share struct {
	Layers               []int
	HeadStart, HeadCount int
}

// Validate returns the first reason t cannot place a page of d, or nil.
func (t Topology) Validate(d *manifest.Descriptor) error {
	if err := d.Validate(); err != nil {
		return err
	}
	if t.TP <= 0 {
		return fmt.Errorf("tp %d is not positive", t.TP)
	}
	if t.PP <= 0 {
		return fmt.Errorf("pp %d is not positive", t.PP)
	}
	if t.TP > MaxTP {
		return fmt.Errorf("tp %d is more than %d", t.TP, MaxTP)
	}
	if t.TP <= d.KVHeads {
		if d.KVHeads%t.TP != 0 {
			return fmt.Errorf("kv-heads %d is not divisible by tp %d", d.KVHeads, t.TP)
		}
	} else if t.TP%d.KVHeads != 0 {
		return fmt.Errorf("tp %d is more than kv-heads %d but not a multiple of it", t.TP, d.KVHeads)
	} else if rep := t.TP / d.KVHeads; rep > MaxReplication {
		return fmt.Errorf("tp %d replicates each of the %d kv-heads on %d ranks; at most %d", t.TP, d.KVHeads, rep, MaxReplication)
	}
	n := len(d.Layers)
	if t.PP > n {
		return fmt.Errorf("pp %d is more than the %d layers", t.PP, n)
	}
	if t.PPLayers == nil {
		return nil
	}
	if len(t.PPLayers) != t.PP {
		return fmt.Errorf("pp-layers has length %d, not pp %d", len(t.PPLayers), t.PP)
	}
	sum := 0
	for p, c := range t.PPLayers {
		if c <= 0 {
			return fmt.Errorf("pp-layers stage %d has %d layers; every stage needs at least one", p, c)
		}
		if c > n {
			return fmt.Errorf("pp-layers stage %d has %d layers, more than the %d layers", p, c, n)
		}
		sum += c
	}
	if sum != n {
		return fmt.Errorf("pp-layers sum to %d, not the %d layers", sum, n)
	}
	return nil
}

// stage returns the index range [lo, hi) in d.Layers of PP stage p. t must
// be valid for d.
func (t Topology) stage(d *manifest.Descriptor, p int) (lo, hi int) {
	if t.PPLayers != nil {
		for _, c := range t.PPLayers[:p] {
			lo += c
		}
		return lo, lo + t.PPLayers[p]
	}
	n := len(d.Layers)
	base, rem := n/t.PP, n%t.PP
	lo = p*base + min(p, rem)
	hi = lo + base
	if p < rem {
		hi++
	}
	return lo, hi
}

// heads returns the head interval of TP rank r and how many TP ranks hold
// each head (1 unless TP > KVHeads). t must be valid for d.
func (t Topology) heads(d *manifest.Descriptor, r int) (start, count, replicas int) {
	if t.TP <= d.KVHeads {
		per := d.KVHeads / t.TP
		return r * per, per, 1
	}
	rep := t.TP / d.KVHeads
	return r / rep, 1, rep
}

func (t Topology) checkRank(r Rank) error {
	if r.TP < 0 || r.TP >= t.TP || r.PP < 0 || r.PP >= t.PP {
		return fmt.Errorf("rank tp %d pp %d is outside tp %d x pp %d", r.TP, r.PP, t.TP, t.PP)
	}
	return nil
}

// Share returns the layers and heads rank r owns.
func (t Topology) Share(d *manifest.Descriptor, r Rank) (Share, error) {
	if err := t.Validate(d); err != nil {
		return Share{}, err
	}
	if err := t.checkRank(r); err != nil {
		return Share{}, err
	}
	lo, hi := t.stage(d, r.PP)
	start, count, _ := t.heads(d, r.TP)
	return Share{Layers: append([]int(nil), d.Layers[lo:hi]...), HeadStart: start, HeadCount: count}, nil
}

// Parts returns the distinct parts of a page written by t, in derived order
// (manifest.ComparePart): replicated heads give one part, not one per rank.
// More than manifest.MaxParts parts are refused before they are built.
func (t Topology) Parts(d *manifest.Descriptor) ([]manifest.Part, error) {
	if err := t.Validate(d); err != nil {
		return nil, err
	}
	distinct := min(t.TP, d.KVHeads)
	if n := t.PP * distinct; n > manifest.MaxParts {
		return nil, fmt.Errorf("tp %d x pp %d stores %d parts a page; a manifest holds at most %d", t.TP, t.PP, n, manifest.MaxParts)
	}
	parts := make([]manifest.Part, 0, t.PP*distinct)
	for p := range t.PP {
		lo, hi := t.stage(d, p)
		for h := range distinct {
			// The first TP rank holding distinct interval h.
			start, count, _ := t.heads(d, h*max(1, t.TP/d.KVHeads))
			parts = append(parts, manifest.Part{
				Layers:    append([]int(nil), d.Layers[lo:hi]...),
				HeadStart: start,
				HeadCount: count,
			})
		}
	}
	manifest.SortParts(parts)
	return parts, nil
}

// Writer returns the index, in Parts order, of the part rank r holds, and
// whether r writes it: the lowest TP rank among the replicas of its heads
// writes; its PP rank fixes its layers.
func (t Topology) Writer(d *manifest.Descriptor, r Rank) (part int, writes bool, err error) {
	if err := t.Validate(d); err != nil {
		return 0, false, err
	}
	if err := t.checkRank(r); err != nil {
		return 0, false, err
	}
	// Stages hold disjoint ascending layer slices and heads ascend within a
	// stage, so the derived order is stage-major, then head interval.
	_, _, rep := t.heads(d, r.TP)
	distinct := min(t.TP, d.KVHeads)
	return r.PP*distinct + r.TP/rep, r.TP%rep == 0, nil
}

// Ranks returns every rank, PP-major then TP; nil unless TP is in
// [1, MaxTP] and PP positive. Validate bounds PP by the layer count: call
// it first, and list the ranks only when all of them are to be used.
func (t Topology) Ranks() []Rank {
	if t.TP <= 0 || t.PP <= 0 || t.TP > MaxTP || t.PP > math.MaxInt/MaxTP {
		return nil
	}
	ranks := make([]Rank, 0, t.TP*t.PP)
	for p := range t.PP {
		for r := range t.TP {
			ranks = append(ranks, Rank{TP: r, PP: p})
		}
	}
	return ranks
}
