package gen

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/stretchr/testify/require"
)

// ruleCases names, for each rule of the generator, a pair and a kernel in
// which the rule emits a loop: the layouts' kinds and orders, whether it is
// the copy kernel (whose nest follows the destination), and whether it is
// the twin for token lists. A case's golden holds the kernel and its twin.
var ruleCases = []struct {
	rule         string
	src, dst     string
	copy, tokens bool
}{
	{componentBlocks, "part C T L H D", "pool C S T L H D", false, false},
	{"leaf", "part C L H D/8 T D%8", "part C T L D/6 H D%6", false, false},
	{"tokens", "part C T L H D", "pool C S T L H D", false, true},
	{"token-digit", "part C T/4 L T%4 H D", "pool C S H T L D", false, true},
	{"components", "part L C T H D", "pool C S T L H D", false, false},
	{"mixed", "part C T/4 L H T%4 D", "part L H T/6 C T%6 D", false, false},
	{"copy-rows", "part C T L H D", "pool C S H T L D", true, false},
	{"strided", "part C T L H D", "part C L T H D", false, false},
	{"strided-outer", "part C T L H D", "pool C S H T L D", false, false},
	{"loop", "part C T L H D", "pool C S H T L D", false, false},
}

func layout(t *testing.T, name, decl string) *ir.Layout {
	t.Helper()
	kind := ir.Part
	if decl[:4] == "pool" {
		kind = ir.Pool
	}
	l, err := ir.ParseLayout(kind, name, decl[5:])
	require.NoError(t, err)
	return l
}

// TestRuleGoldens generates, for each rule, the kernel of its case, checks
// that the rule emits one of its loops, and compares the kernel with
// testdata/rules/<rule>.golden.
func TestRuleGoldens(t *testing.T) {
	for _, c := range ruleCases {
		t.Run(c.rule, func(t *testing.T) {
			src, dst := layout(t, "a", c.src), layout(t, "b", c.dst)
			iter := ir.Src
			if c.copy || src.Kind == ir.Pool {
				iter = ir.Dst
			}
			p, err := ir.LowerIn(src, dst, iter)
			require.NoError(t, err)
			applied := RulesFor(p, c.copy, c.tokens)
			require.Contains(t, applied, c.rule, "rules applied: %v\n%s", applied, p)
			fns := kernelFuncs(p, FuncSuffix("a", "b"), c.copy)
			got := fmt.Sprintf("// rules: %v\n%#v\n\n// rules of the twin: %v\n%#v\n",
				RulesFor(p, c.copy, false), fns[0], RulesFor(p, c.copy, true), fns[1])
			golden := filepath.Join("testdata", "rules", c.rule+".golden")
			// -update is gen_test's flag, in the same test binary.
			if f := flag.Lookup("update"); f != nil && f.Value.String() == "true" {
				require.NoError(t, os.MkdirAll(filepath.Dir(golden), 0o755))
				require.NoError(t, os.WriteFile(golden, []byte(got), 0o644))
				return
			}
			want, err := os.ReadFile(golden)
			require.NoError(t, err, "run go test -update to create it")
			require.Equal(t, string(want), got)
		})
	}
}

// TestEveryRuleHasACase: a rule added to the table needs a golden case.
func TestEveryRuleHasACase(t *testing.T) {
	var covered []string
	for _, c := range ruleCases {
		covered = append(covered, c.rule)
	}
	for _, r := range Rules() {
		require.True(t, slices.Contains(covered, r), "rule %s has no case in ruleCases", r)
	}
	require.Equal(t, []string{componentBlocks, "leaf", "tokens", "token-digit", "components", "mixed", "copy-rows", "strided", "strided-outer", "loop"}, Rules())
}
