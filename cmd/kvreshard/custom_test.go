package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCustomLayoutsEndToEnd writes pages in a part layout declared in a
// .kvl file (its writers hold them in the pool derived from it, or in one
// named with pool=), and reads them with and without that file: a reader
// that never saw the layout plans it from the manifest on the interpreter.
func TestCustomLayoutsEndToEnd(t *testing.T) {
	url := memStore(t)
	kvl := filepath.Join(t.TempDir(), "my.kvl")
	require.NoError(t, os.WriteFile(kvl, []byte(`part flash "vLLM per-layer flash" { order L C T H D }
pool hostpool { order L C S T H D }
`), 0o644))
	const model = "layers=6,kv-heads=4,head-dim=8,dtype=bf16,page=4"
	for _, c := range []struct {
		name, src, prefix string
		ranks             int
	}{
		{"custom part, derived pool", "tp=2,pp=2,layout=flash", "derived", 4},
		{"custom part, custom pool", "tp=2,pp=2,layout=flash,pool=hostpool", "named", 4},
		{"built-in part, custom pool", "tp=1,pp=2,layout=PLHD,pool=hostpool", "builtin", 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, stdout, stderr := runArgs("write", "--store", url, "--kvl", kvl, "--model", model, "--src", c.src, "--pages", "3", "--prefix", c.prefix)
			require.Equal(t, 0, code, stderr)
			ranks := 0
			for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
				if strings.HasPrefix(line, "rank ") {
					require.Contains(t, line, ": 3 written, 0 already complete, 0 refused (another layout), 0 replica in ")
					ranks++
				}
			}
			require.Equal(t, c.ranks, ranks, stdout)
			for _, dst := range []struct {
				spec   string
				kvl    bool
				interp int64
			}{
				{"tp=1,pp=3,rank=0/1,layout=hostpool", true, 1},
				{"tp=4,pp=1,rank=3/0,layout=page_head", false, map[bool]int64{true: 0, false: 1}[strings.Contains(c.src, "PLHD")]},
			} {
				args := []string{"read", "--store", url, "--model", model, "--dst", dst.spec, "--pages", "3", "--prefix", c.prefix, "--verify", "--json"}
				if dst.kvl {
					args = append(args, "--kvl", kvl)
				}
				code, stdout, stderr := runArgs(args...)
				require.Equal(t, 0, code, stderr)
				var got readJSON
				require.NoError(t, json.Unmarshal([]byte(stdout), &got))
				require.Equal(t, 3, got.Hit, stdout)
				require.True(t, got.Verified, stdout)
				require.Equal(t, dst.interp, got.Fallbacks, "%s: %s", dst.spec, stdout)
			}
		})
	}
	code, _, stderr := runArgs("write", "--store", url, "--kvl", kvl, "--model", model, "--src", "tp=1,layout=flash,pool=flash", "--pages", "1")
	require.Equal(t, 2, code)
	require.Equal(t, "kvreshard write: --src: pool=flash is a part layout; the writer's pool needs a pool layout\n", stderr)
	code, _, stderr = runArgs("write", "--store", url, "--model", model, "--src", "tp=1,layout=page_first", "--pages", "1")
	require.Equal(t, 2, code)
	require.Equal(t, "kvreshard write: --src: layout page_first is a pool layout; pages are stored in part layouts (name the writer's pool with pool=)\n", stderr)
}
