package compiler_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler"
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
