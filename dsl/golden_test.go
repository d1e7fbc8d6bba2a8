package dsl

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

// TestGoldenErrors parses testdata/errors/<case>/layout.kvl and compares the
// error list, plus a trailing newline, with stderr.txt beside it.
func TestGoldenErrors(t *testing.T) {
	dirs, err := filepath.Glob(filepath.Join("testdata", "errors", "*"))
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(dirs), 12)
	for _, dir := range dirs {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			src, err := os.ReadFile(filepath.Join(dir, "layout.kvl"))
			require.NoError(t, err)
			_, err = Parse("layout.kvl", src)
			require.Error(t, err, "a golden error case must fail")
			got := err.Error() + "\n"
			golden := filepath.Join(dir, "stderr.txt")
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
