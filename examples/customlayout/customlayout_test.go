package customlayout_test

import (
	"bytes"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler"
	"github.com/kvreshard/kvreshard/compiler/ir"
	_ "github.com/kvreshard/kvreshard/examples/customlayout"
	"github.com/kvreshard/kvreshard/gen"
	"github.com/kvreshard/kvreshard/runtime/kernel"
	"github.com/kvreshard/kvreshard/testkit/kernelcheck"
)

func compileCustom(t *testing.T) *ir.File {
	t.Helper()
	src, err := os.ReadFile("custom.kvl")
	require.NoError(t, err)
	f, err := compiler.Compile("custom.kvl", src)
	require.NoError(t, err)
	return f
}

func TestGeneratedFilesUpToDate(t *testing.T) {
	want, err := gen.Generate(compileCustom(t), "customlayout")
	require.NoError(t, err)
	got, err := os.ReadFile("custom_kvl.go")
	require.NoError(t, err)
	if !bytes.Equal(got, want) {
		t.Fatal("custom_kvl.go is out of date; run go generate")
	}
}

// TestLayouts pins what custom.kvl declares, so that the example keeps
// showing the layouts its package comment names.
func TestLayouts(t *testing.T) {
	f := compileCustom(t)
	var got []string
	for _, l := range f.Layouts {
		got = append(got, l.Identity()+" "+l.Name)
	}
	require.Equal(t, []string{
		"part(L C T H D) vllm_flash",
		"part(L C H T D) flashinfer_hnd",
		"part(C L H D/8 T D%8) vllm_xblock",
		"pool(L C S T H D) vllm_host",
		"pool(S C L H D/4 T D%4) vllm_xblock4_host",
	}, got)
	// Every ordered pair with a part on one side: 3*3 part pairs, 3 reads
	// into each pool and 3 writes out of each.
	require.Len(t, f.Ranges, 21)
}

func TestGeneratedKernels(t *testing.T) {
	kernelcheck.CheckGenerated(t, compileCustom(t), 40)
}

// TestBuiltinPairsAreNotGenerated documents that a pair joining a custom
// layout with a built-in one has no generated kernels: the runtime runs it
// on the interpreter.
func TestBuiltinPairsAreNotGenerated(t *testing.T) {
	pageFirst := "pool(C S T L H D)"
	require.Nil(t, kernel.Lookup(kernel.Pair{Src: "part(L C T H D)", Dst: pageFirst}))
	require.NotNil(t, kernel.Lookup(kernel.Pair{Src: "part(L C T H D)", Dst: "pool(L C S T H D)"}))
}
