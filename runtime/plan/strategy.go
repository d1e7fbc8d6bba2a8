package plan

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvreshard/kvreshard/runtime/kernel"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/partsum"
)

// Strategy is how a plan moves a page's bytes from the store into the pool.
//
//   - Direct issues one transport operation per run: each run is
//     contiguous in the part and in the pool, and lands in the pool
//     without a copy.
//   - Scatter issues one operation per source-contiguous span of runs,
//     delivered to a list of destination segments (an RDMA scatter list),
//     at most Options.MaxSegments of them.
//   - Staged reads larger spans of a part (the whole part, or spans that
//     include unneeded gaps up to Options.MaxGap) into a staging buffer of
//     at most Options.StageBytes, then copies the runs into the pool: with
//     the generated copy kernel of the pair when a read holds the whole
//     part (the kernel's source is a whole part), run by run otherwise.
//   - Auto builds the three and keeps the one the cost model of the
//     planner's transport says is fastest; of plans estimated equal, the
//     one with fewer operations, then fewer bytes read, then the first of
//     direct, scatter, staged.
type Strategy uint8

// The strategies.
const (
	Direct Strategy = iota
	Scatter
	Staged
	Auto
)

var strategyNames = [...]string{"direct", "scatter", "staged", "auto"}

func (s Strategy) String() string {
	if int(s) < len(strategyNames) {
		return strategyNames[s]
	}
	return fmt.Sprintf("strategy(%d)", s)
}

// ParseStrategy returns the strategy of a name: direct, scatter, staged or
// auto.
func ParseStrategy(name string) (Strategy, error) {
	for i, n := range strategyNames {
		if n == name {
			return Strategy(i), nil
		}
	}
	return 0, fmt.Errorf("unknown strategy %q; strategies are direct, scatter, staged, auto", name)
}

// DefaultStageBytes is the default bound of a staged plan's staging
// memory: each half holds the two parts a TP 4 rank needs of a 70B-size
// page written by TP 8 (2 x 2.5 MiB).
const DefaultStageBytes = 16 << 20

// stageAlign aligns staging offsets, so that copies out of the staging
// buffer start on a cache line.
const stageAlign = 64

// ErrStrategy marks a plan whose reads do not fit its strategy.
var ErrStrategy = errors.New("plan reads do not fit its strategy")

// Read is one transport operation of a scatter or staged plan: Len bytes
// at offset Src of part Part. Instantiated ops (Planner.Instantiate) give
// its destinations, so an adapter posts a read without computing anything.
type Read struct {
	Part int32
	Src  int
	Len  int
	// Ops[First:First+N] are the runs the read feeds. In a scatter plan
	// they are its destination segments, in order, and their bytes are
	// exactly the read's. In a staged plan each lies inside the read.
	First, N int
	// A staged read lands at offset Stage of the staging buffer in staging
	// round Round: the reads of one round share the buffer, then their
	// copies run. Kernel says the read holds the whole part and the pair's
	// generated copy kernel moves its runs; otherwise each run is copied
	// from Stage + (op.Src - Src).
	Round  int
	Stage  int
	Kernel bool
}

// OpCount returns the number of transport operations of the plan: its
// runs for a direct plan, its reads otherwise.
func (pl *Plan) OpCount() int {
	if pl.Strategy == Direct {
		return len(pl.Ops)
	}
	return len(pl.Reads) + len(pl.Trailers)
}

// partCopy is the copy kernel of a part read whole into staging: the
// problem Build gave the range kernel for that part.
type partCopy struct {
	k     *kernel.Kernels
	prob  kernel.Problem
	bytes int // bytes the kernel moves
}

// CopyKernel names the layout pair whose copy kernel moves part i of a staged
// plan, or "" when no read of part i uses a kernel.
func (pl *Plan) CopyKernel(part int) string {
	if part < 0 || part >= len(pl.copies) || pl.copies[part] == nil {
		return ""
	}
	return pl.copies[part].k.Pair.String()
}

// resolveStrategy checks the strategy options and fills in the defaults.
func (o *Options) resolveStrategy(itemSize int) error {
	if o.Strategy > Auto {
		return fmt.Errorf("unknown strategy %d", o.Strategy)
	}
	t := MemoryTransport()
	if o.Transport != nil {
		t = *o.Transport
	}
	if err := t.Validate(); err != nil {
		return err
	}
	o.Transport = &t
	if o.MaxSegments == 0 {
		o.MaxSegments = t.Segments
	}
	if o.MaxSegments < 1 || o.MaxSegments > t.SegmentLimit {
		return fmt.Errorf("max segments %d: transport %s takes 1 to %d segments a read", o.MaxSegments, t.Name, t.SegmentLimit)
	}
	if o.StageBytes == 0 {
		o.StageBytes = DefaultStageBytes
	}
	if o.StageBytes < itemSize {
		return fmt.Errorf("stage bytes %d: the staging bound must hold at least one item (%d bytes)", o.StageBytes, itemSize)
	}
	switch {
	case o.MaxGap == 0:
		o.MaxGap = t.BreakEvenGap()
	case o.MaxGap == -1:
		o.MaxGap = 0
	case o.MaxGap < 0:
		return fmt.Errorf("max gap %d: give a byte count, 0 for the transport's break-even gap, or -1 for none", o.MaxGap)
	}
	return nil
}

// choose turns the direct plan that Build made into the plan of the
// planner's strategy, proves it, and estimates its time. Auto proves and
// estimates the three strategies and keeps the fastest that is valid.
func (p *Planner) choose(m *manifest.Manifest, k *kernel.Kernels, direct *Plan) (*Plan, error) {
	t := p.opts.Transport
	direct.Strategy = Direct
	direct.ReadBytes = direct.Bytes
	var cands []*Plan
	switch p.opts.Strategy {
	case Direct:
		cands = []*Plan{direct}
	case Scatter:
		cands = []*Plan{p.scatter(direct, sourceOrder(direct.Ops))}
	case Staged:
		cands = []*Plan{p.staged(m, k, direct, sourceOrder(direct.Ops), false)}
	default:
		ops := sourceOrder(direct.Ops)
		cands = []*Plan{direct, p.scatter(direct, ops), p.staged(m, k, direct, ops, false)}
	}
	var best *Plan
	var firstErr error
	var est [Auto]time.Duration
	for _, c := range cands {
		if err := p.Verify(c); err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		c.Estimate = t.Estimate(c)
		est[c.Strategy] = c.Estimate
		if best == nil || better(c, best) {
			best = c
		}
	}
	if best == nil {
		return nil, firstErr
	}
	best.Estimates = est
	return best, nil
}

// better reports whether plan a is to be kept over plan b: a lower
// estimate; on equal estimates fewer operations, then fewer bytes read,
// then the earlier strategy (direct, scatter, staged). The choice is a
// function of the plans alone, whatever order they are compared in.
func better(a, b *Plan) bool {
	switch {
	case a.Estimate != b.Estimate:
		return a.Estimate < b.Estimate
	case a.OpCount() != b.OpCount():
		return a.OpCount() < b.OpCount()
	case a.ReadBytes != b.ReadBytes:
		return a.ReadBytes < b.ReadBytes
	}
	return a.Strategy < b.Strategy
}

// derived returns an empty plan of strategy s over ops, with d's page.
func derived(d *Plan, s Strategy, ops []Op) *Plan {
	return &Plan{ManifestID: d.ManifestID, Manifest: d.Manifest, Ops: ops, Bytes: d.Bytes, Interpreted: d.Interpreted, Strategy: s}
}

// sourceOrder returns the ops sorted by part and source offset: runs that
// are contiguous in a part become neighbours. Range kernels usually emit
// them in that order already, and then the ops are shared, not copied.
func sourceOrder(ops []Op) []Op {
	less := func(a, b Op) int {
		if a.Part != b.Part {
			return int(a.Part) - int(b.Part)
		}
		return a.Src - b.Src
	}
	if slices.IsSortedFunc(ops, less) {
		return ops
	}
	out := slices.Clone(ops)
	slices.SortFunc(out, less)
	return out
}

// scatter groups source-contiguous runs of one part into reads of at most
// MaxSegments segments.
func (p *Planner) scatter(d *Plan, ops []Op) *Plan {
	pl := derived(d, Scatter, ops)
	pl.ReadBytes = d.Bytes
	max := p.opts.MaxSegments
	for i := 0; i < len(ops); {
		op := ops[i]
		r := Read{Part: op.Part, Src: op.Src, Len: op.Len, First: i, N: 1}
		for j := i + 1; j < len(ops) && r.N < max && ops[j].Part == op.Part && ops[j].Src == r.Src+r.Len; j++ {
			r.Len += ops[j].Len
			r.N++
		}
		pl.Reads = append(pl.Reads, r)
		i += r.N
	}
	return pl
}

// staged plans, part by part, reads of spans that bridge gaps of at most
// MaxGap unneeded bytes and hold at most half of StageBytes; a part that
// needs one span and whose unneeded head and tail are such gaps too is
// read whole (up to StageBytes) and copied by the kernel. Then it packs
// the reads into staging rounds of at most half of StageBytes, or one
// whole part. With blocks, a read holds the whole checksum blocks
// (partsum.Block) of its runs: a checked plan (Planner.Checked).
//
// Halves, so that the staging bound holds two rounds of any page whose
// parts are read in spans: a reader reads the next round into one half
// while it checks and copies the last out of the other (package reshard
// pipelines its batches so). A page of 20 MiB read in two spans of
// 10 MiB was read and copied one span after the other.
func (p *Planner) staged(m *manifest.Manifest, k *kernel.Kernels, d *Plan, ops []Op, blocks bool) *Plan {
	bound, gap := p.opts.StageBytes, p.opts.MaxGap
	half := max(bound/2, p.geo.Desc.ItemSize)
	split := half - half%p.geo.Desc.ItemSize
	if blocks {
		// A run widened to its blocks grows by less than a block at
		// each end.
		split = max(split-2*partsum.Block, partsum.Block)
	}
	ops = splitLong(ops, split)
	pl := derived(d, Staged, ops)
	for a := 0; a < len(ops); {
		part := int(ops[a].Part)
		size := m.PartBytes(part)
		b, need := a, 0
		for ; b < len(ops) && int(ops[b].Part) == part; b++ {
			need += ops[b].Len
		}
		n := len(pl.Reads)
		ext := span{blocks: blocks, size: size}
		// The unneeded bytes before and after the one span of a part are
		// gaps too: when they are small, the read takes the whole part,
		// and the pair's copy kernel, whose source is a whole part, moves
		// it.
		if whole := spans(pl.Reads, ops[a:b], a, bound, gap, ext); len(whole) == n+1 && size <= bound && k.Copy != nil {
			sp := whole[n]
			if cp := p.partCopy(m, k, part); sp.Src <= gap && size-sp.Src-sp.Len <= gap && cp.bytes == need {
				if pl.copies == nil {
					pl.copies = make([]*partCopy, len(m.Parts))
				}
				pl.copies[part] = cp
				pl.Reads = append(whole[:n], Read{Part: int32(part), Len: size, First: a, N: b - a, Kernel: true})
				a = b
				continue
			}
		}
		pl.Reads = spans(pl.Reads[:n], ops[a:b], a, half, gap, ext)
		a = b
	}
	used := 0
	for i := range pl.Reads {
		r := &pl.Reads[i]
		off := (used + stageAlign - 1) &^ (stageAlign - 1)
		if off+r.Len > half && off > 0 {
			pl.Rounds++
			off = 0
		}
		r.Round, r.Stage = pl.Rounds, off
		used = off + r.Len
		pl.StageBytes = max(pl.StageBytes, used)
		pl.ReadBytes += r.Len
	}
	pl.Rounds++
	return pl
}

// splitLong returns ops with every run longer than n split into runs of
// at most n bytes (n a multiple of the item size), so that each fits one
// staging read.
func splitLong(ops []Op, n int) []Op {
	long := false
	for _, op := range ops {
		long = long || op.Len > n
	}
	if !long {
		return ops
	}
	var out []Op
	for _, op := range ops {
		for op.Len > n {
			out = append(out, Op{Part: op.Part, Region: op.Region, Src: op.Src, Dst: op.Dst, Len: n})
			op.Src, op.Dst, op.Len = op.Src+n, op.Dst+n, op.Len-n
		}
		out = append(out, op)
	}
	return out
}

// spans appends the staged reads of the runs of one part, in source order
// (ops[0] is op first of the plan): a read grows over the next run while
// the gap before it is at most gap bytes and the read stays within bound.
// A read holds the extent of each of its runs.
func spans(out []Read, ops []Op, first, bound, gap int, ext span) []Read {
	lo, hi := ext.of(ops[0])
	r := Read{Part: ops[0].Part, Src: lo, Len: hi - lo, First: first, N: 1}
	for i := 1; i < len(ops); i++ {
		lo, hi := ext.of(ops[i])
		if lo-(r.Src+r.Len) <= gap && hi-r.Src <= bound {
			r.Len = max(r.Len, hi-r.Src)
			r.N++
			continue
		}
		out = append(out, r)
		r = Read{Part: ops[i].Part, Src: lo, Len: hi - lo, First: first + i, N: 1}
	}
	return append(out, r)
}

// span is the bytes of a part a staged read must hold for a run: the
// run's own, or with blocks the whole checksum blocks (partsum.Block) it
// touches in a part of size bytes.
type span struct {
	blocks bool
	size   int
}

func (e span) of(op Op) (lo, hi int) {
	lo, hi = op.Src, op.Src+op.Len
	if e.blocks {
		lo = lo / partsum.Block * partsum.Block
		hi = min((hi+partsum.Block-1)/partsum.Block*partsum.Block, e.size)
	}
	return lo, hi
}

// partCopy returns the copy kernel and problem of part i: the problem
// Build hands the range kernel for that part.
func (p *Planner) partCopy(m *manifest.Manifest, k *kernel.Kernels, i int) *partCopy {
	d, b, part := p.geo.Desc, &p.geo.Binding, m.Parts[i]
	h0 := max(part.HeadStart, b.HeadStart)
	h1 := min(part.HeadStart+part.HeadCount, b.HeadStart+b.Heads)
	// A whole-part copy moves a page of the tokens both sides hold; parts
	// whose token set differs from the binding's (context parallelism)
	// copy op by op, so their bytes are left 0 and never match a read.
	pt, bt := part.TokenSet.Norm(), b.Tokens.Norm()
	same := pt.Same(bt)
	tokens := pt.Tokens(d.PageSize)
	cp := &partCopy{k: k, prob: kernel.Problem{
		ItemSize: d.ItemSize,
		PageSize: tokens,
		Dims:     d.HeadDims,
		Src:      kernel.Buffer{Layers: len(part.Layers), Heads: part.HeadCount, Slots: 1, Packed: true, Tokens: tokens},
		Dst:      kernel.Buffer{Layers: len(b.Layers), Heads: b.Heads, Slots: b.Slots, Tokens: bt.Tokens(d.PageSize)},
		Layers:   commonLayers(nil, part.Layers, b.Layers),
	}}
	if !same || h1 <= h0 || len(cp.prob.Layers) == 0 {
		return cp
	}
	cp.prob.SrcHead, cp.prob.DstHead, cp.prob.Heads = h0-part.HeadStart, h0-b.HeadStart, h1-h0
	for _, dim := range d.HeadDims {
		cp.bytes += dim * d.ItemSize * tokens * len(cp.prob.Layers) * cp.prob.Heads
	}
	return cp
}

// CopyStaged moves the bytes of staged read i of plan pl, held in stage
// (the read's Len bytes), into the page at slot of the pool regions.
func (p *Planner) CopyStaged(pl *Plan, i int, stage []byte, regions [][]byte, slot int) {
	r := &pl.Reads[i]
	g := p.geo
	if r.Kernel {
		cp := pl.copies[r.Part]
		var buf [4][]byte
		dst := buf[:0]
		for j, reg := range regions {
			dst = append(dst, reg[slot*g.SlotStride[j]:])
		}
		src := [1][]byte{stage}
		cp.k.Copy(&cp.prob, dst, src[:])
		return
	}
	for _, op := range pl.Ops[r.First : r.First+r.N] {
		o := op.Dst + slot*g.SlotStride[op.Region]
		s := op.Src - r.Src
		copy(regions[op.Region][o:o+op.Len], stage[s:s+op.Len])
	}
}

// verifyReads proves the reads of a scatter or staged plan: they feed
// every op exactly once, in order; each lies inside its part, aligned;
// a scatter read's segments are its bytes, in source order, and at most
// MaxSegments; a staged read holds its runs, fits the staging bound and
// its round, and a kernel read holds its whole part and every run of it.
func (p *Planner) verifyReads(pl *Plan, partBytes []int) error {
	o := &p.opts
	switch pl.Strategy {
	case Direct:
		if pl.Reads != nil {
			return fmt.Errorf("%w: a direct plan issues its ops; it has %d reads", ErrStrategy, len(pl.Reads))
		}
		return nil
	case Scatter, Staged:
	default:
		return fmt.Errorf("%w: unknown strategy %d", ErrStrategy, pl.Strategy)
	}
	it := p.geo.Desc.ItemSize
	var partOps []int
	if pl.Strategy == Staged {
		if pl.StageBytes > o.StageBytes {
			return fmt.Errorf("%w: %d staging bytes; the bound is %d", ErrLimit, pl.StageBytes, o.StageBytes)
		}
		partOps = make([]int, len(partBytes))
		for _, op := range pl.Ops {
			partOps[op.Part]++
		}
	}
	next, read, round, roundEnd := 0, 0, 0, 0
	for i, r := range pl.Reads {
		if r.First != next || r.N < 1 || r.N > len(pl.Ops)-next {
			return fmt.Errorf("%w: read %d feeds ops [%d,%d); the next op to feed is %d of %d", ErrCoverage, i, r.First, r.First+r.N, next, len(pl.Ops))
		}
		if r.Src%it != 0 || r.Len%it != 0 || r.Len <= 0 {
			return fmt.Errorf("%w: read %d (part %d, src %d, len %d) with item size %d", ErrAlignment, i, r.Part, r.Src, r.Len, it)
		}
		if r.Part < 0 || int(r.Part) >= len(partBytes) {
			return fmt.Errorf("%w: read %d reads part %d of %d", ErrBounds, i, r.Part, len(partBytes))
		}
		if n := partBytes[r.Part]; r.Src < 0 || r.Src > n-r.Len {
			return fmt.Errorf("%w: read %d reads [%d,%d) of part %d, which has %d bytes", ErrBounds, i, r.Src, r.Src+r.Len, r.Part, n)
		}
		ops := pl.Ops[r.First : r.First+r.N]
		if pl.Strategy == Scatter {
			if r.N > o.MaxSegments {
				return fmt.Errorf("%w: read %d has %d segments; the limit is %d", ErrLimit, i, r.N, o.MaxSegments)
			}
			if r.Kernel || r.Round != 0 || r.Stage != 0 {
				return fmt.Errorf("%w: scatter read %d has staging fields", ErrStrategy, i)
			}
			at := r.Src
			for j, op := range ops {
				if op.Part != r.Part || op.Src != at {
					return fmt.Errorf("%w: op %d (part %d, src %d) is not the next bytes of read %d (part %d at %d)", ErrCoverage, r.First+j, op.Part, op.Src, i, r.Part, at)
				}
				at += op.Len
			}
			if at != r.Src+r.Len {
				return fmt.Errorf("%w: the segments of read %d hold %d of its %d bytes", ErrCoverage, i, at-r.Src, r.Len)
			}
		} else {
			if r.Len > o.StageBytes {
				return fmt.Errorf("%w: read %d stages %d bytes; the bound is %d", ErrLimit, i, r.Len, o.StageBytes)
			}
			switch {
			case i == 0 && r.Round != 0, i > 0 && r.Round != round && r.Round != round+1:
				return fmt.Errorf("%w: read %d is in staging round %d after round %d", ErrStrategy, i, r.Round, round)
			case r.Round != round:
				round, roundEnd = r.Round, 0
			}
			if r.Stage%it != 0 || r.Stage < roundEnd || r.Stage > pl.StageBytes-r.Len {
				return fmt.Errorf("%w: read %d stages at [%d,%d) of %d bytes, over an earlier read of its round or outside the buffer", ErrBounds, i, r.Stage, r.Stage+r.Len, pl.StageBytes)
			}
			roundEnd = r.Stage + r.Len
			need := 0
			for j, op := range ops {
				if op.Part != r.Part || op.Src < r.Src || op.Src+op.Len > r.Src+r.Len {
					return fmt.Errorf("%w: op %d (part %d, [%d,%d)) is outside read %d (part %d, [%d,%d))", ErrCoverage, r.First+j, op.Part, op.Src, op.Src+op.Len, i, r.Part, r.Src, r.Src+r.Len)
				}
				need += op.Len
			}
			if r.Kernel {
				var cp *partCopy
				if int(r.Part) < len(pl.copies) {
					cp = pl.copies[r.Part]
				}
				switch {
				case r.Src != 0 || r.Len != partBytes[r.Part]:
					return fmt.Errorf("%w: kernel read %d holds [%d,%d) of part %d, not the whole part (%d bytes)", ErrStrategy, i, r.Src, r.Src+r.Len, r.Part, partBytes[r.Part])
				case r.N != partOps[r.Part]:
					return fmt.Errorf("%w: kernel read %d feeds %d of the %d runs of part %d", ErrCoverage, i, r.N, partOps[r.Part], r.Part)
				case cp == nil || cp.bytes != need:
					return fmt.Errorf("%w: the copy kernel of read %d does not move its %d bytes", ErrCoverage, i, need)
				}
			}
		}
		next += r.N
		read += r.Len
	}
	if next != len(pl.Ops) {
		return fmt.Errorf("%w: the reads feed %d of %d ops", ErrCoverage, next, len(pl.Ops))
	}
	for _, t := range pl.Trailers {
		read += t.Len
	}
	if pl.ReadBytes != read {
		return fmt.Errorf("%w: the plan says its reads move %d bytes but they move %d", ErrCoverage, pl.ReadBytes, read)
	}
	if pl.Strategy == Staged && len(pl.Reads) > 0 && pl.Rounds != round+1 {
		return fmt.Errorf("%w: the plan says %d staging rounds but its reads use %d", ErrStrategy, pl.Rounds, round+1)
	}
	if o.MaxBytes > 0 && read > o.MaxBytes {
		return fmt.Errorf("%w: %d bytes read; the limit is %d", ErrLimit, read, o.MaxBytes)
	}
	return nil
}

// StageBound returns the planner's bound of staging memory: a staged
// plan's rounds each fit a buffer of this size.
func (p *Planner) StageBound() int { return p.opts.StageBytes }

// Options returns the planner's options, with the strategy defaults
// filled in (the transport, MaxSegments, StageBytes, MaxGap).
func (p *Planner) Options() Options { return p.opts }
