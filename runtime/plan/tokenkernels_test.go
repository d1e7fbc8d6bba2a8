package plan_test

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/runtime/kernel"
	"github.com/kvreshard/kvreshard/runtime/placement"
)

// countingKernels counts the calls of the kernels the test registers, with
// and without token lists. The registry is global and keeps the first
// kernels of a pair, so each pair is registered once per process and the
// counts are reset by each run of the test (go test -count=N).
var countingKernels struct {
	once         [2]sync.Once
	lists, whole [2]atomic.Int64
}

// TestTokenListsOnCompiledKernels: parts of other tokens than the reader's
// plan on the pair's compiled kernels when those take token lists
// (Kernels.Tokens), and on the interpreter when they do not (kernels
// generated before version 4), which never see a list.
func TestTokenListsOnCompiledKernels(t *testing.T) {
	for _, takes := range []bool{true, false} {
		order := map[bool]string{true: "C T L H D/2 D%2", false: "C T L H D/4 D%4"}[takes]
		srcL, err := ir.ParseLayout(ir.Part, "tl", order)
		require.NoError(t, err)
		dstL := builtin(t, "page_first")
		pr, err := ir.Lower(srcL, dstL)
		require.NoError(t, err)
		in := kernel.Interpreter{IR: pr}
		i := map[bool]int{true: 0, false: 1}[takes]
		lists, whole := &countingKernels.lists[i], &countingKernels.whole[i]
		countingKernels.once[i].Do(func() {
			require.NoError(t, kernel.Register(&kernel.Kernels{
				Pair: kernel.Pair{Src: srcL.Identity(), Dst: dstL.Identity()},
				Range: func(p *kernel.Problem, runs []kernel.Run) []kernel.Run {
					if p.Tokens != nil {
						lists.Add(1)
					} else {
						whole.Add(1)
					}
					return in.Range(p, runs)
				},
				Copy: in.Copy, Digest: pr.Digest(), Origin: "test", Tokens: takes,
			}))
		})
		lists.Store(0)
		whole.Store(0)
		s := scenario{d: desc(4, 4, []int{8, 8}, "fp16", 32), src: placement.Topology{TP: 2, PP: 1, CP: 2, Interleave: 1}, srcL: srcL,
			dst: placement.Topology{TP: 1, PP: 1}, dstL: dstL}
		_, p, tpl := s.check(t)
		require.True(t, tpl.TokenLists)
		require.False(t, tpl.Interpreted)
		require.Equal(t, int64(0), p.Fallbacks())
		require.Equal(t, int64(1), p.TokenPlans())
		require.Zero(t, whole.Load())
		if takes {
			require.Equal(t, int64(4), lists.Load(), "one call per part: 2 TP x 2 CP")
		} else {
			require.Zero(t, lists.Load())
		}
	}
}
