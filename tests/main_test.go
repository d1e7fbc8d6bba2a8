// Package tests holds kvreshard's end-to-end tests: real `kvreshard write`
// and `kvreshard read` processes sharing a store, so that pages written by
// processes that have exited (or were killed) are read by others. Each
// scenario runs against every backend: the file store, a single
// redis-server and a three-master Redis Cluster. The servers are started
// once for the package with redisserver (skipped without redis-server, a
// failure with KVRESHARD_REQUIRE_REDIS=1), each test keeps its pages under its own
// --prefix, and TestMain stops the servers at the end.
package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/redisserver"
	"github.com/kvreshard/kvreshard/internal/redistest"
	"github.com/kvreshard/kvreshard/runtime/store"
	_ "github.com/kvreshard/kvreshard/runtime/store/filestore"
	_ "github.com/kvreshard/kvreshard/runtime/store/redisstore"
)

// bin is the kvreshard binary built once by TestMain.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvreshard-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "kvreshard")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/kvreshard/kvreshard/cmd/kvreshard").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "go build ./cmd/kvreshard: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	sharedCleanup()
	os.RemoveAll(dir)
	os.Exit(code)
}

// backend is a store that kvreshard processes share.
type backend struct {
	name string
	// url returns the store URL for a test: a new directory for the file
	// store, the package's server or cluster for Redis.
	url func(t *testing.T) string
}

var backends = []backend{
	{"file", func(t *testing.T) string { return "file://" + t.TempDir() }},
	{"redis", func(t *testing.T) string { return redisServer.get(t, startServer).URL() }},
	{"cluster", func(t *testing.T) string { return redisCluster.get(t, startCluster).URL() }},
}

func startServer() (*redisserver.Server, error) {
	s, err := redisserver.Start(context.Background(), redisserver.Options{})
	if err == nil {
		sharedClose(s.Close)
	}
	return s, err
}

func startCluster() (*redisserver.Cluster, error) {
	c, err := redisserver.StartCluster(context.Background(), 3, redisserver.Options{})
	if err == nil {
		sharedClose(c.Close)
	}
	return c, err
}

// forEachBackend runs f as a parallel subtest for each backend, with the
// store URL and a page key prefix that no other test uses.
func forEachBackend(t *testing.T, f func(t *testing.T, url, prefix string)) {
	t.Helper()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			f(t, b.url(t), newPrefix(t))
		})
	}
}

var prefixes atomic.Int64

// newPrefix returns a page key prefix made of the test's name and a number
// that no other test of this process has: the Redis servers outlive a test,
// and with -count a test runs more than once.
func newPrefix(t *testing.T) string {
	name := strings.Map(func(r rune) rune {
		if 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' {
			return r
		}
		return '-'
	}, t.Name())
	return fmt.Sprintf("%s-%d", name, prefixes.Add(1))
}

// openStore opens url in this process.
func openStore(t *testing.T, url string) store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	return st
}

// shared is a value that the package's tests share, such as a Redis
// server, started by the first test that asks for it.
type shared[T any] struct {
	once sync.Once
	v    T
	err  error
}

var (
	redisServer  shared[*redisserver.Server]
	redisCluster shared[*redisserver.Cluster]
)

// get starts the value once; when starting failed (redistest.Check skips
// without redis-server, or fails with KVRESHARD_REQUIRE_REDIS=1), every
// test that asks for it skips or fails with the same message.
func (s *shared[T]) get(t *testing.T, start func() (T, error)) T {
	t.Helper()
	s.once.Do(func() { s.v, s.err = start() })
	redistest.Check(t, s.err)
	return s.v
}

var (
	closeMu sync.Mutex
	closers []func() error // of the shared servers
)

// sharedClose adds the close of a shared value, run by sharedCleanup.
func sharedClose(f func() error) {
	closeMu.Lock()
	defer closeMu.Unlock()
	closers = append(closers, f)
}

// sharedCleanup kills the shared Redis servers and removes their
// directories.
func sharedCleanup() {
	closeMu.Lock()
	defer closeMu.Unlock()
	for _, f := range slices.Backward(closers) {
		f()
	}
	closers = nil
}

// proc is one kvreshard process.
type proc struct {
	args           []string
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	code           int
}

// start starts kvreshard with args; the process is killed when the test
// ends if it is still running.
func start(t *testing.T, args ...string) *proc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	p := &proc{args: args, cmd: exec.CommandContext(ctx, bin, args...)}
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	require.NoError(t, p.cmd.Start())
	t.Cleanup(func() {
		cancel()
		if p.cmd.ProcessState == nil {
			p.cmd.Wait()
		}
	})
	return p
}

// wait waits for the process and records its exit code (-1 when killed by
// a signal).
func (p *proc) wait(t *testing.T) *proc {
	t.Helper()
	err := p.cmd.Wait()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		require.NoError(t, err)
	}
	p.code = p.cmd.ProcessState.ExitCode()
	return p
}

func (p *proc) String() string {
	return fmt.Sprintf("kvreshard %v: exit %d\nstdout:\n%s\nstderr:\n%s", p.args, p.code, p.stdout.String(), p.stderr.String())
}

// run runs kvreshard with args to the end.
func run(t *testing.T, args ...string) *proc {
	t.Helper()
	return start(t, args...).wait(t)
}

// runAll starts one process per argument list, all at once, and waits for
// every one.
func runAll(t *testing.T, argss ...[]string) []*proc {
	t.Helper()
	ps := make([]*proc, len(argss))
	for i, a := range argss {
		ps[i] = start(t, a...)
	}
	for _, p := range ps {
		p.wait(t)
	}
	return ps
}

// readJSON is the output of kvreshard read --json.
type readJSON struct {
	Requested int    `json:"requested"`
	Hit       int    `json:"hit"`
	Verified  bool   `json:"verified"`
	Bytes     int    `json:"bytes"`
	Ops       int    `json:"ops"`
	Stop      string `json:"stop"`
	Error     string `json:"error"`
}

func parseRead(t *testing.T, p *proc) readJSON {
	t.Helper()
	var out readJSON
	require.NoError(t, json.Unmarshal(p.stdout.Bytes(), &out), p.String())
	return out
}

// writeLine is the line kvreshard write prints for each rank: T/P, or
// T/P/C under context parallelism.
var writeLine = regexp.MustCompile(`(?m)^rank (\d+/\d+(?:/\d+)?): (\d+) written, (\d+) already complete, (\d+) refused \(another layout\), (\d+) replica in \S+$`)

// manifestLine is the last line kvreshard write prints: the manifest's ID,
// its part layout and its key.
var manifestLine = regexp.MustCompile(`(?m)^manifest sha256:([0-9a-f]{64}) \((\w+)\): (kv/([0-9a-f]{64})/manifests/([0-9a-f]{64}))$`)

// counts are one rank's line of kvreshard write.
type counts struct{ written, complete, refused, replica int }

// parseWrite returns the counts of each rank "T/P" (or "T/P/C") a write
// process printed, and its manifest key.
func parseWrite(t *testing.T, p *proc) (map[string]counts, string) {
	t.Helper()
	require.Equal(t, 0, p.code, p.String())
	require.Empty(t, p.stderr.String(), p.String())
	out := map[string]counts{}
	lines := writeLine.FindAllStringSubmatch(p.stdout.String(), -1)
	for _, m := range lines {
		n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
		out[m[1]] = counts{n(2), n(3), n(4), n(5)}
	}
	l := manifestLine.FindStringSubmatch(p.stdout.String())
	require.NotNil(t, l, p.String())
	require.Equal(t, l[1], l[5], "the manifest's ID is the digest its key ends in")
	require.Equal(t, len(lines)+1, bytes.Count(p.stdout.Bytes(), []byte("\n")), p.String())
	return out, l[3]
}

// domainOf returns the model domain of a manifest key.
func domainOf(manifestKey string) string { return strings.Split(manifestKey, "/")[1] }
