package bench

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/runtime/store/redisstore/redistest"
)

type step struct {
	done, total int
	name        string
}

// TestRedisSkipped runs the Redis step with a server that cannot start:
// both Redis figures are skipped with the reason, after the pages step
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
	}, figs)
}

// TestStartRedisMissing: without redis-server on the PATH, StartRedis
// returns redistest's reason instead of skipping a test.
func TestStartRedisMissing(t *testing.T) {
	t.Setenv("PATH", "")
	u, stop, err := StartRedis()
	require.Empty(t, u)
	require.Nil(t, stop)
	require.EqualError(t, err, fmt.Sprintf("redis-server not found; install it (Debian: apt-get install redis-server) or set %s=1 to make this a failure", redistest.RequireEnv))
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
	require.Positive(t, figs[0].Value)
	require.Greater(t, figs[0].Baseline, figs[0].Value)
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
