package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/runtime/plan"
)

// writeCosts writes a costs file of the given transports' figures.
func writeCosts(t *testing.T, ts ...plan.Transport) string {
	t.Helper()
	f := plan.CostsFile{Measured: "test", Transports: map[string]plan.TransportCosts{}}
	for _, tr := range ts {
		f.Transports[tr.Name] = tr.Costs()
	}
	data, err := json.Marshal(f)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "costs.json")
	require.NoError(t, os.WriteFile(path, data, 0o644))
	return path
}

// TestCostsFlagPlan plans the 70B case for Redis with a costs file whose
// op cost is a millisecond: staging the two whole parts (2 ops) then beats
// scatter (256), which the configured figures choose.
func TestCostsFlagPlan(t *testing.T) {
	redis := plan.RedisTransport()
	redis.OpNS = 1e6
	costs := writeCosts(t, redis)
	run := func(args ...string) *planJSON {
		code, stdout, stderr := runArgs(append([]string{"plan", "--model", "layers=80,kv-heads=8,head-dim=128,dtype=bf16,page=64", "--src", "tp=8,pp=1,layout=PLHD",
			"--dst", "tp=4,pp=2,rank=0/0,layout=page_first", "--json", "--strategy", "auto", "--transport", "redis"}, args...)...)
		require.Equal(t, 0, code, stderr)
		var out planJSON
		require.NoError(t, json.Unmarshal([]byte(stdout), &out))
		return &out
	}
	def := run()
	require.Equal(t, []any{"scatter", 256}, []any{def.Strategy, def.OpCount})
	loaded := run("--costs", costs)
	require.Equal(t, []any{"staged", 2}, []any{loaded.Strategy, loaded.OpCount})
	// Both estimates follow from the figures alone.
	// 2 ops, 5242880 bytes at 1.7 GB/s, 2621440 copied by the kernel at
	// 28 GB/s: 2000000 + 3084047.1 + 93622.9 ns.
	require.Equal(t, int64(5177670), loaded.EstimatedNS)
}

// TestCostsFlagRead reads pages from a file store with a costs file whose
// file op costs nothing: auto then keeps the direct plan (one op a run),
// where the configured figures stage spans.
func TestCostsFlagRead(t *testing.T) {
	const model = "layers=6,kv-heads=4,head-dim=8,v-head-dim=4,dtype=bf16,page=4"
	store := "file://" + t.TempDir()
	code, _, stderr := runArgs("write", "--store", store, "--model", model, "--src", "tp=4,layout=PLHD", "--pages", "2")
	require.Equal(t, 0, code, stderr)
	file := plan.FileTransport()
	file.OpNS = 0
	costs := writeCosts(t, file)
	read := func(args ...string) readJSON {
		code, stdout, stderr := runArgs(append([]string{"read", "--store", store, "--model", model, "--dst", "tp=2,pp=2,rank=1/1,layout=page_first",
			"--pages", "2", "--verify", "--json"}, args...)...)
		require.Equal(t, 0, code, stderr)
		var out readJSON
		require.NoError(t, json.Unmarshal([]byte(stdout), &out))
		require.Equal(t, []any{2, true}, []any{out.Hit, out.Verified})
		return out
	}
	direct := read("--strategy", "direct")
	require.Equal(t, 96, direct.Ops) // 48 runs a page
	require.Less(t, read().Ops, direct.Ops)
	require.Equal(t, direct.Ops, read("--costs", costs).Ops)
}

// TestCostsFlagErrors: a costs file that cannot be used is one usage
// error of plan, read and demo, naming the file and the field.
func TestCostsFlagErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"transports": {"memory": {"op_ns": 1, "segment_ns": 1, "bandwidth": 1e9, "copy_bandwidth": -1, "copy_run_ns": 1, "segments": 4, "segment_limit": 8}, "file": {}}}`), 0o644))
	missing := filepath.Join(dir, "none.json")
	rdma := plan.RDMATransport()
	rdma.SegmentLimit, rdma.Segments = 8, 2
	small := writeCosts(t, rdma)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"plan", "--model", planModel, "--src", "tp=1,pp=3,layout=PLHD", "--dst", "tp=2,pp=2,rank=1/0,layout=page_first", "--costs", bad},
			"kvreshard plan: --costs: costs file " + bad + ": transports.file.op_ns: missing\n"},
		{[]string{"plan", "--model", planModel, "--src", "tp=1,pp=3,layout=PLHD", "--dst", "tp=2,pp=2,rank=1/0,layout=page_first",
			"--transport", "rdma", "--max-segments", "9", "--costs", small},
			"kvreshard plan: --max-segments 9: transport rdma takes 1 to 8 segments a read (--costs " + small + ")\n"},
		{[]string{"read", "--store", "file://" + dir, "--model", planModel, "--dst", "tp=2,pp=2,rank=1/0,layout=page_first", "--pages", "1", "--costs", missing},
			"kvreshard read: --costs: costs file " + missing + ": no such file or directory\n"},
		{[]string{"demo", "--store", "mem://", "--costs", dir}, "kvreshard demo: --costs: costs file " + dir + ": not a regular file (d---------)\n"},
	} {
		code, stdout, stderr := runArgs(c.args...)
		require.Equal(t, 2, code, strings.Join(c.args, " "))
		require.Empty(t, stdout)
		require.Equal(t, c.want, stderr)
	}
}

func TestCalibrateUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--out", "x.json"}, "kvreshard bench: --out is for --calibrate\n"},
		{[]string{"bench", "--calibrate", "--quick"}, "kvreshard bench: --quick is for the figures, not --calibrate\n"},
	} {
		code, stdout, stderr := runArgs(c.args...)
		require.Equal(t, 2, code)
		require.Empty(t, stdout)
		require.Equal(t, c.want, stderr)
	}
}

// TestCalibrateOut measures the stores (a few seconds) and writes the
// costs file, which plan then loads: every figure within its bounds; with
// --json, the file is printed.
func TestCalibrateOut(t *testing.T) {
	if testing.Short() || benchRace {
		t.Skip("measures the stores; not in -short mode or under the race detector")
	}
	out := filepath.Join(t.TempDir(), "costs.json")
	code, stdout, stderr := runArgs("bench", "--calibrate", "--out", out)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "wrote the cost models of memory, file")
	ts, err := plan.LoadTransports(out)
	require.NoError(t, err)
	for _, name := range []string{"memory", "file"} {
		tr := ts[name]
		require.NoError(t, tr.Validate())
		require.NotEqual(t, plan.DefaultTransports()[name], tr, name)
	}
	require.True(t, ts["memory"].InPlace)
	var f plan.CostsFile
	data, err := os.ReadFile(out)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &f))
	require.Contains(t, f.Measured, "kvreshard bench --calibrate at ")
	code, _, stderr = runArgs("plan", "--model", planModel, "--src", "tp=1,pp=3,layout=PLHD", "--dst", "tp=2,pp=2,rank=1/0,layout=page_first",
		"--strategy", "auto", "--transport", "file", "--costs", out)
	require.Equal(t, 0, code, stderr)

	// --json prints the costs file instead of the measurements.
	code, stdout, stderr = runArgs("bench", "--calibrate", "--json")
	require.Equal(t, 0, code, stderr)
	require.True(t, strings.HasPrefix(stdout, "{\n  \"measured\": \"kvreshard bench --calibrate at "), stdout)
	ts, err = plan.ParseTransports([]byte(stdout))
	require.NoError(t, err)
	require.NotEqual(t, plan.DefaultTransports()["file"], ts["file"])
}
