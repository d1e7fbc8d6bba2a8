package kernel_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler"
	"github.com/kvreshard/kvreshard/runtime/kernel"
	"github.com/kvreshard/kvreshard/runtime/kernel/kerneltest"
)

// randomOrder returns a random valid order: the axes in any order, with T
// and D each split, sometimes, by a factor from factors, the X%f half
// somewhere after the X/f half.
func randomOrder(r *rand.Rand, kind compiler.Kind, factors map[string]int) string {
	axes := []string{"C", "T", "L", "H", "D"}
	if kind == compiler.Pool {
		axes = append(axes, "S")
	}
	r.Shuffle(len(axes), func(i, j int) { axes[i], axes[j] = axes[j], axes[i] })
	for _, a := range []string{"T", "D"} {
		f := factors[a]
		if f == 0 || r.IntN(2) == 0 {
			continue
		}
		i := 0
		for axes[i] != a {
			i++
		}
		axes[i] = fmt.Sprintf("%s/%d", a, f)
		j := i + 1 + r.IntN(len(axes)-i)
		axes = append(axes[:j], append([]string{fmt.Sprintf("%s%%%d", a, f)}, axes[j:]...)...)
	}
	return strings.Join(axes, " ")
}

// TestAnyOrder lowers pairs of random layouts, in any order of the axes,
// and requires the interpreter to move exactly the bytes of the naive
// element-by-element copy, with every destination byte written once and
// every run merged that continues the one before it.
func TestAnyOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	pairs := 80
	if testing.Short() {
		pairs = 30
	}
	for i := range pairs {
		// Both sides split by the same factors, when they split.
		factors := map[string]int{"T": []int{2, 4}[r.IntN(2)], "D": []int{2, 4, 8}[r.IntN(3)]}
		srcKind, dstKind := compiler.Part, compiler.Part
		switch r.IntN(3) {
		case 1:
			dstKind = compiler.Pool
		case 2:
			srcKind = compiler.Pool
		}
		src, err := compiler.ParseLayout(srcKind, "src", randomOrder(r, srcKind, factors))
		require.NoError(t, err)
		dst, err := compiler.ParseLayout(dstKind, "dst", randomOrder(r, dstKind, factors))
		require.NoError(t, err)
		p, err := compiler.Lower(src, dst)
		require.NoError(t, err, "%s -> %s", src, dst)
		in := kernel.Interpreter{IR: p}
		for range 2 {
			c := kerneltest.RandomCase(r, src, dst)
			if !src.COuter() || !dst.COuter() {
				for k := range c.Dims {
					c.Dims[k] = c.Dims[0]
				}
			}
			buf, want := c.Buffers(r)
			n, err := c.Naive(want, buf)
			require.NoError(t, err, c)

			runs := in.Range(c.Problem(), nil)
			got := c.Blank()
			moved, err := c.Apply(runs, got, buf)
			require.NoError(t, err, "pair %d, %s", i, c)
			require.Equal(t, n, moved, "pair %d, %s\n%s", i, c, p)
			require.Equal(t, want, got, "pair %d, %s\n%s", i, c, p)
			for k := 1; k < len(runs); k++ {
				a, b := runs[k-1], runs[k]
				require.False(t, a.Src+a.Len == b.Src && a.Dst+a.Len == b.Dst && a.SrcRegion == b.SrcRegion && a.DstRegion == b.DstRegion,
					"runs %d and %d continue each other but were not merged: %s", k-1, k, c)
			}

			got = c.Blank()
			in.Copy(c.Problem(), c.Shift(&c.Dst, got), c.Shift(&c.Src, buf))
			require.Equal(t, want, got, "pair %d, copy: %s\n%s", i, c, p)
		}
	}
}
