package compiler_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler"
	"github.com/kvreshard/kvreshard/compiler/ir"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

// TestGoldenPlans compiles every testdata/<case>.kvl and compares the
// printed layouts and lowered pairs with testdata/<case>.golden.
func TestGoldenPlans(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.kvl"))
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(files), 6)
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".kvl")
		t.Run(name, func(t *testing.T) {
			src, err := os.ReadFile(file)
			require.NoError(t, err)
			f, err := compiler.Compile(filepath.Base(file), src)
			require.NoError(t, err)
			got := f.String()
			golden := filepath.Join("testdata", name+".golden")
			if *update {
				require.NoError(t, os.WriteFile(golden, []byte(got), 0o644))
				return
			}
			want, err := os.ReadFile(golden)
			require.NoError(t, err, "run go test -update to create it")
			require.Equal(t, string(want), got)
		})
	}
}

// TestLowerInDst: the nest of a copy kernel follows the destination, here
// the pool, with the same strides and folds as the part-ordered nest.
func TestLowerInDst(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("testdata", "builtin.kvl"))
	require.NoError(t, err)
	f, err := compiler.Compile("builtin.kvl", src)
	require.NoError(t, err)
	byName := map[string]*ir.Layout{}
	for _, l := range f.Layouts {
		byName[l.Name] = l
	}
	p, err := ir.LowerIn(byName["PLHD"], byName["page_head"], ir.Dst)
	require.NoError(t, err)
	require.Equal(t, `pair PLHD -> page_head: part(C T L H D) -> pool(C S H T L D), loops follow the dst
  src C block: I*T*D*Ls*Hs
  dst C block: I*T*D*Ld*Hd*Sd
  dst S stride: I*T*D*Ld*Hd
  C    x NC    src block        dst block        loop
  H    x nH    src I*D          dst I*T*D*Ld     loop
  T    x T     src I*D*Ls*Hs    dst I*D*Ld       loop
  L    x nL    src I*D*Hs       dst I*D          loop
  D    x D     src I            dst I            fold
  run I*D
`, p.String())
	// Following the part, the same pair walks T, L, H.
	q, err := ir.Lower(byName["PLHD"], byName["page_head"])
	require.NoError(t, err)
	require.Equal(t, ir.Src, q.Iter)
	require.Equal(t, []ir.Axis{ir.C, ir.T, ir.L, ir.H, ir.D}, axes(q))
	require.Equal(t, []ir.Axis{ir.C, ir.H, ir.T, ir.L, ir.D}, axes(p))
}

func axes(p *ir.Nest) []ir.Axis {
	var out []ir.Axis
	for _, lp := range p.Loops {
		out = append(out, lp.Mode.Axis)
	}
	return out
}
