// Package redistest starts redis-server processes for tests: single servers
// and three-master clusters, on free loopback ports, in temporary
// directories, without persistence. Tests can kill and restart them; every
// process is killed when its test ends.
//
// When redis-server (or, for a cluster, redis-cli) is missing, the test is
// skipped, or fails when the environment sets KVRESHARD_REQUIRE_REDIS=1.
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// RequireEnv is the environment variable that turns a missing redis-server
// into a test failure.
const RequireEnv = "KVRESHARD_REQUIRE_REDIS"

// Require returns the path of a Redis program (redis-server or redis-cli),
// or skips t (fails it when RequireEnv is 1) when it is not installed.
func Require(t testing.TB, program string) string {
	t.Helper()
	path, err := exec.LookPath(program)
	if err == nil {
		return path
	}
	msg := fmt.Sprintf("%s not found; install it (Debian: apt-get install redis-server) or set %s=1 to make this a failure", program, RequireEnv)
	if os.Getenv(RequireEnv) == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// Server is a redis-server process on a loopback port.
type Server struct {
	t    testing.TB
	bin  string
	args []string
	dir  string
	port int

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// StartServer starts a redis-server on a free loopback port. Extra
// arguments are added to its command line (such as "--maxmemory", "1mb").
func StartServer(t testing.TB, extra ...string) *Server {
	t.Helper()
	return startServer(t, false, extra)
}

func startServer(t testing.TB, cluster bool, extra []string) *Server {
	t.Helper()
	bin := Require(t, "redis-server")
	dir := t.TempDir()
	var lastErr error
	for range 5 {
		port, err := freePort(cluster)
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		s := &Server{t: t, bin: bin, dir: dir, port: port}
		s.args = []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", "redis.log"}
		if cluster {
			s.args = append(s.args, "--cluster-enabled", "yes",
				"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "3000")
		}
		s.args = append(s.args, extra...)
		if lastErr = s.start(); lastErr == nil {
			t.Cleanup(s.Kill)
			return s
		}
		os.Remove(filepath.Join(dir, "nodes.conf"))
	}
	t.Fatalf("redistest: %v", lastErr)
	return nil
}

// freePort returns a loopback port that was free a moment ago; for a
// cluster node its bus port (port+10000) was free too.
func freePort(cluster bool) (int, error) {
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		if !cluster {
			l.Close()
			return port, nil
		}
		if port+10000 <= 65535 {
			if bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000)); err == nil {
				bus.Close()
				l.Close()
				return port, nil
			}
		}
		l.Close()
	}
	return 0, errors.New("no free loopback port pair for a cluster node")
}

// start runs the process and waits until it answers PING.
func (s *Server) start() error {
	cmd := exec.Command(s.bin, s.args...)
	cmd.Dir = s.dir
	setDeathSignal(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return fmt.Errorf("redis-server on port %d exited: %s", s.port, s.logTail())
		default:
		}
		if v, err := Do(s.Addr(), "PING"); err == nil && v == "PONG" {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.Kill()
	return fmt.Errorf("redis-server on port %d did not answer PING in 10s: %s", s.port, s.logTail())
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-5):], "\n")
}

// Addr returns host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Port returns the server's port.
func (s *Server) Port() int { return s.port }

// URL returns redis://host:port.
func (s *Server) URL() string { return "redis://" + s.Addr() }

// PID returns the process id, or 0 when it is not running.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Kill kills the process (SIGKILL) and waits until it has exited. Killing a
// server that is not running does nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Kill()
	<-done
}

// Restart starts a killed server again on the same port and directory.
// Without persistence it starts empty.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	var err error
	for range 3 { // the port may linger for a moment
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatalf("redistest: restart: %v", err)
}

// Do runs one command on the server.
func (s *Server) Do(args ...string) (any, error) { return Do(s.Addr(), args...) }

// Cluster is a Redis Cluster of masters without replicas.
type Cluster struct {
	Masters []*Server
}

// StartCluster starts n (at least 3) masters, creates a cluster of them with
// redis-cli --cluster create and waits until every node reports
// cluster_state:ok.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	if n < 3 {
		t.Fatalf("redistest: a cluster needs at least 3 masters, not %d", n)
	}
	cli := Require(t, "redis-cli")
	Require(t, "redis-server")
	c := &Cluster{}
	args := []string{"--cluster", "create"}
	for range n {
		s := startServer(t, true, nil)
		c.Masters = append(c.Masters, s)
		args = append(args, s.Addr())
	}
	args = append(args, "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range c.Masters {
		for {
			v, err := s.Do("CLUSTER", "INFO")
			info, _ := v.(string)
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(n)+"\r") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redistest: cluster not ok after 30s; %s says %v %v", s.Addr(), v, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

// Addrs returns the masters' addresses.
func (c *Cluster) Addrs() []string {
	var a []string
	for _, s := range c.Masters {
		a = append(a, s.Addr())
	}
	return a
}

// URL returns redis+cluster://host:port,host:port,...
func (c *Cluster) URL() string { return "redis+cluster://" + strings.Join(c.Addrs(), ",") }

// Owner returns the master that serves key and its slot, from CLUSTER
// KEYSLOT and each master's CLUSTER NODES line about itself.
func (c *Cluster) Owner(key string) (*Server, int, error) {
	v, err := c.Masters[0].Do("CLUSTER", "KEYSLOT", key)
	if err != nil {
		return nil, 0, err
	}
	slot := int(v.(int64))
	for _, s := range c.Masters {
		mine, err := s.ownsSlot(slot)
		if err != nil {
			return nil, 0, err
		}
		if mine {
			return s, slot, nil
		}
	}
	return nil, slot, fmt.Errorf("no master owns slot %d", slot)
}

// ownsSlot reports whether the server's own line of CLUSTER NODES lists
// slot.
func (s *Server) ownsSlot(slot int) (bool, error) {
	v, err := s.Do("CLUSTER", "NODES")
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(v.(string), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 || !strings.Contains(f[2], "myself") {
			continue
		}
		for _, r := range f[8:] {
			lo, hi, ok := strings.Cut(r, "-")
			if !ok {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 == nil && err2 == nil && a <= slot && slot <= b {
				return true, nil
			}
		}
	}
	return false, nil
}

// Do runs one command on the server at addr over a new connection and
// returns its reply: string, int64, nil, []any, or an error for an error
// reply.
func Do(addr string, args ...string) (any, error) {
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(conn, b.String()); err != nil {
		return nil, err
	}
	return readReply(bufio.NewReader(conn))
}

// readReply reads one RESP2 reply.
func readReply(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, errors.New("empty reply line")
	}
	switch line[0] {
	case '+':
		return line[1:], nil
	case '-':
		return nil, errors.New(line[1:])
	case ':':
		return strconv.ParseInt(line[1:], 10, 64)
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return nil, err
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		return string(b[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return nil, err
		}
		a := make([]any, n)
		for i := range a {
			if a[i], err = readReply(r); err != nil {
				return nil, err
			}
		}
		return a, nil
	}
	return nil, fmt.Errorf("unexpected reply %q", line)
}
