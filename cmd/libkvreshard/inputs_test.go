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

// A key with a NUL byte is refused, naming its index, before '_' is
// looked for; the first bad key is named.
func TestKeysNUL(t *testing.T) {
	for _, c := range []struct {
		buf  string
		offs []int64
		msg  string
	}{
		{"ab\x00cd", []int64{0, 1, 4, 5}, "key 1 contains a NUL byte"},
		{"\x00", []int64{0, 1}, "key 0 contains a NUL byte"},
		{"a_\x00", []int64{0, 3}, "key 0 contains a NUL byte"},
		{"a_b\x00", []int64{0, 2, 4}, `key 0 "a_" contains '_'; a key is the page's hash, without '_'`},
		{"ab\x00_", []int64{0, 2, 4}, "key 1 contains a NUL byte"},
	} {
		_, err := storeKeys([]byte(c.buf), c.offs, "dom")
		require.EqualError(t, err, c.msg, "%q", c.buf)
		require.Equal(t, kvrEInval, codeOf(err))
	}
	// Any other byte may be in a key.
	ks, err := storeKeys([]byte("\x01\n\xff/é"), []int64{0, 2, 3, 6}, "dom")
	require.NoError(t, err)
	require.Equal(t, []string{"kvreshard_\x01\n_dom", "kvreshard_\xff_dom", "kvreshard_/é_dom"}, ks)
}

// fitMsg never lets a NUL byte cut a message short in C: it is written as
// \x00; then the message is truncated at a UTF-8 boundary to fit.
func TestFitMsg(t *testing.T) {
	for _, c := range []struct {
		msg    string
		errlen uint64
		want   string
	}{
		{"", 1, ""},
		{"abc", 1, ""},
		{"abc", 3, "ab"},
		{"abc", 4, "abc"},
		{"abc", 1 << 40, "abc"},
		{"page missing or incomplete: kvreshard_a\x00b_dom", 100, `page missing or incomplete: kvreshard_a\x00b_dom`},
		{"\x00\x00", 100, `\x00\x00`},
		{"a\x00", 4, `a\x`},
		{"hé", 3, "h"},
		{"hé", 4, "hé"},
		{"€x", 3, ""},
	} {
		require.Equal(t, c.want, fitMsg(c.msg, c.errlen), "%q in %d bytes", c.msg, c.errlen)
	}
}
