package kernelcheck_test

import (
	"bytes"
	"flag"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler"
	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/gen"
	"github.com/kvreshard/kvreshard/testkit/kernelcheck"
)

// split_kvl_test.go holds the kernels gen generates from testdata/split.kvl:
// layouts that split T and D by factors that nest and that do not. They are
// test data: only this package's test binary links them.
var update = flag.Bool("update", false, "regenerate split_kvl_test.go from testdata/split.kvl")

func compileSplit(t *testing.T) *ir.File {
	t.Helper()
	src, err := os.ReadFile("testdata/split.kvl")
	require.NoError(t, err)
	f, err := compiler.Compile("split.kvl", src)
	require.NoError(t, err)
	return f
}

func TestGeneratedFilesUpToDate(t *testing.T) {
	want, err := gen.Generate(compileSplit(t), "kernelcheck_test")
	require.NoError(t, err)
	if *update {
		require.NoError(t, os.WriteFile("split_kvl_test.go", want, 0o644))
	}
	got, err := os.ReadFile("split_kvl_test.go")
	require.NoError(t, err)
	if !bytes.Equal(got, want) {
		t.Fatal("split_kvl_test.go is out of date; run go test -run TestGeneratedFilesUpToDate -update")
	}
}

// TestGeneratedKernels: every pair, 4 parts to each other and each part to
// and from each pool, on random cases, half of them with token lists,
// against the interpreter and the element model.
func TestGeneratedKernels(t *testing.T) {
	f := compileSplit(t)
	require.Len(t, f.Ranges, 4*4+4*2*2)
	kernelcheck.CheckGenerated(t, f, 20)
}
