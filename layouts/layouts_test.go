package layouts_test

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler"
	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/gen"
	"github.com/kvreshard/kvreshard/layouts"
	"github.com/kvreshard/kvreshard/runtime/kernel"
	"github.com/kvreshard/kvreshard/testkit/kernelcheck"
)

func compileBuiltin(t *testing.T) *ir.File {
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
	kernelcheck.CheckGenerated(t, compileBuiltin(t), 60)
}

// TestLayoutsAreBuiltinKVL: the layouts the generated file registers are
// those builtin.kvl declares, in its order, with their doc strings,
// default parts and positions. (The test binary links other generated
// packages too, whose layouts the registry also holds.)
func TestLayoutsAreBuiltinKVL(t *testing.T) {
	f := compileBuiltin(t)
	var want, got []string
	for _, l := range f.Layouts {
		want = append(want, l.String()+" at "+l.Pos)
	}
	for _, l := range kernel.Layouts() {
		if strings.HasPrefix(l.Pos, "builtin.kvl:") {
			got = append(got, l.String()+" at "+l.Pos)
		}
	}
	require.Equal(t, want, got)
	require.Len(t, got, 7)
	l, err := kernel.LayoutNamed("layer_first")
	require.NoError(t, err)
	part, err := kernel.DefaultPart(l)
	require.NoError(t, err)
	require.Equal(t, "LPHD", part.Name)
	_, err = kernel.LayoutNamed("nope")
	require.ErrorContains(t, err, `unknown layout "nope"; layouts are `)
}
