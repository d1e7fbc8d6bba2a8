// Package tests holds kvreshard's end-to-end tests: real `kvreshard write`
// and `kvreshard read` processes sharing a file store, so that pages written
// by processes that have exited (or were killed) are read by others.
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
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/runtime/manifest"
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
	os.RemoveAll(dir)
	os.Exit(code)
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

// writeLine is the line kvreshard write prints for each rank.
var writeLine = regexp.MustCompile(`(?m)^rank (\d+)/(\d+): (\d+) written, (\d+) already complete, (\d+) refused \(another layout\), (\d+) replica in \S+$`)

// layoutLine is the last line kvreshard write prints.
var layoutLine = regexp.MustCompile(`(?m)^layout sha256:([0-9a-f]{64}) \((\w+), manifest (kv/([0-9a-f]{64})/manifests/([0-9a-f]{64}))\)$`)

// counts are one rank's line of kvreshard write.
type counts struct{ written, complete, refused, replica int }

// parseWrite returns the counts of each rank "T/P" a write process printed,
// and its manifest key.
func parseWrite(t *testing.T, p *proc) (map[string]counts, string) {
	t.Helper()
	require.Equal(t, 0, p.code, p.String())
	require.Empty(t, p.stderr.String(), p.String())
	out := map[string]counts{}
	lines := writeLine.FindAllStringSubmatch(p.stdout.String(), -1)
	for _, m := range lines {
		n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
		out[m[1]+"/"+m[2]] = counts{n(3), n(4), n(5), n(6)}
	}
	l := layoutLine.FindStringSubmatch(p.stdout.String())
	require.NotNil(t, l, p.String())
	require.Equal(t, l[1], l[5], "layout id and manifest digest")
	require.Equal(t, len(lines)+1, bytes.Count(p.stdout.Bytes(), []byte("\n")), p.String())
	return out, l[3]
}

// domainOf returns the model domain of a manifest key.
func domainOf(manifestKey string) string { return strings.Split(manifestKey, "/")[1] }

// pageKeys are the keys kvreshard write and read use for --pages n
// (cmd/kvreshard/pages.go): the prefix, a token-hash stand-in, the domain.
func pageKeys(prefix, domain string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = manifest.PageKey(prefix, fmt.Sprintf("%016x", uint64(i)*0x9e3779b97f4a7c15), domain)
	}
	return keys
}
