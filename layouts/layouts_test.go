package layouts_test

import (
	"bytes"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler"
	"github.com/kvreshard/kvreshard/gen"
	"github.com/kvreshard/kvreshard/layouts"
	"github.com/kvreshard/kvreshard/runtime/kernel/kerneltest"
)

func compileBuiltin(t *testing.T) *compiler.File {
	f, err := compiler.Compile("builtin.kvl", layouts.Builtin)
	require.NoError(t, err)
	return f
}

func TestGeneratedFilesUpToDate(t *testing.T) {
	want, err := gen.Generate(compileBuiltin(t), "layouts")
	require.NoError(t, err)
	got, err := os.ReadFile("builtin_kvl.go")
	require.NoError(t, err)
	if !bytes.Equal(got, want) {
		t.Fatal("builtin_kvl.go is out of date; run go generate")
	}
}

func TestGeneratedKernels(t *testing.T) {
	kerneltest.CheckGenerated(t, compileBuiltin(t), 60)
}
