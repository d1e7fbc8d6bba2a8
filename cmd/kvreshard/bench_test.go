package main

import (
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/cmd/kvreshard/internal/bench"
)

// TestBenchQuickJSON runs bench --quick --json (about ten seconds): one
// JSON line with every figure of the suite, in order, each measured or
// skipped with a reason; progress as plain lines on stderr, which is not
// a terminal here.
func TestBenchQuickJSON(t *testing.T) {
	if testing.Short() || benchRace {
		t.Skip("runs the quick benchmark suite; not in -short mode or under the race detector")
	}
	code, stdout, stderr := runArgs("bench", "--quick", "--json")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "bench: 0/8 kernels\nbench: 1/8 plans\nbench: 2/8 pages\nbench: 3/8 memory store\nbench: 4/8 file store\nbench: 5/8 redis store\nbench: 6/8 python\nbench: 7/8 mooncake\nbench: 8/8 done\n", stderr)
	require.Equal(t, 1, strings.Count(stdout, "\n"))
	var out struct {
		Machine bench.Machine    `json:"machine"`
		Figures []map[string]any `json:"figures"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &out))
	require.Equal(t, bench.ThisMachine(), out.Machine)
	require.Equal(t, runtime.GOOS+"/"+runtime.GOARCH, out.Machine.OS)
	require.Positive(t, out.Machine.CPUs)
	var names []string
	for _, f := range out.Figures {
		names = append(names, f["name"].(string))
		require.Subset(t, keysOfMap(f), []string{"name", "value", "unit", "baseline"})
		if f["skipped"] == nil {
			require.Positive(t, f["value"], f["name"])
			require.Positive(t, f["baseline"], f["name"])
		}
	}
	require.Equal(t, bench.Names, names)
	require.Equal(t, []string{"copy_vs_memmove", "copy_vs_memmove_runs", "generated_vs_interpreter", "plan_build_us_70b", "plan_build_auto_us_70b",
		"ops_direct_70b", "ops_auto_redis_70b", "reshard_vs_identity_mem", "gapped_vs_contiguous_mem", "reshard_gbps_file", "redis_vs_get", "redis_getrange_vs_get", "redis_vs_get_parts", "reshard_gbps_redis",
		"auto_regret_file", "auto_regret_redis", "checksum_cost", "checksum_cost_range", "checksum_cost_range_redis",
		"mooncake_vs_get_into", "mooncake_query_cost", "python_vs_go_read", "python_call_us"}, names)
}

func keysOfMap(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestBenchUsageError(t *testing.T) {
	code, stdout, stderr := runArgs("bench", "extra")
	require.Equal(t, 2, code)
	require.Empty(t, stdout)
	require.Equal(t, "kvreshard bench: unexpected argument \"extra\"\n", stderr)
}
