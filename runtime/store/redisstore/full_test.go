package redisstore_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/redistest"
	"github.com/kvreshard/kvreshard/runtime/store"
)

// TestFullServer: on a server over maxmemory under noeviction, a part
// write is refused with the server's OOM error and writes nothing, on a
// new page as on one being written (a script whose first write deletes
// would be let through); the page being written keeps its parts; storing
// a manifest that is there succeeds, a new one is refused; reads work.
func TestFullServer(t *testing.T) {
	srv := redistest.StartServer(t, "--maxmemory-policy", "noeviction")
	s := open(t, srv.URL())
	defer s.Close()
	ctx := context.Background()
	do := single(srv, 0)
	a0, a1 := []byte("part zero"), []byte("part one")
	require.NoError(t, write(t, s, "full_old", "m", 0, a0, a1))
	require.NoError(t, write(t, s, "full_old", "m", 1, a0, a1))
	require.NoError(t, write(t, s, "full_half", "m", 0, a0, a1))
	require.NoError(t, s.PutMeta(ctx, "kv/d/manifests/m", []byte("{}")))

	// 2 MiB of other keys, and a limit of 1 MiB: the server is over it by
	// far more than any command here needs.
	filler := strings.Repeat("f", 64<<10)
	for i := range 32 {
		do(t, "", "SET", fmt.Sprintf("filler:%d", i), filler)
	}
	do(t, "", "CONFIG", "SET", "maxmemory", "1mb")
	keys := do(t, "", "DBSIZE").(int64)

	oom := func(key string, part int) *regexp.Regexp {
		return regexp.MustCompile(fmt.Sprintf(`^redis store %s: write %s part %d: OOM command not allowed when used memory > 'maxmemory'\. script: [0-9a-f]{40}, on @user_script:\d+\.$`,
			regexp.QuoteMeta(srv.Addr()), key, part))
	}
	err := write(t, s, "full_new", "m", 0, a0, a1)
	require.Error(t, err)
	require.Regexp(t, oom("full_new", 0), err.Error())
	err = write(t, s, "full_half", "m", 1, a0, a1)
	require.Error(t, err)
	require.Regexp(t, oom("full_half", 1), err.Error())
	require.Equal(t, keys, do(t, "", "DBSIZE"), "nothing written")
	require.Empty(t, keysOf(t, do, "full_new"))
	require.Equal(t, []string{"{full_half}:3:meta", "{full_half}:3:p:0"}, keysOf(t, do, "full_half"))
	require.Equal(t, "1", do(t, "", "HGET", "{full_half}:3:meta", "done"))

	require.NoError(t, s.PutMeta(ctx, "kv/d/manifests/m", []byte("{}")), "it is there")
	require.Equal(t, store.ErrMetaConflict, s.PutMeta(ctx, "kv/d/manifests/m", []byte("{ }")))
	err = s.PutMeta(ctx, "kv/d/manifests/n", []byte("{}"))
	require.Error(t, err)
	require.Regexp(t, `^redis store `+regexp.QuoteMeta(srv.Addr())+`: put meta kv/d/manifests/n: OOM command not allowed when used memory > 'maxmemory'\. script: [0-9a-f]{40}, on @user_script:\d+\.$`, err.Error())
	require.Equal(t, keys, do(t, "", "DBSIZE"), "nothing written")

	require.Equal(t, complete("m", a0, a1), query(t, s, "full_old"))
	got, err := read(t, s, "full_old", 1, len(a1))
	require.NoError(t, err)
	require.Equal(t, a1, got)
	meta, err := s.GetMeta(ctx, "kv/d/manifests/m")
	require.NoError(t, err)
	require.Equal(t, []byte("{}"), meta)

	// Room again: the page being written completes.
	do(t, "", "CONFIG", "SET", "maxmemory", "0")
	require.NoError(t, write(t, s, "full_half", "m", 1, a0, a1))
	require.Equal(t, complete("m", a0, a1), query(t, s, "full_half"))
}
