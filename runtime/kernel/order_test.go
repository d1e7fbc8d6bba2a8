package kernel_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/testkit/kernelcheck"
	"github.com/kvreshard/kvreshard/testkit/kerneltest"
)

// TestAnyOrder lowers pairs of random layouts, in any order of the axes
// (C anywhere, S anywhere in a pool), with T and D split by the same
// factor on both sides, and requires of the interpreter what
// kernelcheck.CheckCase does.
func TestAnyOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	pairs := 80
	if testing.Short() {
		pairs = 30
	}
	for i := range pairs {
		// Both sides split by the same factors, when they split.
		factors := map[string]int{"T": []int{2, 4}[r.IntN(2)], "D": []int{2, 4, 8}[r.IntN(3)]}
		checkRandomPair(t, r, i, factors, factors)
	}
}

// TestAnyFactors is TestAnyOrder with each side splitting T and D by its
// own factor: equal, nested (2 and 4, 2 and 8, 3 and 6) or not (4 and 6,
// 6 and 8, 3 and 4, 2 and 3), so that pairs lower to a common refinement
// or, where the factors do not nest, to their greatest common divisor.
func TestAnyFactors(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 17))
	pairs := 200
	if testing.Short() {
		pairs = 60
	}
	fs := []int{2, 3, 4, 6, 8}
	for i := range pairs {
		a := map[string]int{"T": fs[r.IntN(len(fs))], "D": fs[r.IntN(len(fs))]}
		b := map[string]int{"T": fs[r.IntN(len(fs))], "D": fs[r.IntN(len(fs))]}
		checkRandomPair(t, r, i, a, b)
	}
}

// TestMixedFactorsCovered: the random pairs of TestAnyFactors include
// nested and non-nesting splits on the same axis, so that both ways of
// lowering are exercised.
func TestMixedFactorsCovered(t *testing.T) {
	nested := mustPair(t, ir.Part, "C T/4 L H T%4 D", ir.Pool, "C S T/2 H L T%2 D")
	mixed := mustPair(t, ir.Part, "C T/4 L H T%4 D", ir.Part, "L H T/6 C T%6 D")
	require.False(t, hasMixed(nested))
	require.True(t, hasMixed(mixed))
}

func mustPair(t *testing.T, sk ir.Kind, so string, dk ir.Kind, do string) *ir.Nest {
	t.Helper()
	src, err := ir.ParseLayout(sk, "src", so)
	require.NoError(t, err)
	dst, err := ir.ParseLayout(dk, "dst", do)
	require.NoError(t, err)
	p, err := ir.Lower(src, dst)
	require.NoError(t, err)
	return p
}

func hasMixed(p *ir.Nest) bool {
	for _, lp := range p.Loops {
		if lp.IsMixed() {
			return true
		}
	}
	return false
}

// checkRandomPair draws a random pair of layouts whose sides split T and
// D by the given factors, when they split, and checks it on two cases.
func checkRandomPair(t *testing.T, r *rand.Rand, i int, srcFactors, dstFactors map[string]int) {
	t.Helper()
	srcKind, dstKind := ir.Part, ir.Part
	switch r.IntN(3) {
	case 1:
		dstKind = ir.Pool
	case 2:
		srcKind = ir.Pool
	}
	src, err := ir.ParseLayout(srcKind, "src", kerneltest.RandomOrder(r, srcKind, srcFactors))
	require.NoError(t, err)
	dst, err := ir.ParseLayout(dstKind, "dst", kerneltest.RandomOrder(r, dstKind, dstFactors))
	require.NoError(t, err)
	for _, iter := range []ir.Side{ir.Src, ir.Dst} {
		p, err := ir.LowerIn(src, dst, iter)
		require.NoError(t, err, "%s -> %s", src, dst)
		for range 2 {
			c := kerneltest.RandomCase(r, src, dst)
			t.Run(fmt.Sprintf("pair%d/%s", i, iter), func(t *testing.T) {
				kernelcheck.CheckCase(t, r, p, nil, c)
			})
		}
	}
}
