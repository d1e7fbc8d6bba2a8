package redistest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// childEnv names what TestChild starts when the test binary runs itself.
const childEnv = "REDISTEST_CHILD"

// TestChild starts what childEnv names, in a test binary that
// TestMissingPrograms runs; it skips in a normal run.
func TestChild(t *testing.T) {
	switch os.Getenv(childEnv) {
	case "server":
		StartServer(t)
	case "cluster":
		StartCluster(t, 3)
	case "small-cluster":
		StartCluster(t, 2)
	default:
		t.Skip("runs only as the child of TestMissingPrograms")
	}
}

// child runs TestChild with what in a test binary of its own, with an
// empty PATH and RequireEnv set to require, and returns its exit code and
// the lines that TestChild printed.
func child(t *testing.T, what, require string) (int, []string) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestChild$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "PATH="+t.TempDir(), childEnv+"="+what, RequireEnv+"="+require)
	out, err := cmd.Output()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "redistest_test.go:"): // without the line number
			_, msg, _ := strings.Cut(l, ": ")
			lines = append(lines, msg)
		case strings.HasPrefix(l, "--- "): // without the time
			l, _, _ = strings.Cut(l, " (")
			lines = append(lines, l)
		}
	}
	return code, lines
}

// TestMissingPrograms: without redis-server or redis-cli on the PATH the
// test skips, or fails when RequireEnv is 1, with how to install it.
func TestMissingPrograms(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("in a child")
	}
	const server = "redis-server not found; install it (Debian: apt-get install redis-server) or set KVRESHARD_REQUIRE_REDIS=1 to make this a failure"
	const cli = "redis-cli not found; install it (Debian: apt-get install redis-server) or set KVRESHARD_REQUIRE_REDIS=1 to make this a failure"
	for _, c := range []struct {
		what, require string
		code          int
		lines         []string
	}{
		{"server", "", 0, []string{server, "--- SKIP: TestChild"}},
		{"server", "1", 1, []string{server, "--- FAIL: TestChild"}},
		{"cluster", "", 0, []string{cli, "--- SKIP: TestChild"}},
		{"cluster", "1", 1, []string{cli, "--- FAIL: TestChild"}},
		{"small-cluster", "", 1, []string{"redistest: a cluster needs at least 3 masters, not 2", "--- FAIL: TestChild"}},
	} {
		code, lines := child(t, c.what, c.require)
		require.Equal(t, c.code, code, "%s %s=%s", c.what, RequireEnv, c.require)
		require.Equal(t, c.lines, lines, "%s %s=%s", c.what, RequireEnv, c.require)
	}
}

func TestKilledAtEnd(t *testing.T) {
	var pid int
	var dir string
	t.Run("server", func(t *testing.T) {
		s := StartServer(t)
		pid, dir = s.PID(), s.Dir()
		require.NotZero(t, pid)
		v, err := s.Do("PING")
		require.NoError(t, err)
		require.Equal(t, "PONG", v)
		s.Kill()
		require.Zero(t, s.PID())
		_, err = s.Do("PING")
		require.Error(t, err)
		s.Restart()
		require.NotEqual(t, pid, s.PID())
		pid = s.PID()
		v, err = s.Do("ECHO", "x")
		require.NoError(t, err)
		require.Equal(t, "x", v)
	})
	require.Equal(t, syscall.ESRCH, syscall.Kill(pid, 0))
	_, err := os.Stat(dir)
	require.True(t, os.IsNotExist(err), "%s: %v", dir, err)
}

// TestClusterOwner: the masters of a cluster are the test's Servers, and
// Owner names the one that holds a key.
func TestClusterOwner(t *testing.T) {
	var pids []int
	t.Run("cluster", func(t *testing.T) {
		c := StartCluster(t, 3)
		require.Len(t, c.Masters, 3)
		require.Equal(t, "redis+cluster://"+strings.Join(c.Addrs(), ","), c.URL())
		for _, key := range []string{"a", "b", "c", "page-17"} {
			s, slot, err := c.Owner(key)
			require.NoError(t, err)
			v, err := s.Do("CLUSTER", "KEYSLOT", key)
			require.NoError(t, err)
			require.Equal(t, int64(slot), v)
			_, err = s.Do("SET", key, "v")
			require.NoError(t, err, "SET %s on its owner", key)
			for _, m := range c.Masters {
				if m != s {
					_, err = m.Do("GET", key)
					require.EqualError(t, err, fmt.Sprintf("MOVED %d %s", slot, s.Addr()))
				}
			}
		}
		for _, m := range c.Masters {
			pids = append(pids, m.PID())
		}
	})
	for _, pid := range pids {
		require.Equal(t, syscall.ESRCH, syscall.Kill(pid, 0))
	}
}
