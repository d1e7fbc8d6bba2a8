package kernel_test

import (
	"math/rand/v2"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler"
	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/runtime/kernel"
	"github.com/kvreshard/kvreshard/testkit/kernelcheck"
	"github.com/kvreshard/kvreshard/testkit/kerneltest"
)

// custom declares layouts beyond the built-in ones: vLLM's per-layer flash
// layout, FlashInfer's HND, an x-blocked split-D layout, a split-T layout,
// pools whose outermost axis is not C, and layouts that split T and D by
// factors that nest (2 and 4) and that do not (4 and 6, 4 and 6 of D).
const custom = `
part vllm_flash { order L C T H D }
part flashinfer_hnd { order L C H T D }
part xblock { order C L H D/4 T D%4 }
part tblock { order C T/4 L H T%4 D }
pool interleaved { order S L C T H D }
pool slot_inner { order C L T S H D }
part tok4 { order C T/4 L H T%4 D }
pool kv_tok { order C S T/2 H L T%2 D }
part tok6 { order L H T/6 C T%6 D }
pool x6 { order S C L H D/6 T D%6 }
`

func compileFile(t *testing.T, name string, src []byte) *ir.File {
	t.Helper()
	f, err := compiler.Compile(name, src)
	require.NoError(t, err)
	return f
}

func allPairs(t *testing.T) []*ir.Nest {
	src, err := os.ReadFile("../../layouts/builtin.kvl")
	require.NoError(t, err)
	pairs := compileFile(t, "builtin.kvl", src).Ranges
	pairs = append(pairs, compileFile(t, "custom.kvl", []byte(custom)).Ranges...)
	return pairs
}

func TestInterpreterMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, p := range allPairs(t) {
		t.Run(p.Src.Name+"->"+p.Dst.Name, func(t *testing.T) {
			for range 16 {
				kernelcheck.CheckCase(t, r, p, nil, kerneltest.RandomCase(r, p.Src, p.Dst))
			}
		})
	}
}

// With context parallelism the buffers hold different tokens: the
// interpreter moves exactly the common ones, on every pair, against the
// element model.
func TestInterpreterTokens(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	for _, p := range allPairs(t) {
		t.Run(p.Src.Name+"->"+p.Dst.Name, func(t *testing.T) {
			for range 12 {
				c := kerneltest.RandomCase(r, p.Src, p.Dst)
				kerneltest.RandomTokens(r, c)
				kernelcheck.CheckCase(t, r, p, nil, c)
			}
		})
	}
}

// A token list of every token moves what nil does.
func TestInterpreterAllTokens(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	for _, p := range allPairs(t) {
		c := kerneltest.RandomCase(r, p.Src, p.Dst)
		if !p.Src.COuter() || !p.Dst.COuter() {
			for i := range c.Dims {
				c.Dims[i] = c.Dims[0]
			}
		}
		src, want := c.Buffers(r)
		_, err := c.Naive(want, src)
		require.NoError(t, err)
		prob := c.Problem()
		for i := 0; i < c.PageSize; i++ {
			prob.Tokens = append(prob.Tokens, kernel.TokenPair{Src: int32(i), Dst: int32(i)})
		}
		in := kernel.Interpreter{IR: p}
		got := c.Blank()
		_, err = c.Apply(in.Range(prob, nil), got, src)
		require.NoError(t, err)
		require.Equal(t, want, got, "%s", c)
		require.Equal(t, prob.Bytes(), c.Problem().Bytes())
	}
}
