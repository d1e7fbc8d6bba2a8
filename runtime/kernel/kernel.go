// Package kernel is what generated layout kernels plug into: the problem a
// kernel solves, the runs it emits, the registries of kernels and of
// layouts by name that init functions fill, the version guard, and the generic interpreter that runs any layout pair
// straight from the compiler's IR.
//
// A kernel moves the elements that two buffers have in common: every
// component, every common layer, every common KV head, every token of the
// page (or, with context parallelism, every common token: Problem.Tokens)
// and every element of the head. The source and the destination each
// have their own layout (an order of axes), their own layer list and head
// interval, and their own region structure.
package kernel

import (
	"fmt"
	"sync"
)

// GenVersion is the version of the generated code this runtime supports.
// Generated files carry
//
//	const _ = kernel.EnforceVersion(kernel.GenVersion - N)
//	const _ = kernel.EnforceVersion(N - kernel.MinGenVersion)
//
// so that a file generated for another runtime fails to compile. Version 2
// moves rows with Mover and Fence; version 3 names kernels unambiguously
// and joins layouts that split an axis by different factors; version 4
// kernels take token lists (Problem.Tokens) and say so (Kernels.Tokens);
// version 5 files register their layouts by name (RegisterLayout). Files
// of versions 1 to 4 use nothing this runtime lacks; those of versions 1
// to 3 have kernels that take no token list.
const (
	GenVersion    = 5
	MinGenVersion = 1
)

// EnforceVersion is a type whose conversion of a negative constant fails to
// compile; generated code uses it as its version guard.
type EnforceVersion uint

// Run is one contiguous byte range moved from a source region to a
// destination region. A store part is always region 0 of its side.
type Run struct {
	SrcRegion int32
	DstRegion int32
	Src       int // offset in the source region
	Dst       int // offset in the destination region
	Len       int // bytes
}

// End returns the offset one past the last destination byte.
func (r Run) End() int { return r.Dst + r.Len }

// Buffer is the geometry of one buffer of a transfer.
type Buffer struct {
	Layers int // L extent: how many layers this buffer holds
	Heads  int // H extent: how many KV heads this buffer holds
	Slots  int // S extent: pool pages; ignored by part layouts
	// Tokens is the T extent when Problem.Tokens is not nil: the tokens of
	// a page this buffer holds (a context-parallel rank holds a share of
	// them); 0 means PageSize. Ignored when Problem.Tokens is nil.
	Tokens int
	// Packed places the components of a layout whose outermost axis is C one
	// after another in region 0 (a store part: K region then V region).
	// Unpacked, component c lives alone in region c (SGLang's separate K and
	// V buffers). Layouts whose outermost axis is not C always use region 0.
	Packed bool
}

// LayerPair maps one common layer to its index on each side.
type LayerPair struct {
	Src, Dst int32
}

// TokenPair maps one common token to its local index on each side.
type TokenPair struct {
	Src, Dst int32
}

// Problem is everything a kernel needs to move one page between two buffers.
// Offsets are relative to slot 0 of a pool; callers add the slot's offset.
type Problem struct {
	ItemSize int   // bytes per element
	PageSize int   // T extent: tokens per page
	Dims     []int // head dim (elements) of each component, K then V
	Src, Dst Buffer
	// Layers lists the common layers in ascending order of both sides'
	// indices (both layer lists are sorted by global layer id).
	Layers []LayerPair
	// Heads common heads start at SrcHead on the source and DstHead on the
	// destination.
	SrcHead, DstHead, Heads int
	// Tokens, when not nil, lists the common tokens in ascending order of
	// both sides' local indices, and each side holds Buffer.Tokens tokens a
	// page: the buffers hold different token sets (context parallelism).
	// nil means every token 0..PageSize-1 on both sides. The Interpreter,
	// and kernels generated for version 4 on (Kernels.Tokens), take both.
	Tokens []TokenPair
}

// Bytes returns the number of bytes p moves: every element of the common
// layers, heads and tokens, of every component.
func (p *Problem) Bytes() int {
	n := 0
	for _, d := range p.Dims {
		n += d
	}
	tokens := p.PageSize
	if p.Tokens != nil {
		tokens = len(p.Tokens)
	}
	return n * p.ItemSize * tokens * len(p.Layers) * p.Heads
}

// RangeFunc appends to runs the byte runs of p, merging runs that are
// contiguous on both sides, and returns the extended slice.
type RangeFunc func(p *Problem, runs []Run) []Run

// CopyFunc moves the bytes of p from the source regions to the destination
// regions. Region slices are indexed from the region start (slot 0).
type CopyFunc func(p *Problem, dst, src [][]byte)

// Pair names a (source layout, destination layout) pair by the layouts'
// canonical identities, for example "part(C T L H D)".
type Pair struct {
	Src, Dst string
}

func (p Pair) String() string { return p.Src + " -> " + p.Dst }

// Kernels is what a generated file registers for one layout pair.
type Kernels struct {
	Pair   Pair
	Range  RangeFunc
	Copy   CopyFunc
	Digest string // digest of the lowered pair the kernels were generated from
	Origin string // the .kvl file and layout names, for conflict messages
	// Tokens is true when Range and Copy take a token list (Problem.Tokens):
	// the interpreter's, and those generated for version 4 on. Kernels of
	// older generated files move every token of a page whatever the list,
	// and must not be given one.
	Tokens bool
}

// registry holds the registered kernels. Init functions register, and
// planners look up, from any goroutine: a package loaded by a plugin, say,
// registers while requests are planned.
var registry struct {
	sync.RWMutex
	m map[Pair]*Kernels
}

// Register adds generated kernels. Registering the same pair again with the
// same digest is a no-op; with another digest it is an error naming both.
// It is called from init functions, which panic on the error. It is safe
// to call concurrently with itself and with Lookup.
func Register(k *Kernels) error {
	registry.Lock()
	defer registry.Unlock()
	if old, ok := registry.m[k.Pair]; ok {
		if old.Digest == k.Digest {
			return nil
		}
		return fmt.Errorf("kernel: conflicting kernels for %s: %s (digest %s) and %s (digest %s)",
			k.Pair, old.Origin, old.Digest, k.Origin, k.Digest)
	}
	if registry.m == nil {
		registry.m = map[Pair]*Kernels{}
	}
	registry.m[k.Pair] = k
	return nil
}

// MustRegister is Register for init functions.
func MustRegister(k *Kernels) {
	if err := Register(k); err != nil {
		panic(err)
	}
}

// Lookup returns the generated kernels for a pair, or nil.
func Lookup(p Pair) *Kernels {
	registry.RLock()
	defer registry.RUnlock()
	return registry.m[p]
}

// Registered returns the number of registered pairs.
func Registered() int {
	registry.RLock()
	defer registry.RUnlock()
	return len(registry.m)
}

// Emit appends run r to runs, extending the last run instead when r
// continues it on both sides.
func Emit(runs []Run, r Run) []Run {
	if n := len(runs); n > 0 {
		l := &runs[n-1]
		if l.Src+l.Len == r.Src && l.Dst+l.Len == r.Dst && l.SrcRegion == r.SrcRegion && l.DstRegion == r.DstRegion {
			l.Len += r.Len
			return runs
		}
	}
	// Field by field, for the reason EmitStrided gives.
	runs = append(runs, Run{})
	l := &runs[len(runs)-1]
	l.SrcRegion, l.DstRegion, l.Src, l.Dst, l.Len = r.SrcRegion, r.DstRegion, r.Src, r.Dst, r.Len
	return runs
}

// Grow returns out, or a copy of its first n runs in a longer slice, so
// that out[n:] has room for need more runs. Range kernels write runs by
// index into the room it makes; len(out) is its capacity.
func Grow(out []Run, n, need int) []Run {
	if len(out)-n >= need {
		return out
	}
	s := make([]Run, max(2*len(out), n+need))
	copy(s, out[:n])
	return s
}

// EmitStrided writes n runs of length run at out[nr:], the first at offsets
// s and d, each ss and ds further on, and returns nr+n. It is the innermost
// loop of a range kernel whose runs cannot continue each other; out must
// have room (see Grow).
func EmitStrided(out []Run, nr, s, d, ss, ds, n, run int, sr, dr int32) int {
	// Field by field: a composite literal is built on the stack and copied
	// with wide loads that cannot forward from its narrow stores, which
	// made each run several times slower.
	for i, w := 0, out[nr:nr+n]; i < len(w); i++ {
		r := &w[i]
		r.SrcRegion, r.DstRegion, r.Src, r.Dst, r.Len = sr, dr, s, d, run
		s += ss
		d += ds
	}
	return nr + n
}

// ConsecutiveLayers reports whether the common layers are consecutive on both
// sides, so that a layer loop can fold into the run inside it.
func ConsecutiveLayers(ls []LayerPair) bool {
	for i := 1; i < len(ls); i++ {
		if ls[i].Src != ls[i-1].Src+1 || ls[i].Dst != ls[i-1].Dst+1 {
			return false
		}
	}
	return true
}
