package layouts_test

import (
	"bytes"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler"
	"github.com/kvreshard/kvreshard/gen"
	"github.com/kvreshard/kvreshard/layouts"
	"github.com/kvreshard/kvreshard/runtime/kernel/kernelcheck"
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
	kernelcheck.CheckGenerated(t, compileBuiltin(t), 60)
}

// TestLayoutsAreBuiltinKVL: the layouts Get returns, read from their
// orders without the .kvl parser, are those builtin.kvl declares, in its
// order, with their doc strings.
func TestLayoutsAreBuiltinKVL(t *testing.T) {
	f := compileBuiltin(t)
	var want, got []string
	for _, l := range f.Layouts {
		want = append(want, l.String())
	}
	for _, n := range layouts.Names() {
		l, err := layouts.Get(n)
		require.NoError(t, err)
		got = append(got, l.String())
	}
	require.Equal(t, want, got)
	_, err := layouts.Get("nope")
	require.EqualError(t, err, `unknown layout "nope"; built-in layouts are PLHD, LPHD, HPLD, page_first, page_first_direct, layer_first, page_head`)
}
