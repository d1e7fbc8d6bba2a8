// Package redistest starts redis-server processes for tests: single servers
// and three-master clusters, on free loopback ports, in the test's
// temporary directories, without persistence. Tests can kill and restart
// them; every process is killed when its test ends.
//
// It is a thin testing.TB wrapper over redisserver, which starts the
// servers, and fails the test where redisserver returns an error. When
// redis-server (or, for a cluster, redis-cli) is missing, the test is
// skipped, or fails when the environment sets KVRESHARD_REQUIRE_REDIS=1.
package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/kvreshard/kvreshard/internal/redisserver"
)

// RequireEnv is the environment variable that turns a missing redis-server
// into a test failure.
const RequireEnv = "KVRESHARD_REQUIRE_REDIS"

// Require returns the path of a Redis program (redis-server or redis-cli),
// or skips t (fails it when RequireEnv is 1) when it is not installed.
func Require(t testing.TB, program string) string {
	t.Helper()
	path, err := redisserver.LookPath(program)
	Check(t, err)
	return path
}

// Check ends t when err, an error of redisserver, is not nil: a missing
// program (a *redisserver.NotFoundError) skips t, or fails it when
// RequireEnv is 1; any other error fails t.
func Check(t testing.TB, err error) {
	t.Helper()
	var nf *redisserver.NotFoundError
	switch {
	case err == nil:
	case errors.As(err, &nf):
		msg := fmt.Sprintf("%v or set %s=1 to make this a failure", nf, RequireEnv)
		if os.Getenv(RequireEnv) == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	default:
		t.Fatalf("redistest: %v", err)
	}
}

// Server is a redis-server process on a loopback port: a
// redisserver.Server whose Restart fails the test instead of returning an
// error.
type Server struct {
	*redisserver.Server
	t testing.TB
}

// StartServer starts a redis-server on a free loopback port, killed when
// the test ends. Extra arguments are added to its command line (such as
// "--maxmemory", "1mb").
func StartServer(t testing.TB, extra ...string) *Server {
	t.Helper()
	s, err := redisserver.Start(context.Background(), redisserver.Options{Dir: t.TempDir(), Extra: extra})
	Check(t, err)
	t.Cleanup(func() { s.Close() })
	return &Server{Server: s, t: t}
}

// Restart starts a killed server again on the same port and directory.
// Without persistence it starts empty.
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.Server.Restart(context.Background()); err != nil {
		s.t.Fatalf("redistest: %v", err)
	}
}

// Cluster is a Redis Cluster of masters without replicas.
type Cluster struct {
	Masters []*Server
	c       *redisserver.Cluster
}

// StartCluster starts n (at least 3) masters, creates a cluster of them with
// redis-cli --cluster create and waits until every node reports
// cluster_state:ok. The masters are killed when the test ends.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c, err := redisserver.StartCluster(context.Background(), n, redisserver.Options{Dir: t.TempDir()})
	Check(t, err)
	t.Cleanup(func() { c.Close() })
	tc := &Cluster{c: c}
	for _, s := range c.Masters {
		tc.Masters = append(tc.Masters, &Server{Server: s, t: t})
	}
	return tc
}

// Addrs returns the masters' addresses.
func (c *Cluster) Addrs() []string { return c.c.Addrs() }

// URL returns redis+cluster://host:port,host:port,...
func (c *Cluster) URL() string { return c.c.URL() }

// Owner returns the master that serves key and its slot, from CLUSTER
// KEYSLOT and each master's CLUSTER NODES line about itself.
func (c *Cluster) Owner(key string) (*Server, int, error) {
	s, slot, err := c.c.Owner(key)
	for i, m := range c.c.Masters {
		if m == s {
			return c.Masters[i], slot, err
		}
	}
	return nil, slot, err
}

// Do runs one command on the server at addr over a new connection and
// returns its reply: string, int64, nil, []any, or an error for an error
// reply.
func Do(addr string, args ...string) (any, error) { return redisserver.Do(addr, args...) }
