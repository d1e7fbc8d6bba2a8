package redistest

import (
	"runtime"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeTB records how Require ended a test. Methods it does not override
// panic (the embedded TB is nil).
type fakeTB struct {
	testing.TB
	skipped, fatal string
}

func (f *fakeTB) Helper()           {}
func (f *fakeTB) Skip(args ...any)  { f.skipped = args[0].(string); runtime.Goexit() }
func (f *fakeTB) Fatal(args ...any) { f.fatal = args[0].(string); runtime.Goexit() }

func run(f func(tb testing.TB)) *fakeTB {
	tb := &fakeTB{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(tb)
	}()
	<-done
	return tb
}

func TestMissingServer(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	const msg = "redis-server not found; install it (Debian: apt-get install redis-server) or set KVRESHARD_REQUIRE_REDIS=1 to make this a failure"

	t.Setenv(RequireEnv, "")
	tb := run(func(tb testing.TB) { StartServer(tb) })
	require.Equal(t, &fakeTB{skipped: msg}, tb)

	t.Setenv(RequireEnv, "1")
	tb = run(func(tb testing.TB) { StartServer(tb) })
	require.Equal(t, &fakeTB{fatal: msg}, tb)

	tb = run(func(tb testing.TB) { StartCluster(tb, 3) })
	require.Equal(t, &fakeTB{fatal: "redis-cli not found; install it (Debian: apt-get install redis-server) or set KVRESHARD_REQUIRE_REDIS=1 to make this a failure"}, tb)
}

func TestKilledAtEnd(t *testing.T) {
	var pid int
	t.Run("server", func(t *testing.T) {
		s := StartServer(t)
		pid = s.PID()
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
}
