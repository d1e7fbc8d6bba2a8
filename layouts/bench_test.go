package layouts_test

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/kvreshard/kvreshard/compiler"
	"github.com/kvreshard/kvreshard/compiler/ir"
	_ "github.com/kvreshard/kvreshard/examples/customlayout"
	"github.com/kvreshard/kvreshard/layouts"
	"github.com/kvreshard/kvreshard/runtime/kernel"
	"github.com/kvreshard/kvreshard/testkit/kerneltest"
)

// The benchmarks time a generated kernel and its baseline alternately, in
// the same run on the same buffers, and report the ratio:
//
//	BenchmarkCopy              generated copy kernel vs copy() of the same number of bytes
//	BenchmarkCopyInterpreter   generated copy kernel vs the interpreter's copy
//	BenchmarkRange             generated range kernel vs the interpreter's, and ns per run
//
// ns/op is the generated kernel's time for one page, and every figure is a
// median over rounds (see pairwise). Run them with
//
//	go test -run '^$' -bench . -benchtime 200ms ./layouts/

// benchCase is one page moved between two layouts of builtin.kvl (or of
// the customlayout example, when custom is set). The source holds heads
// [srcHead, srcHead+srcHeads); the destination holds all heads and both
// sides hold all layers.
type benchCase struct {
	src, dst          string
	custom            bool
	item, page, dim   int
	layers, heads     int
	srcHead, srcHeads int
}

func (c benchCase) name() string {
	n := fmt.Sprintf("%s->%s/i%d_d%d_p%d_L%d_H%d", c.src, c.dst, c.item, c.dim, c.page, c.layers, c.heads)
	if c.srcHeads != c.heads {
		n += fmt.Sprintf("_heads%d+%d", c.srcHead, c.srcHeads)
	}
	return n
}

// bf16, head dim 128, page 64, 32 layers x 8 KV heads: 8 MiB a page.
func bf16(src, dst string) benchCase {
	return benchCase{src: src, dst: dst, item: 2, page: 64, dim: 128, layers: 32, heads: 8, srcHeads: 8}
}

var (
	plhdToPageHead = bf16("PLHD", "page_head") // read, 256-byte runs
	pageHeadToPLHD = bf16("page_head", "PLHD") // write, 256-byte runs
	// 2 layers (512 KiB a page): both buffers stay in the 1 MiB L2.
	plhdToPageHeadL2 = benchCase{src: "PLHD", dst: "page_head", item: 2, page: 64, dim: 128, layers: 2, heads: 8, srcHeads: 8}
	layerFirst       = bf16("LPHD", "layer_first")
	// A TP-2 writer's half of the heads read by a TP-1 reader: 1 KiB runs.
	tpHalf = benchCase{src: "PLHD", dst: "page_first", item: 2, page: 64, dim: 128, layers: 32, heads: 8, srcHead: 4, srcHeads: 4}
	// fp8, head dim 64: 64-byte runs, below what the copy target covers.
	fp8 = benchCase{src: "PLHD", dst: "page_head", item: 1, page: 64, dim: 64, layers: 32, heads: 8, srcHeads: 8}
	// vLLM's x-blocked key cache read into a per-layer host pool: 16-byte
	// runs (8 bf16 elements).
	xblock = benchCase{src: "vllm_xblock", dst: "vllm_host", custom: true, item: 2, page: 64, dim: 128, layers: 32, heads: 8, srcHeads: 8}
)

// benchSetup is a case ready to run: its problem, the generated kernels and
// the interpreter, source regions and destination regions.
type benchSetup struct {
	p        *kernel.Problem
	gen      *kernel.Kernels
	interp   kernel.Interpreter
	src, dst [][]byte
	bytes    int // bytes moved
	runs     int // runs of the page
}

func newBenchSetup(b *testing.B, c benchCase) *benchSetup {
	b.Helper()
	name, text := "builtin.kvl", layouts.Builtin
	if c.custom {
		name = "custom.kvl"
		var err error
		if text, err = os.ReadFile("../examples/customlayout/custom.kvl"); err != nil {
			b.Fatal(err)
		}
	}
	f, err := compiler.Compile(name, text)
	if err != nil {
		b.Fatal(err)
	}
	var pair *ir.Nest
	for _, p := range f.Ranges {
		if p.Src.Name == c.src && p.Dst.Name == c.dst {
			pair = p
		}
	}
	if pair == nil {
		b.Fatalf("no pair %s -> %s in %s", c.src, c.dst, name)
	}
	all := make([]int, c.layers)
	for i := range all {
		all[i] = i
	}
	g := kerneltest.Shape{ItemSize: c.item, PageSize: c.page, Dims: []int{c.dim, c.dim}}
	// Parts are packed (K region then V region); pools keep K and V in
	// separate buffers, as SGLang's host pools do.
	src := kerneltest.Buffer{Layout: pair.Src, Layers: all, HeadStart: c.srcHead, Heads: c.srcHeads, Slots: 1,
		Packed: pair.Src.Kind == ir.Part}
	dst := kerneltest.Buffer{Layout: pair.Dst, Layers: all, Heads: c.heads, Slots: 1,
		Packed: pair.Dst.Kind == ir.Part}
	s := &benchSetup{p: g.Problem(&src, &dst), interp: kernel.Interpreter{IR: pair}}
	s.gen = kernel.Lookup(kernel.Pair{Src: pair.Src.Identity(), Dst: pair.Dst.Identity()})
	if s.gen == nil {
		b.Fatalf("no generated kernels for %s", pair.Key())
	}
	for _, n := range g.Regions(&src) {
		r := make([]byte, n)
		for i := range r {
			r[i] = byte(i*7 + i>>8)
		}
		s.src = append(s.src, r)
	}
	for _, n := range g.Regions(&dst) {
		s.dst = append(s.dst, make([]byte, n))
	}
	runs := s.gen.Range(s.p, nil)
	s.runs = len(runs)
	for _, r := range runs {
		s.bytes += r.Len
	}
	// The kernels must be right before they are fast.
	if want := s.interp.Range(s.p, nil); !slices.Equal(want, runs) {
		b.Fatalf("generated and interpreted runs differ")
	}
	want := s.blankDst()
	s.interp.Copy(s.p, want, s.src)
	s.gen.Copy(s.p, s.dst, s.src)
	for i := range want {
		if !bytes.Equal(want[i], s.dst[i]) {
			b.Fatalf("generated and interpreted copies differ in region %d", i)
		}
	}
	return s
}

func (s *benchSetup) blankDst() [][]byte {
	out := make([][]byte, len(s.dst))
	for i := range s.dst {
		out[i] = make([]byte, len(s.dst[i]))
	}
	return out
}

// flatCopy copies n bytes from the source regions, taken as one stream, to
// the destination regions, taken as one stream: the fewest copy() calls
// that move as many bytes between the same buffers.
func flatCopy(dst, src [][]byte, n int) {
	var si, so, di, do int
	for n > 0 {
		k := min(n, len(src[si])-so, len(dst[di])-do)
		copy(dst[di][do:do+k], src[si][so:so+k])
		n, so, do = n-k, so+k, do+k
		if so == len(src[si]) {
			si, so = si+1, 0
		}
		if do == len(dst[di]) {
			di, do = di+1, 0
		}
	}
}

// pairwise runs f and its baseline g alternately for b.N rounds, each
// round a batch of calls of f then as many of g (a batch lasts at least
// 20µs, so that reading the clock does not count). It returns medians over
// the rounds, which a loaded machine disturbs less than means: the ns of
// one call of f, of g, and the ratio g/f of a round. ns/op is f's.
func pairwise(b *testing.B, f, g func()) (nsF, nsG, ratio float64) {
	f()
	g()
	t0 := time.Now()
	f()
	batch := max(1, int(20*time.Microsecond/max(time.Since(t0), 1)))
	b.ResetTimer()
	tf := make([]float64, 0, b.N)
	tg := make([]float64, 0, b.N)
	r := make([]float64, 0, b.N)
	for range b.N {
		t0 := time.Now()
		for range batch {
			f()
		}
		t1 := time.Now()
		for range batch {
			g()
		}
		df, dg := float64(t1.Sub(t0).Nanoseconds()), float64(time.Since(t1).Nanoseconds())
		tf = append(tf, df/float64(batch))
		tg = append(tg, dg/float64(batch))
		r = append(r, dg/max(df, 1))
	}
	b.StopTimer()
	nsF, nsG, ratio = median(tf), median(tg), median(r)
	b.ReportMetric(nsF, "ns/op")
	return nsF, nsG, ratio
}

func median(xs []float64) float64 {
	slices.Sort(xs)
	return xs[len(xs)/2]
}

func gbps(bytes int, ns float64) float64 { return float64(bytes) / ns }

// BenchmarkCopy: the generated copy kernel against copy() of the same
// number of bytes between the same buffers (target: at least 0.8 of its
// throughput for runs of 256 bytes and more).
func BenchmarkCopy(b *testing.B) {
	for _, c := range []benchCase{
		plhdToPageHead,
		plhdToPageHeadL2,
		pageHeadToPLHD,
		bf16("HPLD", "page_first"), // read, 256-byte runs
		layerFirst,
		bf16("PLHD", "page_first"), // one run per component
		tpHalf,
		fp8,
		// 80 layers (20 MiB a page): source and destination exceed the
		// last-level cache, so both sides run at memory bandwidth.
		{src: "PLHD", dst: "page_head", item: 2, page: 64, dim: 128, layers: 80, heads: 8, srcHeads: 8},
	} {
		b.Run(c.name(), func(b *testing.B) {
			s := newBenchSetup(b, c)
			gen, base, ratio := pairwise(b,
				func() { s.gen.Copy(s.p, s.dst, s.src) },
				func() { flatCopy(s.dst, s.src, s.bytes) })
			b.ReportMetric(float64(s.bytes)/float64(s.runs), "B/run")
			b.ReportMetric(gbps(s.bytes, gen), "GB/s")
			b.ReportMetric(gbps(s.bytes, base), "copy()-GB/s")
			b.ReportMetric(ratio, "x-copy()")
		})
	}
}

// BenchmarkCopyRuns: the generated copy kernel against a loop of copy()
// calls over the same runs, precomputed. The loop is the floor of any
// kernel that moves these runs one memmove each, so the ratio is what the
// kernel's own loops cost; copy() of the whole page (BenchmarkCopy) also
// pays for the strided access pattern, which no loop order avoids.
func BenchmarkCopyRuns(b *testing.B) {
	for _, c := range []benchCase{plhdToPageHead, pageHeadToPLHD, bf16("HPLD", "page_first"), tpHalf, fp8} {
		b.Run(c.name(), func(b *testing.B) {
			s := newBenchSetup(b, c)
			runs := s.gen.Range(s.p, nil)
			gen, loop, ratio := pairwise(b,
				func() { s.gen.Copy(s.p, s.dst, s.src) },
				func() {
					for _, r := range runs {
						copy(s.dst[r.DstRegion][r.Dst:r.Dst+r.Len], s.src[r.SrcRegion][r.Src:r.Src+r.Len])
					}
				})
			b.ReportMetric(gbps(s.bytes, gen), "GB/s")
			b.ReportMetric(gbps(s.bytes, loop), "loop-GB/s")
			b.ReportMetric(ratio, "x-loop")
		})
	}
}

// BenchmarkCopyInterpreter: the generated copy kernel against the
// interpreter's (target: at least 3x faster).
func BenchmarkCopyInterpreter(b *testing.B) {
	for _, c := range []benchCase{plhdToPageHead, plhdToPageHeadL2, layerFirst, fp8, xblock} {
		b.Run(c.name(), func(b *testing.B) {
			s := newBenchSetup(b, c)
			gen, in, ratio := pairwise(b,
				func() { s.gen.Copy(s.p, s.dst, s.src) },
				func() { s.interp.Copy(s.p, s.dst, s.src) })
			b.ReportMetric(float64(s.bytes)/float64(s.runs), "B/run")
			b.ReportMetric(gbps(s.bytes, gen), "GB/s")
			b.ReportMetric(gbps(s.bytes, in), "interp-GB/s")
			b.ReportMetric(ratio, "x-interp")
		})
	}
}

// BenchmarkRange: the generated range kernel against the interpreter's
// (target: at least 3x faster), and the ns per run it emits.
func BenchmarkRange(b *testing.B) {
	for _, c := range []benchCase{plhdToPageHead, pageHeadToPLHD, layerFirst, tpHalf, xblock} {
		b.Run(c.name(), func(b *testing.B) {
			s := newBenchSetup(b, c)
			runs := make([]kernel.Run, 0, s.runs)
			gen, in, ratio := pairwise(b,
				func() { runs = s.gen.Range(s.p, runs[:0]) },
				func() { runs = s.interp.Range(s.p, runs[:0]) })
			b.ReportMetric(float64(s.runs), "runs/op")
			b.ReportMetric(gen/float64(s.runs), "ns/run")
			b.ReportMetric(in/float64(s.runs), "interp-ns/run")
			b.ReportMetric(ratio, "x-interp")
		})
	}
}
