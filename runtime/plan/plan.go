package plan

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/internal/lru"
	"github.com/kvreshard/kvreshard/runtime/kernel"
	"github.com/kvreshard/kvreshard/runtime/manifest"
)

// Op reads Len bytes at offset Src of part Part into offset Dst of region
// Region of the binding. Dst is relative to the page's slot in a template.
type Op struct {
	Part   int32
	Region int32
	Src    int
	Dst    int
	Len    int
}

// Plan is the ops of one page for one reader rank, proven to cover exactly
// the rank's share of the page, with no destination byte written twice.
type Plan struct {
	ManifestID string
	Manifest   *manifest.Manifest
	Ops        []Op
	Bytes      int
	// Interpreted is true when a pair of this plan had no compiled kernels
	// and ran on the interpreter.
	Interpreted bool
	// TokenLists is true when a part holds other tokens than the binding
	// (context parallelism), so that the range kernel walked a list of
	// their common tokens: the compiled kernel when it takes token lists
	// (kernel.Kernels.Tokens), the interpreter otherwise. This is not a
	// fallback.
	TokenLists bool

	// Strategy is how the plan moves the bytes (strategy.go). Ops are always
	// the runs, one destination segment each, that the proof covers; a
	// direct plan issues each as one transport operation (Reads is nil),
	// while scatter and staged plans issue Reads, each feeding a slice of
	// Ops.
	Strategy Strategy
	Reads    []Read
	// ReadBytes is what the transport moves: Bytes, plus for a staged plan
	// the unneeded bytes its reads include.
	ReadBytes int
	// StageBytes is the largest staging round of a staged plan, Rounds how
	// many rounds it has.
	StageBytes int
	Rounds     int
	// Estimate is the cost model's time for the plan on the planner's
	// transport; Estimates has that of each strategy considered (0: not
	// considered or not valid).
	Estimate  time.Duration
	Estimates [Auto]time.Duration
	// Checked marks a checked plan (Planner.Checked): staged, its reads
	// hold whole checksum blocks, Checks are the blocks each read's runs
	// take (ReadChecks), and Trailers reads the trailer of each part it
	// reads, in part order, into memory of the reader's (not staging).
	// ReadBytes and OpCount count the trailer reads.
	Checked  bool
	Checks   []BlockRange
	Trailers []Read
	checkAt  []int // Checks[checkAt[i]:checkAt[i+1]] are those of read i
	// copies has, per part, the kernel copy of a staged read that holds
	// the whole part.
	copies []*partCopy
}

// Errors of plan validation, tested with errors.Is; the error text says
// which op and which bytes.
var (
	ErrCoverage     = errors.New("plan does not cover the requirement")
	ErrOverlap      = errors.New("plan writes a destination byte twice")
	ErrBounds       = errors.New("plan op out of bounds")
	ErrAlignment    = errors.New("plan op not aligned to the item size")
	ErrLimit        = errors.New("plan over its limits")
	ErrNoKernel     = errors.New("no compiled kernels for the layout pair")
	ErrIncompatible = errors.New("manifest does not match the reader's model")
)

// Options bound and configure a planner.
type Options struct {
	MaxOps   int // 0: no limit
	MaxBytes int // 0: no limit
	// RequireCompiled makes a layout pair with no generated kernels an
	// error instead of a run on the interpreter.
	RequireCompiled bool
	// Templates bounds the template cache (layouts); 0 means 64.
	Templates int

	// Strategy is the plans' strategy; Auto lets the cost model of
	// Transport choose per template. The zero value is Direct.
	Strategy Strategy
	// Transport is the cost model (nil: MemoryTransport).
	Transport *Transport
	// MaxSegments bounds the destination segments of a scatter read (0:
	// the transport's default; at most its SegmentLimit).
	MaxSegments int
	// StageBytes bounds the staging memory of a staged plan: a round of
	// staging reads holds at most half of it, so that a reader can read
	// one round while it copies another, except a part read whole and
	// copied by its kernel, which may take all of it (0:
	// DefaultStageBytes).
	StageBytes int
	// MaxGap is the largest run of unneeded bytes a staged read may include
	// between needed ones (0: what the transport moves in the time of one
	// operation; -1: none).
	MaxGap int
}

// Planner plans the reads of one rank into one binding.
type Planner struct {
	geo  *Geometry
	opts Options

	mu        sync.Mutex
	kernels   map[string]*kernel.Kernels // by manifest part-layout identity
	templates *lru.Cache[*Plan]          // by manifest ID

	fallbacks  atomic.Int64
	tokenPlans atomic.Int64
}

// NewPlanner returns a planner for pages of descriptor d read into b.
func NewPlanner(d *manifest.Descriptor, b Binding, opts Options) (*Planner, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	g, err := NewGeometry(d, b)
	if err != nil {
		return nil, err
	}
	if opts.Templates <= 0 {
		opts.Templates = 64
	}
	if err := opts.resolveStrategy(d.ItemSize); err != nil {
		return nil, err
	}
	return &Planner{geo: g, opts: opts, kernels: map[string]*kernel.Kernels{}, templates: lru.New[*Plan](opts.Templates)}, nil
}

// Geometry returns the binding's checked geometry.
func (p *Planner) Geometry() *Geometry { return p.geo }

// Fallbacks counts the plans built with the interpreter because the
// layout pair was not compiled.
func (p *Planner) Fallbacks() int64 { return p.fallbacks.Load() }

// TokenPlans counts the plans that walked token lists (Plan.TokenLists).
func (p *Planner) TokenPlans() int64 { return p.tokenPlans.Load() }

// tokenKernels returns the kernels of parts whose tokens differ from the
// binding's: k, the kernels of kernelsFor, when they take token lists (the
// generated ones of version 4 on, and the interpreter), else the
// interpreter of the pair.
func (p *Planner) tokenKernels(m *manifest.Manifest, k *kernel.Kernels) (*kernel.Kernels, error) {
	if k.Tokens {
		return k, nil
	}
	key := m.Layout.Name + "\x00" + m.Layout.Order + "\x00tokens"
	p.mu.Lock()
	in := p.kernels[key]
	p.mu.Unlock()
	if in != nil {
		return in, nil
	}
	src, err := Layout(m)
	if err != nil {
		return nil, err
	}
	pr, err := ir.Lower(src, p.geo.Layout)
	if err != nil {
		return nil, err
	}
	in = kernel.Interpreter{IR: pr}.Kernels()
	p.mu.Lock()
	p.kernels[key] = in
	p.mu.Unlock()
	return in, nil
}

// kernelsFor returns the kernels from a manifest's part layout to the
// binding's layout: the generated ones, or the interpreter. The parsed
// layout and its kernels are cached by the manifest's layout text, so a
// plan parses nothing.
func (p *Planner) kernelsFor(m *manifest.Manifest) (*kernel.Kernels, error) {
	key := m.Layout.Name + "\x00" + m.Layout.Order
	p.mu.Lock()
	k := p.kernels[key]
	p.mu.Unlock()
	if k != nil {
		return k, nil
	}
	src, err := Layout(m)
	if err != nil {
		return nil, err
	}
	dst := p.geo.Layout
	k = kernel.Lookup(kernel.Pair{Src: src.Identity(), Dst: dst.Identity()})
	if k == nil {
		if p.opts.RequireCompiled {
			return nil, fmt.Errorf("%w: %s -> %s; link a package generated by kvlc for these layouts, or allow the interpreter",
				ErrNoKernel, src.Identity(), dst.Identity())
		}
		ir, err := ir.Lower(src, dst)
		if err != nil {
			return nil, err
		}
		k = kernel.Interpreter{IR: ir}.Kernels()
	}
	p.mu.Lock()
	p.kernels[key] = k
	p.mu.Unlock()
	return k, nil
}

// Layout returns the part layout of a manifest, checked against d.
func Layout(m *manifest.Manifest) (*ir.Layout, error) {
	l, err := ir.ParseLayout(ir.Part, m.Layout.Name, m.Layout.Order)
	if err != nil {
		return nil, err
	}
	if err := checkLayout(&m.Descriptor, l); err != nil {
		return nil, err
	}
	return l, nil
}

// Build plans one page of manifest m, without the template cache.
func (p *Planner) Build(m *manifest.Manifest) (*Plan, error) {
	d := p.geo.Desc
	if !sameDescriptor(&m.Descriptor, d) {
		return nil, fmt.Errorf("%w: manifest %s describes another page geometry", ErrIncompatible, m.ID())
	}
	k, err := p.kernelsFor(m)
	if err != nil {
		return nil, err
	}
	interp := k.Origin == "interpreter"
	pl := &Plan{ManifestID: m.ID(), Manifest: m, Interpreted: interp}
	if interp {
		p.fallbacks.Add(1)
	}
	b := &p.geo.Binding
	bt := b.Tokens.Norm()
	prob := kernel.Problem{
		ItemSize: d.ItemSize,
		PageSize: d.PageSize,
		Dims:     d.HeadDims,
		Dst:      kernel.Buffer{Layers: len(b.Layers), Heads: b.Heads, Slots: b.Slots, Tokens: bt.Tokens(d.PageSize)},
	}
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	ops := sc.ops[:0]
	var lists tokenLists
	for i, part := range m.Parts {
		h0 := max(part.HeadStart, b.HeadStart)
		h1 := min(part.HeadStart+part.HeadCount, b.HeadStart+b.Heads)
		if h1 <= h0 {
			continue
		}
		sc.layers = commonLayers(sc.layers[:0], part.Layers, b.Layers)
		if len(sc.layers) == 0 {
			continue
		}
		pt, pk := part.TokenSet.Norm(), k
		prob.Src = kernel.Buffer{Layers: len(part.Layers), Heads: part.HeadCount, Slots: 1, Packed: true, Tokens: pt.Tokens(d.PageSize)}
		if pt.Same(bt) {
			// Both sides hold the same tokens, in the same order: the
			// problem of a page of that many tokens, for any kernel.
			prob.PageSize, prob.Tokens = prob.Src.Tokens, nil
		} else {
			prob.PageSize, prob.Tokens = d.PageSize, lists.get(d.PageSize, pt, bt)
			if len(prob.Tokens) == 0 {
				continue
			}
			if pk, err = p.tokenKernels(m, k); err != nil {
				return nil, err
			}
			pl.TokenLists = true
		}
		prob.Layers = sc.layers
		prob.SrcHead, prob.DstHead, prob.Heads = h0-part.HeadStart, h0-b.HeadStart, h1-h0
		sc.runs = pk.Range(&prob, sc.runs[:0])
		if prob.Tokens != nil {
			sc.runs = mergeRuns(sc.runs)
		}
		n := len(ops)
		ops = slices.Grow(ops, len(sc.runs))[:n+len(sc.runs)]
		for j := range sc.runs {
			// Field by field: a composite literal copied whole stalls on
			// store forwarding (see kernel.EmitStrided).
			r, op := &sc.runs[j], &ops[n+j]
			op.Part, op.Region, op.Src, op.Dst, op.Len = int32(i), r.DstRegion, r.Src, r.Dst, r.Len
			pl.Bytes += r.Len
		}
	}
	sc.ops = ops
	// One allocation of the plan's exact size, instead of growing it op by
	// op: growth copies were most of the time of building a large plan.
	pl.Ops = slices.Clone(ops)
	if pl.TokenLists {
		p.tokenPlans.Add(1)
	}
	out, err := p.choose(m, k, pl)
	if out != nil {
		out.TokenLists = pl.TokenLists
	}
	return out, err
}

// mergeRuns sorts the runs of one part by source offset and merges those
// that continue each other on both sides. The interpreter walks a token
// list at the outermost T loop, so where a layout puts other axes between
// its T digits, runs that continue each other are not emitted one after
// the other; in source order they are, and the result is the fewest runs.
func mergeRuns(runs []kernel.Run) []kernel.Run {
	less := func(a, b kernel.Run) int {
		if a.SrcRegion != b.SrcRegion {
			return int(a.SrcRegion - b.SrcRegion)
		}
		return a.Src - b.Src
	}
	if slices.IsSortedFunc(runs, less) {
		return runs // emitted in source order: already merged
	}
	slices.SortFunc(runs, less)
	out := runs[:0]
	for _, r := range runs {
		out = kernel.Emit(out, r)
	}
	return out
}

// tokenLists holds the common tokens of each part token set a plan met
// (the parts of a manifest share a few: one per CP rank).
type tokenLists struct {
	sets  []manifest.TokenSet
	lists [][]kernel.TokenPair
}

// get returns the common tokens of src and dst, in a page of page tokens,
// as local index pairs in ascending order.
func (t *tokenLists) get(page int, src, dst manifest.TokenSet) []kernel.TokenPair {
	if i := slices.Index(t.sets, src); i >= 0 {
		return t.lists[i]
	}
	out := []kernel.TokenPair{}
	for j, n := 0, src.Tokens(page); j < n; j++ {
		if l, ok := dst.Local(src.Global(j)); ok {
			out = append(out, kernel.TokenPair{Src: int32(j), Dst: int32(l)})
		}
	}
	t.sets = append(t.sets, src)
	t.lists = append(t.lists, out)
	return out
}

// scratch is what Build reuses from one plan to the next: the layer pairs
// and runs of one part, and the ops of the plan.
type scratch struct {
	layers []kernel.LayerPair
	runs   []kernel.Run
	ops    []Op
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// bitsPool holds the bitsets of Verify, one bit per item of a page.
var bitsPool = sync.Pool{New: func() any { return new([]uint64) }}

// commonLayers appends the layers both sorted lists hold, as index pairs.
func commonLayers(out []kernel.LayerPair, src, dst []int) []kernel.LayerPair {
	i, j := 0, 0
	for i < len(src) && j < len(dst) {
		switch {
		case src[i] < dst[j]:
			i++
		case src[i] > dst[j]:
			j++
		default:
			out = append(out, kernel.LayerPair{Src: int32(i), Dst: int32(j)})
			i++
			j++
		}
	}
	return out
}

func sameDescriptor(a, b *manifest.Descriptor) bool {
	return a.KVHeads == b.KVHeads && a.ItemSize == b.ItemSize && a.PageSize == b.PageSize && a.Dtype == b.Dtype &&
		a.DraftLayers == b.DraftLayers && slices.Equal(a.Layers, b.Layers) && slices.Equal(a.HeadDims, b.HeadDims)
}

// Verify proves a plan before any transfer: every op inside its part, its
// region and the page's footprint at slot 0, aligned to the item size; no
// destination byte written twice; the page's footprint covered exactly;
// the op count (transport operations) and bytes under the limits; and the
// reads of a scatter or staged plan feeding every op exactly once within
// their segment and staging bounds (verifyReads).
func (p *Planner) Verify(pl *Plan) error {
	g := p.geo
	it := g.Desc.ItemSize
	if p.opts.MaxOps > 0 && pl.OpCount() > p.opts.MaxOps {
		return fmt.Errorf("%w: %d ops; the limit is %d", ErrLimit, pl.OpCount(), p.opts.MaxOps)
	}
	if p.opts.MaxBytes > 0 && pl.Bytes > p.opts.MaxBytes {
		return fmt.Errorf("%w: %d bytes; the limit is %d", ErrLimit, pl.Bytes, p.opts.MaxBytes)
	}
	// One bit per granule of the page's footprint in each region: the
	// largest power of two that divides every op's destination offset and
	// length and every block size (at least the item size once alignment
	// is checked), so a 256-byte run sets one bit, not 128.
	acc := it
	for r := range g.Regions {
		acc |= g.BlockBytes[r]
	}
	for _, op := range pl.Ops {
		acc |= op.Dst | op.Len
	}
	gshift := bits.TrailingZeros(uint(acc))
	seen := make([][]uint64, len(g.Regions))
	words := 0
	for r := range seen {
		words += (g.Blocks[r]*g.BlockBytes[r]>>gshift + 63) / 64
	}
	pooled := bitsPool.Get().(*[]uint64)
	defer bitsPool.Put(pooled)
	if cap(*pooled) < words {
		*pooled = make([]uint64, words)
	}
	all := (*pooled)[:words]
	clear(all)
	for r := range seen {
		n := (g.Blocks[r]*g.BlockBytes[r]>>gshift + 63) / 64
		seen[r], all = all[:n:n], all[n:]
	}
	partBytes := make([]int, len(pl.Manifest.Parts))
	for i := range partBytes {
		partBytes[i] = pl.Manifest.PartBytes(i)
	}
	// Item sizes are 1, 2 or 4 (Descriptor.Validate): mask and shift
	// instead of dividing, and divide by the block stride only when the
	// footprint has more than one block.
	mask := it - 1
	total := 0
	for i, op := range pl.Ops {
		if (op.Src|op.Dst|op.Len)&mask != 0 || op.Len <= 0 {
			return fmt.Errorf("%w: op %d (part %d, src %d, dst %d, len %d) with item size %d", ErrAlignment, i, op.Part, op.Src, op.Dst, op.Len, it)
		}
		if op.Part < 0 || int(op.Part) >= len(pl.Manifest.Parts) {
			return fmt.Errorf("%w: op %d reads part %d of %d", ErrBounds, i, op.Part, len(pl.Manifest.Parts))
		}
		if n := partBytes[op.Part]; op.Src < 0 || op.Src > n-op.Len {
			return fmt.Errorf("%w: op %d reads [%d,%d) of part %d, which has %d bytes", ErrBounds, i, op.Src, op.Src+op.Len, op.Part, n)
		}
		r := int(op.Region)
		if r < 0 || r >= len(g.Regions) {
			return fmt.Errorf("%w: op %d writes region %d of %d", ErrBounds, i, r, len(g.Regions))
		}
		block, within := 0, op.Dst
		if g.Blocks[r] > 1 {
			block, within = op.Dst/g.BlockStride[r], op.Dst%g.BlockStride[r]
		}
		room := g.BlockBytes[r] // footprint bytes from the op's block on
		if g.BlockStride[r] == g.BlockBytes[r] {
			// Adjacent blocks (one slot) are one contiguous footprint, and
			// a run may cross from one into the next.
			room *= g.Blocks[r] - block
		}
		if op.Dst < 0 || block >= g.Blocks[r] || op.Len > room-within {
			return fmt.Errorf("%w: op %d writes [%d,%d) of region %s, outside the page at slot 0", ErrBounds, i, op.Dst, op.Dst+op.Len, g.RegionNames[r])
		}
		lo := (block*g.BlockBytes[r] + within) >> gshift
		if k := setBits(seen[r], lo, op.Len>>gshift); k >= 0 {
			return fmt.Errorf("%w: op %d writes byte %d of region %s again", ErrOverlap, i, op.Dst+(k-lo)<<gshift, g.RegionNames[r])
		}
		total += op.Len
	}
	if total != g.PageBytes {
		return fmt.Errorf("%w: the ops write %d of the page's %d bytes", ErrCoverage, total, g.PageBytes)
	}
	if pl.Bytes != total {
		// The byte limit above was checked against pl.Bytes.
		return fmt.Errorf("%w: the plan says %d bytes but its ops write %d", ErrCoverage, pl.Bytes, total)
	}
	if err := p.verifyReads(pl, partBytes); err != nil {
		return err
	}
	return verifyChecked(pl, partBytes)
}

// setBits sets bits [lo, lo+n) and returns the first that was already set,
// or -1.
func setBits(b []uint64, lo, n int) int {
	for i := lo; i < lo+n; {
		w, bit := i/64, uint(i%64)
		k := min(64-int(bit), lo+n-i)
		mask := ^uint64(0) >> (64 - uint(k)) << bit
		if b[w]&mask != 0 {
			for j := i; ; j++ {
				if b[j/64]&(1<<uint(j%64)) != 0 {
					return j
				}
			}
		}
		b[w] |= mask
		i += k
	}
	return -1
}
