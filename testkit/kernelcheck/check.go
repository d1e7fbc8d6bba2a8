// Package kernelcheck holds the checks the tests of kernels share: generated
// and interpreted kernels against the element-by-element model of package
// kerneltest, byte for byte and run for run. It imports testing and
// testify; kerneltest, which the runtime's content generator and benchmarks
// use, does not.
package kernelcheck

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/runtime/kernel"
	"github.com/kvreshard/kvreshard/testkit/kerneltest"
)

// CheckGenerated runs the generated kernels of every pair of f on random
// cases, on as many with random token sets on both sides (context
// parallelism: kerneltest.RandomTokens), and on one LargeCase, and requires
// of each what CheckCase does.
func CheckGenerated(t *testing.T, f *ir.File, cases int) {
	r := rand.New(rand.NewPCG(7, 11))
	for _, p := range f.Ranges {
		t.Run(p.Src.Name+"->"+p.Dst.Name, func(t *testing.T) {
			k := kernel.Lookup(kernel.Pair{Src: p.Src.Identity(), Dst: p.Dst.Identity()})
			require.NotNil(t, k, "no generated kernels registered for %s", p.Key())
			require.Equal(t, p.Digest(), k.Digest, "registered kernels of %s come from another lowering", p.Key())
			require.True(t, k.Tokens, "generated kernels of %s take no token list", p.Key())
			for i := range 2*cases + 1 {
				var c *kerneltest.Case
				switch {
				case i == 2*cases:
					c = kerneltest.LargeCase(p.Src, p.Dst)
					require.GreaterOrEqual(t, c.Problem().Bytes(), kernel.StreamBytes)
				case i%2 == 1:
					// Token sets that differ, so that the case lists its
					// common tokens; one draw in five or so keeps every token.
					c = kerneltest.RandomCase(r, p.Src, p.Dst)
					for try := 0; try == 0 || c.Problem().Tokens == nil; try++ {
						require.Less(t, try, 100, "no token sets that differ for %s", c)
						kerneltest.RandomTokens(r, c)
					}
				default:
					c = kerneltest.RandomCase(r, p.Src, p.Dst)
				}
				CheckCase(t, r, p, k, c)
			}
		})
	}
}

// CheckCase requires, for one case of pair p, that the interpreter's range
// and copy, and those of the generated kernels k when k is not nil, move
// exactly the bytes of the element-by-element model, with every destination
// byte written once, and that the interpreter and k emit the same runs, as
// few as the model's MinRuns. Layouts whose outermost axis is not C get
// the same head dim for every component. A case whose buffers hold
// different tokens (context parallelism) lists its common tokens, which
// the interpreter and k both walk at the outermost T loop: their runs are
// still the same, but may be more than the fewest where a layout puts
// other axes between its T digits (the planner sorts and merges them).
func CheckCase(t *testing.T, r *rand.Rand, p *ir.Nest, k *kernel.Kernels, c *kerneltest.Case) {
	t.Helper()
	if !p.Src.COuter() || !p.Dst.COuter() {
		for i := range c.Dims {
			c.Dims[i] = c.Dims[0]
		}
	}
	src, want := c.Buffers(r)
	n, err := c.Naive(want, src)
	require.NoError(t, err, c)
	min := c.MinRuns()

	in := kernel.Interpreter{IR: p}
	runs := in.Range(c.Problem(), nil)
	if k != nil {
		require.Equal(t, runs, k.Range(c.Problem(), nil), "generated and interpreted runs differ: %s\n%s", c, p)
	}
	got := c.Blank()
	moved, err := c.Apply(runs, got, src)
	require.NoError(t, err, "%s\n%s", c, p)
	require.Equal(t, n, moved, "%s\n%s", c, p)
	require.Equal(t, want, got, "range: %s\n%s", c, p)
	if c.Problem().Tokens == nil || c.Src.Layout.SplitOf(ir.T) == 0 && c.Dst.Layout.SplitOf(ir.T) == 0 {
		require.Equal(t, min, len(runs), "runs are not the fewest: %s\n%s", c, p)
	} else {
		require.GreaterOrEqual(t, len(runs), min, "%s\n%s", c, p)
	}

	copies := []kernel.CopyFunc{in.Copy}
	if k != nil {
		copies = append(copies, k.Copy)
	}
	for i, cp := range copies {
		got = c.Blank()
		cp(c.Problem(), c.Shift(&c.Dst, got), c.Shift(&c.Src, src))
		require.Equal(t, want, got, "copy %d (0 interpreted, 1 generated): %s\n%s", i, c, p)
	}
}
