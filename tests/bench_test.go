package tests

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/redistest"
)

// TestBenchQuick runs `kvreshard bench --quick --json` as a process (the
// binary is built without the race detector, so the suite's figures are
// measured here even under make test): one JSON line with every figure, in
// order, each with a value and a baseline. With redis-server installed the
// Redis figures are measured too; without it they are skipped with the
// reason, unless KVRESHARD_REQUIRE_REDIS=1 makes that a failure. So are
// the Python figures without the .venv of make venv, unless
// KVRESHARD_REQUIRE_PYTHON=1, and the Mooncake figures without Mooncake's
// wheel in it or unshare, unless KVRESHARD_REQUIRE_MOONCAKE=1.
func TestBenchQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the quick benchmark suite (about ten seconds); not in -short mode")
	}
	// Not run(): the suite builds libkvreshard and may take more than its
	// two minutes on a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	p := &proc{args: []string{"bench", "--quick", "--json"}}
	p.cmd = exec.CommandContext(ctx, bin, p.args...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	require.NoError(t, p.cmd.Start())
	p.wait(t)
	require.Equal(t, 0, p.code, p.String())
	require.Equal(t, 1, strings.Count(p.stdout.String(), "\n"), p.String())
	var out struct {
		Figures []struct {
			Name     string   `json:"name"`
			Value    float64  `json:"value"`
			Unit     string   `json:"unit"`
			Baseline *float64 `json:"baseline"`
			Skipped  string   `json:"skipped"`
		} `json:"figures"`
	}
	require.NoError(t, json.Unmarshal(p.stdout.Bytes(), &out))
	var names []string
	_, lookErr := exec.LookPath("redis-server")
	numpyErr := exec.Command(filepath.Join("..", venvPython), "-c", "import numpy").Run()
	for _, f := range out.Figures {
		names = append(names, f.Name)
		require.NotEmpty(t, f.Unit, f.Name)
		if f.Skipped != "" && strings.HasPrefix(f.Name, "python_") {
			require.False(t, numpyErr == nil || os.Getenv("KVRESHARD_REQUIRE_PYTHON") == "1", "%s skipped although Python and numpy are required or installed: %s", f.Name, f.Skipped)
			continue
		}
		if f.Skipped != "" && strings.HasPrefix(f.Name, "mooncake_") {
			require.NotEqual(t, "1", os.Getenv("KVRESHARD_REQUIRE_MOONCAKE"), "%s skipped although Mooncake is required: %s", f.Name, f.Skipped)
			continue
		}
		if f.Skipped != "" {
			require.True(t, strings.HasPrefix(f.Name, "redis_") || strings.HasSuffix(f.Name, "_redis"), "%s skipped: %s", f.Name, f.Skipped)
			require.False(t, lookErr == nil || os.Getenv(redistest.RequireEnv) == "1", "%s skipped although Redis is required or installed: %s", f.Name, f.Skipped)
			continue
		}
		require.Positive(t, f.Value, f.Name)
		require.NotNil(t, f.Baseline, f.Name)
		require.Positive(t, *f.Baseline, f.Name)
	}
	require.Equal(t, []string{"copy_vs_memmove", "copy_vs_memmove_runs", "generated_vs_interpreter", "plan_build_us_70b",
		"plan_build_auto_us_70b", "ops_direct_70b", "ops_auto_redis_70b", "reshard_vs_identity_mem", "gapped_vs_contiguous_mem", "reshard_gbps_file",
		"redis_vs_get", "redis_getrange_vs_get", "redis_vs_get_parts", "reshard_gbps_redis",
		"auto_regret_file", "auto_regret_redis", "checksum_cost", "checksum_cost_range", "checksum_cost_range_redis",
		"mooncake_vs_get_into", "mooncake_query_cost", "python_vs_go_read", "python_call_us"}, names)
}
