package bench

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/redistest"
	_ "github.com/kvreshard/kvreshard/layouts"
	"github.com/kvreshard/kvreshard/runtime/kernel"
	"github.com/kvreshard/kvreshard/runtime/plan"
)

type step struct {
	done, total int
	name        string
}

// TestRedisSkipped runs the Redis step with a server that cannot start:
// every Redis figure is skipped with the reason, after the pages step
// that the store steps need.
func TestRedisSkipped(t *testing.T) {
	var steps []step
	figs, err := Run(context.Background(), Options{Quick: true, Steps: []string{"redis store"},
		Redis:    func() (string, func(), error) { return "", nil, errors.New("redis-server: no such file") },
		Progress: func(d, n int, s string) { steps = append(steps, step{d, n, s}) }})
	require.NoError(t, err)
	require.Equal(t, []step{{0, 2, "pages"}, {1, 2, "redis store"}, {2, 2, "done"}}, steps)
	require.Equal(t, []Figure{
		{Name: "redis_vs_get", Unit: "x", BaselineUnit: "GB/s", Target: ">= 0.8", Skipped: "no Redis server: redis-server: no such file"},
		{Name: "redis_getrange_vs_get", Unit: "x", BaselineUnit: "GB/s", Skipped: "no Redis server: redis-server: no such file"},
		{Name: "redis_vs_get_parts", Unit: "x", BaselineUnit: "GB/s", Skipped: "no Redis server: redis-server: no such file"},
		{Name: "reshard_gbps_redis", Unit: "GB/s", BaselineUnit: "GB/s", Skipped: "no Redis server: redis-server: no such file"},
		{Name: "auto_regret_redis", Unit: "x", BaselineUnit: "GB/s", Target: "<= 1.1", Skipped: "no Redis server: redis-server: no such file"},
		{Name: "checksum_cost_range_redis", Unit: "x", BaselineUnit: "GB/s", Target: ">= 0.9", Skipped: "no Redis server: redis-server: no such file"},
	}, figs)
}

// TestNames: the figures of the suite, in the order Run reports them.
func TestNames(t *testing.T) {
	require.Equal(t, []string{"copy_vs_memmove", "copy_vs_memmove_runs", "generated_vs_interpreter", "plan_build_us_70b",
		"plan_build_auto_us_70b", "ops_direct_70b", "ops_auto_redis_70b", "reshard_vs_identity_mem", "gapped_vs_contiguous_mem",
		"reshard_gbps_file", "redis_vs_get", "redis_getrange_vs_get", "redis_vs_get_parts", "reshard_gbps_redis",
		"auto_regret_file", "auto_regret_redis", "checksum_cost", "checksum_cost_range", "checksum_cost_range_redis",
		"mooncake_vs_get_into", "mooncake_query_cost", "python_vs_go_read", "python_call_us"}, Names)
	require.Equal(t, []string{"kernels", "plans", "pages", "memory store", "file store", "redis store", "python", "mooncake"}, Steps)
}

// TestStartRedisMissing: without redis-server on the PATH, StartRedis
// returns redisserver's reason.
func TestStartRedisMissing(t *testing.T) {
	t.Setenv("PATH", "")
	u, stop, err := StartRedis()
	require.Empty(t, u)
	require.Nil(t, stop)
	require.EqualError(t, err, "redis-server not found; install it (Debian: apt-get install redis-server)")
}

// TestStartRedis: StartRedis starts a server at its URL, in a temporary
// directory; stop kills it and removes the directory.
func TestStartRedis(t *testing.T) {
	redistest.Require(t, "redis-server")
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	u, stop, err := StartRedis()
	require.NoError(t, err)
	addr, ok := strings.CutPrefix(u, "redis://")
	require.True(t, ok, u)
	v, err := redistest.Do(addr, "PING")
	require.NoError(t, err)
	require.Equal(t, "PONG", v)
	entries, err := os.ReadDir(tmp)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	stop()
	_, err = redistest.Do(addr, "PING")
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	entries, err = os.ReadDir(tmp)
	require.NoError(t, err)
	require.Empty(t, entries)
}

// TestPlanFigures runs the plans step: the 70B case's op counts, against
// the element-by-element planner's runs and direct.
func TestPlanFigures(t *testing.T) {
	figs, err := Run(context.Background(), Options{Quick: true, Steps: []string{"plans"}})
	require.NoError(t, err)
	require.Len(t, figs, 4)
	names := []string{}
	for _, f := range figs {
		names = append(names, f.Name)
	}
	require.Equal(t, []string{"plan_build_us_70b", "plan_build_auto_us_70b", "ops_direct_70b", "ops_auto_redis_70b"}, names)
	require.Equal(t, []float64{10240, 10240}, []float64{figs[2].Value, figs[2].Baseline})
	require.Equal(t, []string{"ops", "runs"}, []string{figs[2].Unit, figs[2].BaselineUnit})
	require.Equal(t, []float64{256, 10240}, []float64{figs[3].Value, figs[3].Baseline})
	require.Equal(t, "<= 1024", figs[3].Target)
	require.True(t, *figs[3].OK)
	// The times are measured: positive, but how they compare is the
	// benchmark's figure, not this test's (it would depend on the load).
	require.Positive(t, figs[0].Value)
	require.Positive(t, figs[0].Baseline)
	require.Equal(t, "<= 100000", figs[0].Target)
}

func TestCalibrateUnknownStore(t *testing.T) {
	_, err := Calibrate(context.Background(), "tcp", nil)
	require.EqualError(t, err, `unknown store "tcp"; stores are memory, file, redis`)
}

// TestCalibrateMemory measures the memory store: 8 reads of 2 MiB take
// time, so the bandwidth is finite and positive.
func TestCalibrateMemory(t *testing.T) {
	c, err := Calibrate(context.Background(), "memory", nil)
	require.NoError(t, err)
	require.Positive(t, c.Bandwidth)
	require.Positive(t, c.Big)
	require.GreaterOrEqual(t, c.OpNS, 0.0)
}

// TestRangeKernelsUnknownLayout: a layout name that is not built in is
// an error of the kernels step, not a nil layout.
func TestRangeKernelsUnknownLayout(t *testing.T) {
	_, _, err := rangeKernels([]string{"PLHD"}, []string{"page_first", "nope"})
	_, want := kernel.LayoutNamed("nope")
	require.Error(t, want)
	require.EqualError(t, err, want.Error())
	gen, interp, err := rangeKernels(rangeParts, rangePools)
	require.NoError(t, err)
	require.Len(t, gen, 12)
	require.Len(t, interp, 12)
}

// TestCalibrationTransport turns measurements into a cost model: the
// larger op cost, figures rounded; the memory store's copies are its
// reads; figures out of bounds are refused.
func TestCalibrationTransport(t *testing.T) {
	c := Calibration{Name: "file", OpNS: 300.4, SmallOpNS: 612.6, SegmentNS: 540.5, Bandwidth: 17.8123e9, CopyBandwidth: 26.7345e9, CopyRunNS: 1.84}
	tr, err := c.Transport()
	require.NoError(t, err)
	require.Equal(t, plan.Transport{Name: "file", OpNS: 613, SegmentNS: 541, Bandwidth: 17.8e9, CopyBandwidth: 26.7e9, CopyRunNS: 1.8,
		Segments: 4, SegmentLimit: 1024}, tr)
	c.Name = "memory"
	tr, err = c.Transport()
	require.NoError(t, err)
	require.Equal(t, plan.Transport{Name: "memory", OpNS: 613, SegmentNS: 541, Bandwidth: 17.8e9, CopyBandwidth: 17.8e9, CopyRunNS: 541,
		Segments: 64, SegmentLimit: 1024, InPlace: true}, tr)
	c.Name, c.CopyBandwidth = "redis", 0
	_, err = c.Transport()
	require.EqualError(t, err, "transport redis: copy_bandwidth is 0; want 1e+06 to 1e+15 bytes a second")
	c.Name = "tcp"
	_, err = c.Transport()
	require.EqualError(t, err, `unknown transport "tcp"; transports are memory, file, redis, engine, rdma`)
}

// TestInTurns: turn i starts with read i mod 3, each turn has a time for
// each read, and the first error stops the turns.
func TestInTurns(t *testing.T) {
	var calls []int
	read := func(k int) func() error { return func() error { calls = append(calls, k); return nil } }
	times, err := inTurns(4, []func() error{read(0), read(1), read(2)})
	require.NoError(t, err)
	require.Equal(t, []int{0, 1, 2, 1, 2, 0, 2, 0, 1, 0, 1, 2}, calls)
	require.Len(t, times, 4)
	for _, turn := range times {
		require.Len(t, turn, 3)
	}
	_, err = inTurns(2, []func() error{read(0), func() error { return errors.New("gone") }})
	require.EqualError(t, err, "gone")
}
