// Package placement says which part of a page each rank of a TP x PP x CP
// topology owns: the layers of its PP stage, the KV-head interval of its
// TP rank and the tokens of its CP (context-parallel) rank.
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
// Tokens: with context parallelism of size CP and an interleave of I
// tokens, the page's tokens are dealt to the CP ranks in runs of I,
// round-robin: token p belongs to CP rank (p / I) % CP (SGLang's DCP has
// I = 1; I = page / CP gives each rank a contiguous slice). I must divide
// the page and so must CP x I, so that every CP rank holds page / CP
// tokens (manifest.TokenSet maps them). A part is the layers x heads x
// tokens one rank holds; CP ranks hold different tokens, so they write
// different parts even when their heads are replicated (MLA).
//
// Bounds: TP is at most MaxTP, CP at most MaxCP and replicates a head on at most
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

// MaxCP bounds a topology's context-parallel size, past the largest
// deployed (tens of ranks), so that every rank can be listed.
const MaxCP = 1024

// Topology is a TP x PP x CP placement.
type Topology struct {
	TP, PP int
	// PPLayers optionally gives the layer count of each PP stage: len PP,
	// every entry positive, summing to the descriptor's layer count. nil
	// splits evenly with the remainder to the first stages.
	PPLayers []int
	// CP is the context-parallel size and Interleave the tokens of each
	// run dealt to a CP rank; 0 means 1 for both (no context parallelism).
	CP, Interleave int
}

// Rank is one rank of a topology: its TP, PP and CP ranks.
type Rank struct{ TP, PP, CP int }

// Share is what one rank owns: global layer ids, a KV-head interval and a
// token set (the zero TokenSet, every token, without context parallelism).
type Share struct {
	Layers               []int
	HeadStart, HeadCount int
	Tokens               manifest.TokenSet
}

// cp returns the CP size and interleave, 1 where they are 0.
func (t Topology) cp() (size, interleave int) { return max(t.CP, 1), max(t.Interleave, 1) }

// tokens returns the token set of CP rank r; zero without context
// parallelism.
func (t Topology) tokens(r int) manifest.TokenSet {
	if t.CP <= 1 {
		return manifest.TokenSet{}
	}
	size, il := t.cp()
	return manifest.TokenSet{CPSize: size, CPRank: r, Interleave: il}
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
	if err := t.validateCP(d.PageSize); err != nil {
		return err
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

// validateCP checks the context-parallel size and interleave against a
// page of page tokens.
func (t Topology) validateCP(page int) error {
	switch {
	case t.CP < 0:
		return fmt.Errorf("cp %d is not positive", t.CP)
	case t.Interleave < 0:
		return fmt.Errorf("cp interleave %d is not positive", t.Interleave)
	}
	size, il := t.cp()
	switch {
	case size > page:
		return fmt.Errorf("cp %d is more than the page's %d tokens", size, page)
	case size > MaxCP:
		return fmt.Errorf("cp %d is more than %d", size, MaxCP)
	case page%il != 0:
		return fmt.Errorf("cp interleave %d does not divide the page's %d tokens", il, page)
	case page%(size*il) != 0:
		return fmt.Errorf("cp %d x cp interleave %d is %d tokens, which does not divide the page's %d tokens", size, il, size*il, page)
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
	cp, _ := t.cp()
	if r.TP < 0 || r.TP >= t.TP || r.PP < 0 || r.PP >= t.PP || r.CP < 0 || r.CP >= cp {
		if cp == 1 && r.CP == 0 {
			return fmt.Errorf("rank tp %d pp %d is outside tp %d x pp %d", r.TP, r.PP, t.TP, t.PP)
		}
		return fmt.Errorf("rank tp %d pp %d cp %d is outside tp %d x pp %d x cp %d", r.TP, r.PP, r.CP, t.TP, t.PP, cp)
	}
	return nil
}

// Share returns the layers, heads and tokens rank r owns.
func (t Topology) Share(d *manifest.Descriptor, r Rank) (Share, error) {
	if err := t.Validate(d); err != nil {
		return Share{}, err
	}
	if err := t.checkRank(r); err != nil {
		return Share{}, err
	}
	lo, hi := t.stage(d, r.PP)
	start, count, _ := t.heads(d, r.TP)
	return Share{Layers: append([]int(nil), d.Layers[lo:hi]...), HeadStart: start, HeadCount: count, Tokens: t.tokens(r.CP)}, nil
}

// Parts returns the distinct parts of a page written by t, in derived order
// (manifest.ComparePart): replicated heads give one part, not one per rank;
// each CP rank's tokens are a part of their own. More than
// manifest.MaxParts parts are refused before they are built.
func (t Topology) Parts(d *manifest.Descriptor) ([]manifest.Part, error) {
	if err := t.Validate(d); err != nil {
		return nil, err
	}
	distinct := min(t.TP, d.KVHeads)
	cp, _ := t.cp()
	if n := t.PP * distinct * cp; n > manifest.MaxParts {
		if cp > 1 {
			return nil, fmt.Errorf("tp %d x pp %d x cp %d stores %d parts a page; a manifest holds at most %d", t.TP, t.PP, cp, n, manifest.MaxParts)
		}
		return nil, fmt.Errorf("tp %d x pp %d stores %d parts a page; a manifest holds at most %d", t.TP, t.PP, n, manifest.MaxParts)
	}
	parts := make([]manifest.Part, 0, t.PP*distinct*cp)
	for p := range t.PP {
		lo, hi := t.stage(d, p)
		for h := range distinct {
			// The first TP rank holding distinct interval h.
			start, count, _ := t.heads(d, h*max(1, t.TP/d.KVHeads))
			for c := range cp {
				parts = append(parts, manifest.Part{
					Layers:    append([]int(nil), d.Layers[lo:hi]...),
					HeadStart: start,
					HeadCount: count,
					TokenSet:  t.tokens(c).Norm(),
				})
			}
		}
	}
	manifest.SortParts(parts)
	return parts, nil
}

// Writer returns the index, in Parts order, of the part rank r holds, and
// whether r writes it: the lowest TP rank among the replicas of its heads
// writes; its PP rank fixes its layers and its CP rank its tokens.
func (t Topology) Writer(d *manifest.Descriptor, r Rank) (part int, writes bool, err error) {
	if err := t.Validate(d); err != nil {
		return 0, false, err
	}
	if err := t.checkRank(r); err != nil {
		return 0, false, err
	}
	// Stages hold disjoint ascending layer slices and heads ascend within a
	// stage, so the derived order is stage-major, then head interval, then
	// CP rank (the parts of one topology share the CP size and interleave).
	_, _, rep := t.heads(d, r.TP)
	distinct := min(t.TP, d.KVHeads)
	cp, _ := t.cp()
	return (r.PP*distinct+r.TP/rep)*cp + r.CP, r.TP%rep == 0, nil
}

// Ranks returns every rank, PP-major, then CP, then TP; nil unless TP is
// in [1, MaxTP], CP in [0, MaxCP] and PP positive. Validate bounds PP by
// the layer count: call it first, and list the ranks only when all of them
// are to be used.
func (t Topology) Ranks() []Rank {
	if t.TP <= 0 || t.PP <= 0 || t.TP > MaxTP || t.CP < 0 || t.CP > MaxCP || t.PP > math.MaxInt/MaxTP/MaxCP {
		return nil
	}
	cp, _ := t.cp()
	ranks := make([]Rank, 0, t.TP*t.PP*cp)
	for p := range t.PP {
		for c := range cp {
			for r := range t.TP {
				ranks = append(ranks, Rank{TP: r, PP: p, CP: c})
			}
		}
	}
	return ranks
}
