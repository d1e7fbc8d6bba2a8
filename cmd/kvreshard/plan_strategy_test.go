package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
)

// stratParts returns the parts topology src writes in PLHD for a page
// with seed: each part's K region then its V region.
func stratParts(t *testing.T, model string, src placement.Topology, seed uint64) [][]byte {
	t.Helper()
	ms, err := parseModel(model)
	require.NoError(t, err)
	d := &ms.model.Descriptor
	var parts [][]byte
	for _, r := range src.Ranks() {
		b, err := plan.BindingFor(d, src, r, mustLayout(t, "PLHD"), 1)
		require.NoError(t, err)
		g, err := plan.NewGeometry(d, b)
		require.NoError(t, err)
		regions := [][]byte{make([]byte, g.Regions[0]), make([]byte, g.Regions[1])}
		content.Fill(g, regions, 0, seed)
		parts = append(parts, append(regions[0], regions[1]...))
	}
	return parts
}

// applyPlanJSON moves the bytes of a printed plan from parts into a pool
// as a transport following it would, checking the promises of its
// strategy on the way.
func applyPlanJSON(t *testing.T, out *planJSON, parts [][]byte, pool map[string][]byte) {
	t.Helper()
	require.Equal(t, len(out.Ops), out.OpCount)
	switch out.Strategy {
	case "direct":
		for _, op := range out.Ops {
			require.Empty(t, op.Dsts)
			copy(pool[op.Region][op.Dst:op.Dst+op.Len], parts[op.Part][op.Src:op.Src+op.Len])
		}
	case "scatter":
		for _, op := range out.Ops {
			require.Equal(t, op.Region, op.Dsts[0].Region)
			require.Equal(t, op.Dst, op.Dsts[0].Dst)
			src := parts[op.Part][op.Src : op.Src+op.Len]
			for _, d := range op.Dsts {
				src = src[copy(pool[d.Region][d.Dst:d.Dst+d.Len], src[:d.Len]):]
			}
			require.Empty(t, src)
		}
	case "staged":
		st := out.Staging
		require.NotNil(t, st)
		require.LessOrEqual(t, st.Bytes, st.Bound)
		stage := make([]byte, st.Bytes)
		next := 0 // next copy step
		for i := 0; i < len(out.Ops); {
			for k := range stage {
				stage[k] = 0xa5
			}
			j := i
			for ; j < len(out.Ops) && *out.Ops[j].Round == *out.Ops[i].Round; j++ {
				op := out.Ops[j]
				require.Equal(t, "stage", op.Region)
				copy(stage[op.Dst:op.Dst+op.Len], parts[op.Part][op.Src:op.Src+op.Len])
			}
			for ; next < len(st.Copies) && st.Copies[next].Read < j; next++ {
				c := st.Copies[next]
				require.GreaterOrEqual(t, c.Read, i)
				require.Equal(t, parts[c.Part][c.Src:c.Src+c.Len], stage[c.Stage:c.Stage+c.Len])
				copy(pool[c.Region][c.Dst:c.Dst+c.Len], stage[c.Stage:c.Stage+c.Len])
			}
			i = j
		}
		require.Len(t, st.Copies, next)
	default:
		t.Fatalf("strategy %q", out.Strategy)
	}
}

// TestPlanStrategies prints plans of every strategy and transport as JSON
// and moves a page's bytes by what they say alone: each gives the reader's
// share of the page, within the segment and staging bounds it states.
func TestPlanStrategies(t *testing.T) {
	const model = "layers=6,kv-heads=4,head-dim=8,v-head-dim=4,dtype=bf16,page=4"
	src := placement.Topology{TP: 4, PP: 1}
	seed := content.Seed("plan-strategies")
	parts := stratParts(t, model, src, seed)
	ms, err := parseModel(model)
	require.NoError(t, err)
	b, err := plan.BindingFor(&ms.model.Descriptor, placement.Topology{TP: 2, PP: 2}, placement.Rank{TP: 1, PP: 1}, mustLayout(t, "page_first"), 2)
	require.NoError(t, err)
	g, err := plan.NewGeometry(&ms.model.Descriptor, b)
	require.NoError(t, err)
	for _, c := range []struct {
		args     []string
		strategy string
		ops      int
		maxSegs  int
	}{
		// Rank 1/1 holds layers 3-5 of heads 2-3: parts 2 and 3, whose
		// 4 tokens x 2 components each hold 3 contiguous layers of 16 and
		// 8 bytes: 48 runs, 16 source spans.
		{[]string{"--strategy", "direct"}, "direct", 48, 1},
		{[]string{"--strategy", "scatter", "--max-segments", "2"}, "scatter", 32, 2},
		{[]string{"--strategy", "scatter", "--transport", "rdma"}, "scatter", 16, 4},
		{[]string{"--strategy", "scatter", "--transport", "rdma", "--max-segments", "1"}, "scatter", 48, 1},
		{[]string{"--strategy", "staged", "--max-gap", "-1"}, "staged", 16, 0},
		// A staged read holds at most half the staging bound: 48 bytes.
		{[]string{"--strategy", "staged", "--max-gap", "-1", "--stage-bytes", "96"}, "staged", 16, 0},
		{[]string{"--strategy", "staged", "--max-gap", "-1", "--stage-bytes", "64"}, "staged", 24, 0},
		{[]string{"--strategy", "staged", "--max-gap", "1000"}, "staged", 2, 0},
		{[]string{"--strategy", "auto", "--transport", "redis"}, "", 0, 64},
		{[]string{"--strategy", "auto", "--transport", "file"}, "", 0, 4},
	} {
		args := append([]string{"plan", "--model", model, "--src", "tp=4,pp=1,layout=PLHD",
			"--dst", "tp=2,pp=2,rank=1/1,layout=page_first,slots=2,slot=1", "--json"}, c.args...)
		code, stdout, stderr := runArgs(args...)
		require.Equal(t, 0, code, stderr)
		var out planJSON
		require.NoError(t, json.Unmarshal([]byte(stdout), &out))
		name := strings.Join(c.args, " ")
		if c.strategy != "" {
			require.Equal(t, c.strategy, out.Strategy, name)
			require.Equal(t, c.ops, out.OpCount, name)
		} else {
			require.Len(t, out.Estimates, 3, name)
			require.Equal(t, out.Estimates[out.Strategy], out.EstimatedNS, name)
			for _, e := range out.Estimates {
				require.GreaterOrEqual(t, e, out.EstimatedNS, name)
			}
		}
		require.Positive(t, out.EstimatedNS)
		require.Equal(t, 2*g.PageBytes/2, out.Bytes)
		for _, op := range out.Ops {
			require.LessOrEqual(t, len(op.Dsts), c.maxSegs, name)
		}
		if out.Staging != nil {
			for _, op := range out.Ops {
				require.LessOrEqual(t, op.Len, out.Staging.Bound, name)
				require.LessOrEqual(t, op.Dst+op.Len, out.Staging.Bytes, name)
			}
		}
		pool := map[string][]byte{"k": make([]byte, g.Regions[0]), "v": make([]byte, g.Regions[1])}
		applyPlanJSON(t, &out, parts, pool)
		require.NoError(t, content.Verify(g, [][]byte{pool["k"], pool["v"]}, 1, seed), name)
	}
}

// TestPlan70BAutoRedis plans the 70B case for Redis: on its cost model a
// GETRANGE costs as much as 8 KB of bandwidth, less than the 10 KiB gaps,
// and a scatter segment less than the staged copy of its bytes, so auto
// reads each source span into its 40 segments: 256 ops instead of 10240.
// Every figure is configured (no copy speed is measured at run time), so
// the estimates are pinned.
// The page's bytes are checked byte for byte.
func TestPlan70BAutoRedis(t *testing.T) {
	const model = "layers=80,kv-heads=8,head-dim=128,dtype=bf16,page=64"
	run := func(args ...string) *planJSON {
		code, stdout, stderr := runArgs(append([]string{"plan", "--model", model, "--src", "tp=8,pp=1,layout=PLHD",
			"--dst", "tp=4,pp=2,rank=0/0,layout=page_first", "--json"}, args...)...)
		require.Equal(t, 0, code, stderr)
		var out planJSON
		require.NoError(t, json.Unmarshal([]byte(stdout), &out))
		return &out
	}
	direct := run()
	require.Equal(t, 10240, direct.OpCount)
	auto := run("--strategy", "auto", "--transport", "redis")
	require.Equal(t, 256, auto.OpCount)
	require.Equal(t, "scatter", auto.Strategy)
	require.Equal(t, 2621440, auto.Bytes)
	require.Equal(t, 2621440, auto.ReadBytes)
	require.Equal(t, "redis", auto.Transport)
	// The configured figures alone decide, the same on every run: the
	// spans staged and their runs copied (28 GB/s, 4 ns a run) cost more
	// than scatter's extra segments (11 ns each).
	require.Equal(t, map[string]int64{"direct": 49670024, "scatter": 2855048, "staged": 2879807}, auto.Estimates)
	require.Equal(t, int64(2855048), auto.EstimatedNS)
	seed := content.Seed("plan-70b")
	parts := stratParts(t, model, placement.Topology{TP: 8, PP: 1}, seed)
	ms, err := parseModel(model)
	require.NoError(t, err)
	b, err := plan.BindingFor(&ms.model.Descriptor, placement.Topology{TP: 4, PP: 2}, placement.Rank{}, mustLayout(t, "page_first"), 1)
	require.NoError(t, err)
	g, err := plan.NewGeometry(&ms.model.Descriptor, b)
	require.NoError(t, err)
	pool := map[string][]byte{"k": make([]byte, g.Regions[0]), "v": make([]byte, g.Regions[1])}
	applyPlanJSON(t, auto, parts, pool)
	require.NoError(t, content.Verify(g, [][]byte{pool["k"], pool["v"]}, 0, seed))
}

func TestPlanStrategyUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--strategy", "fast"}, `kvreshard plan: --strategy: unknown strategy "fast"; strategies are direct, scatter, staged, auto` + "\n"},
		{[]string{"--transport", "tcp"}, `kvreshard plan: --transport: unknown transport "tcp"; transports are memory, file, redis, engine, rdma` + "\n"},
		{[]string{"--transport", "rdma", "--max-segments", "31"}, "kvreshard plan: --max-segments 31: transport rdma takes 1 to 30 segments a read\n"},
		{[]string{"--stage-bytes", "-1"}, "kvreshard plan: --stage-bytes -1 is negative\n"},
		{[]string{"--max-gap", "-2"}, "kvreshard plan: --max-gap -2: give a byte count, 0 for the transport's break-even gap, or -1 for none\n"},
	} {
		code, stdout, stderr := runArgs(append([]string{"plan", "--model", planModel, "--src", "tp=1,pp=3,layout=PLHD",
			"--dst", "tp=2,pp=2,rank=1/0,layout=page_first"}, c.args...)...)
		require.Equal(t, 2, code)
		require.Empty(t, stdout)
		require.Equal(t, c.want, stderr)
	}
}
