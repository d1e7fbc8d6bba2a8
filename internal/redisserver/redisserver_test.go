package redisserver

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// need skips the test without the program (redistest, which says how to
// require it, imports this package).
func need(t *testing.T, program string) {
	if _, err := LookPath(program); err != nil {
		if os.Getenv("KVRESHARD_REQUIRE_REDIS") == "1" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
}

// gone reports whether no process has the id.
func gone(pid int) bool { return syscall.Kill(pid, 0) == syscall.ESRCH }

func TestNotFound(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := LookPath("redis-server")
	require.EqualError(t, err, "redis-server not found; install it (Debian: apt-get install redis-server)")
	require.Equal(t, &NotFoundError{Program: "redis-server"}, err)

	s, err := Start(context.Background(), Options{})
	require.Nil(t, s)
	require.Equal(t, &NotFoundError{Program: "redis-server"}, err)

	c, err := StartCluster(context.Background(), 3, Options{})
	require.Nil(t, c)
	require.Equal(t, &NotFoundError{Program: "redis-cli"}, err)

	_, err = StartCluster(context.Background(), 2, Options{})
	require.EqualError(t, err, "a cluster needs at least 3 masters, not 2")
}

// TestServer: a server answers, is killed, restarts empty on its port,
// and Close removes the directory Start made for it.
func TestServer(t *testing.T) {
	need(t, "redis-server")
	ctx := context.Background()
	s, err := Start(ctx, Options{})
	require.NoError(t, err)
	defer s.Close()
	dir, port, pid := s.Dir(), s.Port(), s.PID()
	require.NotZero(t, pid)
	require.Equal(t, fmt.Sprintf("redis://127.0.0.1:%d", port), s.URL())
	v, err := s.Do("SET", "k", "v")
	require.NoError(t, err)
	require.Equal(t, "OK", v)
	v, err = s.Do("CONFIG", "GET", "dir")
	require.NoError(t, err)
	require.Equal(t, []any{"dir", dir}, v)
	require.FileExists(t, filepath.Join(dir, "redis.log"))

	s.Kill()
	require.Zero(t, s.PID())
	require.True(t, gone(pid))
	_, err = s.Do("PING")
	require.Error(t, err)
	s.Kill() // again: nothing

	require.NoError(t, s.Restart(ctx))
	require.Equal(t, port, s.Port())
	require.NotEqual(t, pid, s.PID())
	pid = s.PID()
	v, err = s.Do("GET", "k")
	require.NoError(t, err)
	require.Nil(t, v, "a restarted server starts empty")

	require.NoError(t, s.Close())
	require.True(t, gone(pid))
	require.NoDirExists(t, dir)
	require.NoError(t, s.Close())
}

// TestServerDir: a server in a given directory, with extra arguments;
// Close leaves the directory.
func TestServerDir(t *testing.T) {
	need(t, "redis-server")
	dir := t.TempDir()
	s, err := Start(context.Background(), Options{Dir: dir, Extra: []string{"--maxmemory", "1mb"}})
	require.NoError(t, err)
	defer s.Close()
	require.Equal(t, dir, s.Dir())
	v, err := s.Do("CONFIG", "GET", "maxmemory")
	require.NoError(t, err)
	require.Equal(t, []any{"maxmemory", "1048576"}, v)
	require.NoError(t, s.Close())
	require.FileExists(t, filepath.Join(dir, "redis.log"))
}

// TestBadArgument: a server that exits at once is an error that quotes
// what it printed, and its directory is removed.
func TestBadArgument(t *testing.T) {
	need(t, "redis-server")
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	s, err := Start(context.Background(), Options{Extra: []string{"--no-such-option", "x"}})
	require.Nil(t, s)
	require.Error(t, err)
	require.Regexp(t, `^redis-server on port \d+ exited: \*\*\* FATAL CONFIG FILE ERROR \(Redis [0-9.]+\) \*\*\*\n`+
		`Reading the configuration file, at line \d+\n>>> 'no-such-option "x"'\nBad directive or wrong number of arguments$`, err.Error())
	entries, err := os.ReadDir(tmp)
	require.NoError(t, err)
	require.Empty(t, entries)
}

// TestCanceled: a start with a cancelled context is the context's error,
// and leaves no directory.
func TestCanceled(t *testing.T) {
	need(t, "redis-server")
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s, err := Start(ctx, Options{})
	require.Nil(t, s)
	require.ErrorIs(t, err, context.Canceled)
	require.Regexp(t, `^redis-server on port \d+: context canceled$`, err.Error())
	entries, err := os.ReadDir(tmp)
	require.NoError(t, err)
	require.Empty(t, entries)
}

// TestCluster: three masters in a cluster; Owner names the master that
// holds a key (the others redirect to it), and Close kills them all and
// removes their directories.
func TestCluster(t *testing.T) {
	need(t, "redis-server")
	need(t, "redis-cli")
	c, err := StartCluster(context.Background(), 3, Options{})
	require.NoError(t, err)
	defer c.Close()
	require.Len(t, c.Masters, 3)
	require.Equal(t, "redis+cluster://"+strings.Join(c.Addrs(), ","), c.URL())
	parent := filepath.Dir(c.Masters[0].Dir())
	for i, m := range c.Masters {
		require.Equal(t, filepath.Join(parent, fmt.Sprintf("master%d", i)), m.Dir())
	}
	owners := map[*Server]bool{}
	for i := range 30 {
		key := fmt.Sprintf("page-%d", i)
		s, slot, err := c.Owner(key)
		require.NoError(t, err)
		owners[s] = true
		_, err = s.Do("SET", key, "v")
		require.NoError(t, err)
		for _, m := range c.Masters {
			if m != s {
				_, err := m.Do("GET", key)
				require.EqualError(t, err, fmt.Sprintf("MOVED %d %s", slot, s.Addr()))
			}
		}
	}
	require.Len(t, owners, 3, "30 keys spread over the 3 masters")
	var pids []int
	for _, m := range c.Masters {
		pids = append(pids, m.PID())
	}
	require.NoError(t, c.Close())
	for _, pid := range pids {
		require.True(t, gone(pid))
	}
	require.NoDirExists(t, parent)
	require.NoError(t, c.Close())
}
