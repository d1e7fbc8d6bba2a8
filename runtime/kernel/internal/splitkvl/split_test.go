package splitkvl_test

import (
	"bytes"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler"
	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/gen"
	_ "github.com/kvreshard/kvreshard/runtime/kernel/internal/splitkvl"
	"github.com/kvreshard/kvreshard/runtime/kernel/kernelcheck"
)

func compileSplit(t *testing.T) *ir.File {
	t.Helper()
	src, err := os.ReadFile("split.kvl")
	require.NoError(t, err)
	f, err := compiler.Compile("split.kvl", src)
	require.NoError(t, err)
	return f
}

func TestGeneratedFilesUpToDate(t *testing.T) {
	want, err := gen.Generate(compileSplit(t), "splitkvl")
	require.NoError(t, err)
	got, err := os.ReadFile("split_kvl.go")
	require.NoError(t, err)
	if !bytes.Equal(got, want) {
		t.Fatal("split_kvl.go is out of date; run go generate")
	}
}

// TestGeneratedKernels: every pair, 4 parts to each other and each part to
// and from each pool, on random cases, half of them with token lists.
func TestGeneratedKernels(t *testing.T) {
	f := compileSplit(t)
	require.Len(t, f.Ranges, 4*4+4*2*2)
	kernelcheck.CheckGenerated(t, f, 20)
}
