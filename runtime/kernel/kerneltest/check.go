package kerneltest

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler"
	"github.com/kvreshard/kvreshard/runtime/kernel"
)

// CheckGenerated runs the generated kernels of every pair of f on random
// cases, and on one LargeCase, and requires that the range kernel, the copy kernel, the interpreter
// and the naive element-by-element copy all produce identical bytes, with
// every destination byte written exactly once and runs merged as far as
// they can be.
func CheckGenerated(t *testing.T, f *compiler.File, cases int) {
	r := rand.New(rand.NewPCG(7, 11))
	for _, p := range f.Pairs {
		t.Run(p.Src.Name+"->"+p.Dst.Name, func(t *testing.T) {
			k := kernel.Lookup(kernel.Pair{Src: p.Src.Identity(), Dst: p.Dst.Identity()})
			require.NotNil(t, k, "no generated kernels registered for %s", p.Key())
			require.Equal(t, p.Digest(), k.Digest, "registered kernels of %s come from another lowering", p.Key())
			in := kernel.Interpreter{IR: p}
			for i := range cases + 1 {
				var c *Case
				if i == cases {
					c = LargeCase(p.Src, p.Dst)
					require.GreaterOrEqual(t, c.Problem().Bytes(), kernel.StreamBytes)
				} else {
					c = RandomCase(r, p.Src, p.Dst)
				}
				if !p.Src.COuter() || !p.Dst.COuter() {
					for i := range c.Dims {
						c.Dims[i] = c.Dims[0]
					}
				}
				src, want := c.Buffers(r)
				n, err := c.Naive(want, src)
				require.NoError(t, err, c)

				runs := k.Range(c.Problem(), nil)
				require.Equal(t, in.Range(c.Problem(), nil), runs, "generated and interpreted runs differ: %s", c)
				got := c.Blank()
				moved, err := c.Apply(runs, got, src)
				require.NoError(t, err, c)
				require.Equal(t, n, moved, c)
				require.Equal(t, want, got, "range kernel: %s", c)
				for i := 1; i < len(runs); i++ {
					a, b := runs[i-1], runs[i]
					require.False(t, a.Src+a.Len == b.Src && a.Dst+a.Len == b.Dst && a.SrcRegion == b.SrcRegion && a.DstRegion == b.DstRegion,
						"runs %d and %d continue each other but were not merged: %s", i-1, i, c)
				}

				got = c.Blank()
				k.Copy(c.Problem(), c.Shift(&c.Dst, got), c.Shift(&c.Src, src))
				require.Equal(t, want, got, "copy kernel: %s", c)
			}
		})
	}
}
