// Package redisserver starts redis-server processes: single servers and
// clusters of masters, on free loopback ports, in their own directories,
// without persistence. A server can be killed and restarted on the same
// port; Close kills it and removes the directory it made.
//
// It serves `kvreshard bench` and `kvreshard bench --calibrate`, which
// measure a real server, and the tests through redistest, which wraps it
// for a testing.TB. It links no test package.
//
// Every failure is an error; a missing program is a *NotFoundError that
// says how to install it. On Linux a server is killed when the process
// that started it dies.
package redisserver

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
	"time"
)

// The waits of Start and StartCluster, besides the context's.
const (
	pingWait    = 10 * time.Second // a server answers PING
	createWait  = 60 * time.Second // redis-cli --cluster create
	clusterWait = 30 * time.Second // every master says cluster_state:ok
)

// NotFoundError is the error of a Redis program that is not on the PATH.
type NotFoundError struct {
	Program string // redis-server or redis-cli
}

// Error says which program is missing and how to install it.
func (e *NotFoundError) Error() string {
	return e.Program + " not found; install it (Debian: apt-get install redis-server)"
}

// LookPath returns the path of a Redis program (redis-server or
// redis-cli). The error is a *NotFoundError when it is not on the PATH.
func LookPath(program string) (string, error) {
	path, err := exec.LookPath(program)
	if errors.Is(err, exec.ErrNotFound) {
		return "", &NotFoundError{Program: program}
	}
	return path, err
}

// outputFile, in a server's directory, holds its stdout and stderr.
const outputFile = "redis.out"

// Options configure a server.
type Options struct {
	// Dir is the server's working directory (its log, redis.log, its
	// stdout and stderr, redis.out, and a cluster node's nodes.conf), which
	// must exist. Empty: a new temporary
	// directory, removed by Close. For a cluster, each master works in a
	// directory of its own, master0, master1, ..., made inside Dir.
	Dir string
	// Extra arguments are added to the command line, such as
	// "--maxmemory", "1mb".
	Extra []string
}

// Server is a redis-server process on a loopback port.
type Server struct {
	bin    string
	args   []string
	dir    string
	ownDir bool // Close removes dir
	port   int

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// Start starts a redis-server on a free loopback port and returns once it
// answers PING. The context bounds the start only: the server runs until
// it is killed or closed.
func Start(ctx context.Context, opts Options) (*Server, error) {
	return start(ctx, opts, false)
}

func start(ctx context.Context, opts Options, cluster bool) (*Server, error) {
	bin, err := LookPath("redis-server")
	if err != nil {
		return nil, err
	}
	dir, own := opts.Dir, false
	if dir == "" {
		if dir, err = os.MkdirTemp("", "kvreshard-redis-"); err != nil {
			return nil, err
		}
		own = true
	}
	// A port found free can be taken before the server binds it: try
	// another.
	for range 5 {
		var port int
		if port, err = freePort(cluster); err != nil {
			break
		}
		s := &Server{bin: bin, dir: dir, ownDir: own, port: port}
		s.args = []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", "redis.log"}
		if cluster {
			s.args = append(s.args, "--cluster-enabled", "yes",
				"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "3000")
		}
		s.args = append(s.args, opts.Extra...)
		if err = s.start(ctx); err == nil {
			return s, nil
		}
		if ctx.Err() != nil {
			break
		}
		os.Remove(filepath.Join(dir, "nodes.conf"))
	}
	if own {
		os.RemoveAll(dir)
	}
	return nil, err
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

// start runs the process and waits until it answers PING. On an error
// the process is not running.
func (s *Server) start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("redis-server on port %d: %w", s.port, err)
	}
	cmd := exec.Command(s.bin, s.args...)
	cmd.Dir = s.dir
	// A file, not a pipe: a child that the server forks cannot hold up
	// Wait.
	output, err := os.Create(filepath.Join(s.dir, outputFile))
	if err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	defer output.Close()
	cmd.Stdout, cmd.Stderr = output, output
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
	timeout := time.NewTimer(pingWait)
	defer timeout.Stop()
	for {
		if v, err := Do(s.Addr(), "PING"); err == nil && v == "PONG" {
			return nil
		}
		select {
		case <-done:
			s.Kill()
			return fmt.Errorf("redis-server on port %d exited: %s", s.port, s.logTail())
		case <-ctx.Done():
			s.Kill()
			return fmt.Errorf("redis-server on port %d: %w", s.port, ctx.Err())
		case <-timeout.C:
			s.Kill()
			return fmt.Errorf("redis-server on port %d did not answer PING in %s: %s", s.port, pingWait, s.logTail())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// logTail returns the last lines of the process's output and of the
// server's log (a bad argument is reported on stderr, before the log is
// opened).
func (s *Server) logTail() string {
	var lines []string
	for _, name := range []string{outputFile, "redis.log"} {
		b, _ := os.ReadFile(filepath.Join(s.dir, name))
		if text := strings.TrimSpace(string(b)); text != "" {
			l := strings.Split(text, "\n")
			lines = append(lines, l[max(0, len(l)-5):]...)
		}
	}
	return strings.Join(lines, "\n")
}

// Addr returns host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Port returns the server's port.
func (s *Server) Port() int { return s.port }

// URL returns redis://host:port.
func (s *Server) URL() string { return "redis://" + s.Addr() }

// Dir returns the server's working directory.
func (s *Server) Dir() string { return s.dir }

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

// Restart kills the server if it runs and starts it again on the same
// port and directory, with the same arguments. Without persistence it
// starts empty.
func (s *Server) Restart(ctx context.Context) error {
	s.Kill()
	var err error
	for range 3 { // the port may linger for a moment
		if err = s.start(ctx); err == nil || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	if err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	return nil
}

// Close kills the server and removes the directory that Start made for it
// (a directory given in Options stays). Closing again does nothing.
func (s *Server) Close() error {
	s.Kill()
	s.mu.Lock()
	own := s.ownDir
	s.ownDir = false
	s.mu.Unlock()
	if own {
		return os.RemoveAll(s.dir)
	}
	return nil
}

// Do runs one command on the server.
func (s *Server) Do(args ...string) (any, error) { return Do(s.Addr(), args...) }

// Cluster is a Redis Cluster of masters without replicas.
type Cluster struct {
	Masters []*Server
	dir     string // the directory StartCluster made, removed by Close
}

// StartCluster starts n (at least 3) masters, creates a cluster of them
// with redis-cli --cluster create and returns once every master reports
// cluster_state:ok and knows the n nodes. On an error no master is left
// running.
func StartCluster(ctx context.Context, n int, opts Options) (*Cluster, error) {
	if n < 3 {
		return nil, fmt.Errorf("a cluster needs at least 3 masters, not %d", n)
	}
	cli, err := LookPath("redis-cli")
	if err != nil {
		return nil, err
	}
	if _, err := LookPath("redis-server"); err != nil {
		return nil, err
	}
	c := &Cluster{}
	parent := opts.Dir
	if parent == "" {
		if parent, err = os.MkdirTemp("", "kvreshard-redis-cluster-"); err != nil {
			return nil, err
		}
		c.dir = parent
	}
	if err := c.start(ctx, cli, n, parent, opts.Extra); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context, cli string, n int, parent string, extra []string) error {
	args := []string{"--cluster", "create"}
	for i := range n {
		dir := filepath.Join(parent, "master"+strconv.Itoa(i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			return err
		}
		s, err := start(ctx, Options{Dir: dir, Extra: extra}, true)
		if err != nil {
			return err
		}
		c.Masters = append(c.Masters, s)
		args = append(args, s.Addr())
	}
	args = append(args, "--cluster-yes")
	cctx, cancel := context.WithTimeout(ctx, createWait)
	defer cancel()
	out, err := exec.CommandContext(cctx, cli, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out)
	}
	deadline := time.NewTimer(clusterWait)
	defer deadline.Stop()
	for _, s := range c.Masters {
		for {
			v, err := s.Do("CLUSTER", "INFO")
			info, _ := v.(string)
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(n)+"\r") {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("cluster of %d masters: %w", n, ctx.Err())
			case <-deadline.C:
				return fmt.Errorf("cluster not ok after %s; %s says %v %v", clusterWait, s.Addr(), v, err)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
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

// Close kills every master and removes the directory that StartCluster
// made (a directory given in Options stays, with the masters' directories
// in it). Closing again does nothing.
func (c *Cluster) Close() error {
	for _, s := range c.Masters {
		s.Close()
	}
	dir := c.dir
	c.dir = ""
	if dir != "" {
		return os.RemoveAll(dir)
	}
	return nil
}

// Owner returns the master that serves key and its slot, from CLUSTER
// KEYSLOT and each master's CLUSTER NODES line about itself.
func (c *Cluster) Owner(key string) (*Server, int, error) {
	v, err := c.Masters[0].Do("CLUSTER", "KEYSLOT", key)
	if err != nil {
		return nil, 0, err
	}
	slot, ok := v.(int64)
	if !ok {
		return nil, 0, fmt.Errorf("CLUSTER KEYSLOT %q: reply %v, want an integer", key, v)
	}
	for _, s := range c.Masters {
		mine, err := s.ownsSlot(int(slot))
		if err != nil {
			return nil, 0, err
		}
		if mine {
			return s, int(slot), nil
		}
	}
	return nil, int(slot), fmt.Errorf("no master owns slot %d", slot)
}

// ownsSlot reports whether the server's own line of CLUSTER NODES lists
// slot.
func (s *Server) ownsSlot(slot int) (bool, error) {
	v, err := s.Do("CLUSTER", "NODES")
	if err != nil {
		return false, err
	}
	nodes, ok := v.(string)
	if !ok {
		return false, fmt.Errorf("CLUSTER NODES on %s: reply %v, want a string", s.Addr(), v)
	}
	for _, line := range strings.Split(nodes, "\n") {
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
