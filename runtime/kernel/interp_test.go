package kernel_test

import (
	"math/rand/v2"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler"
	"github.com/kvreshard/kvreshard/runtime/kernel"
	"github.com/kvreshard/kvreshard/runtime/kernel/kerneltest"
)

// custom declares layouts beyond the built-in ones: vLLM's per-layer flash
// layout, FlashInfer's HND, an x-blocked split-D layout, a split-T layout and
// pools whose outermost axis is not C.
const custom = `
part vllm_flash { order L C T H D }
part flashinfer_hnd { order L C H T D }
part xblock { order C L H D/4 T D%4 }
part tblock { order C T/4 L H T%4 D }
pool interleaved { order S L C T H D }
pool slot_inner { order C L T S H D }
`

func compileFile(t *testing.T, name string, src []byte) *compiler.File {
	t.Helper()
	f, err := compiler.Compile(name, src)
	require.NoError(t, err)
	return f
}

func allPairs(t *testing.T) []*compiler.Pair {
	src, err := os.ReadFile("../../layouts/builtin.kvl")
	require.NoError(t, err)
	pairs := compileFile(t, "builtin.kvl", src).Pairs
	pairs = append(pairs, compileFile(t, "custom.kvl", []byte(custom)).Pairs...)
	return pairs
}

func TestInterpreterMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, p := range allPairs(t) {
		t.Run(p.Src.Name+"->"+p.Dst.Name, func(t *testing.T) {
			in := kernel.Interpreter{IR: p}
			for range 40 {
				c := kerneltest.RandomCase(r, p.Src, p.Dst)
				if !p.Src.COuter() || !p.Dst.COuter() {
					c.Dims[len(c.Dims)-1] = c.Dims[0]
				}
				src, want := c.Buffers(r)
				n, err := c.Naive(want, src)
				require.NoError(t, err, c)

				runs := in.Range(c.Problem(), nil)
				got := c.Blank()
				moved, err := c.Apply(runs, got, src)
				require.NoError(t, err, c)
				require.Equal(t, n, moved, c)
				require.Equal(t, want, got, c)
				for i := 1; i < len(runs); i++ {
					a, b := runs[i-1], runs[i]
					require.False(t, a.Src+a.Len == b.Src && a.Dst+a.Len == b.Dst && a.SrcRegion == b.SrcRegion && a.DstRegion == b.DstRegion,
						"runs %d and %d continue each other but were not merged: %s", i-1, i, c)
				}

				got = c.Blank()
				in.Copy(c.Problem(), c.Shift(&c.Dst, got), c.Shift(&c.Src, src))
				require.Equal(t, want, got, c)
			}
		})
	}
}
