package main

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// The bound of kvr_set_max_procs is KVR_MAX_PROCS, or the CPUs when more;
// an n past it changes nothing. (A cap of 10^9 was killed for want of
// memory; one of 100000 took 1.4 GiB.)
func TestSetMaxProcsBound(t *testing.T) {
	prev := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(prev)
	m := max(1024, runtime.NumCPU())
	require.Equal(t, m, maxProcs())
	for _, n := range []int{m + 1, 100000, 1e9, 1<<31 - 1} {
		_, err := setMaxProcs(n)
		require.EqualError(t, err, fmt.Sprintf("n is %d; the cap is at most %d (KVR_MAX_PROCS, or the CPUs when more)", n, m))
		require.Equal(t, kvrEInval, codeOf(err))
		require.Equal(t, prev, runtime.GOMAXPROCS(0), "n %d changed the cap", n)
	}
	old, err := setMaxProcs(0)
	require.NoError(t, err)
	require.Equal(t, prev, old)
	old, err = setMaxProcs(-5)
	require.NoError(t, err)
	require.Equal(t, prev, old, "n < 0 only reads")
	old, err = setMaxProcs(1)
	require.NoError(t, err)
	require.Equal(t, prev, old)
	old, err = setMaxProcs(prev)
	require.NoError(t, err, "the runtime's default cap can be set again")
	require.Equal(t, 1, old)
}
