package bench

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMooncakeFiguresOf: the figures of a run of the Python side are the
// medians of its turns' ratios, with the baselines' best speed.
func TestMooncakeFiguresOf(t *testing.T) {
	r := &mcResult{Pages: 2, Share: 1 << 20, PartStored: 3 << 20}
	r.Layouts = map[string]struct {
		Bytes     int          `json:"bytes"`
		Ops       int          `json:"ops"`
		Ranges    int          `json:"ranges"`
		Turns     [][2]float64 `json:"turns"`
		RawRanges [][2]float64 `json:"raw_ranges"`
		Parts     [][2]float64 `json:"parts"`
	}{
		"LPHD": {Bytes: 2 << 20, Ops: 8, Ranges: 8, Turns: [][2]float64{{2e-3, 1e-3}, {1e-3, 1e-3}, {4e-3, 2e-3}},
			RawRanges: [][2]float64{{1e-3, 1e-3}}, Parts: [][2]float64{{2e-3, 1e-3}}},
		"PLHD": {Bytes: 2 << 20, Ops: 4, Ranges: 512, Turns: [][2]float64{{2e-3, 1e-3}},
			RawRanges: [][2]float64{{1e-2, 1e-3}}, Parts: [][2]float64{{2e-3, 1e-3}}},
	}
	r.Query.Pages, r.Query.Cold, r.Query.Turns = 128, 1e-3, [][2]float64{{100e-6, 50e-6}, {100e-6, 80e-6}, {200e-6, 60e-6}}
	figs, err := mooncakeFigures(r)
	require.NoError(t, err)
	require.Len(t, figs, 2)
	vs, q := figs[0], figs[1]
	require.Equal(t, []any{"mooncake_vs_get_into", 0.5, "x", 2.1, "GB/s", ">= 0.8", false},
		[]any{vs.Name, vs.Value, vs.Unit, vs.Baseline, vs.BaselineUnit, vs.Target, *vs.OK})
	require.Contains(t, vs.Detail, "4 ranges a page")
	require.Contains(t, vs.Detail, "PLHD parts (auto reads 2 ranges a page, the parts nearly whole): 0.50x; their 512 spans of 10 KiB by get_into_ranges without kvreshard: 0.10x")
	require.Equal(t, []any{"mooncake_query_cost", 0.5, "x", 60.0, "µs"}, []any{q.Name, q.Value, q.Unit, q.Baseline, q.BaselineUnit})
	require.Nil(t, q.OK)
	_, err = mooncakeFigures(&mcResult{})
	require.ErrorContains(t, err, "incomplete answer")
}

// TestMooncakeStep runs the mooncake step (quick): against a master and a
// holder of its own in a loopback-only namespace, both figures measured;
// without Mooncake or unshare both are skipped with the reason, unless
// KVRESHARD_REQUIRE_MOONCAKE=1 (CI), where that fails.
func TestMooncakeStep(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Mooncake master; not in -short mode")
	}
	env := requirePython(t)
	reason := env.mooncakeReason(context.Background())
	figs, err := Run(context.Background(), Options{Quick: true, Steps: []string{"mooncake"}})
	require.NoError(t, err)
	require.Len(t, figs, 2)
	require.Equal(t, []string{"mooncake_vs_get_into", "mooncake_query_cost"}, []string{figs[0].Name, figs[1].Name})
	if reason != "" {
		require.NotEqual(t, "1", os.Getenv("KVRESHARD_REQUIRE_MOONCAKE"), reason)
		require.Equal(t, reason, figs[0].Skipped)
		t.Skip(reason)
	}
	for _, f := range figs {
		require.Empty(t, f.Skipped, f.Name)
		require.Positive(t, f.Value, f.Name)
		require.Positive(t, f.Baseline, f.Name)
		t.Logf("%s %g %s (baseline %g %s): %s", f.Name, f.Value, f.Unit, f.Baseline, f.BaselineUnit, f.Detail)
	}
	require.True(t, strings.HasPrefix(figs[0].Detail, "4 pages of the 70B case written by TP 8 in LPHD"), figs[0].Detail)
}
