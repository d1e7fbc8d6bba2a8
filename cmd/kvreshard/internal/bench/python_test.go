package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/runtime/store/filestore"
)

// requirePython returns the environment of the Python figures, or skips
// the test with the reason they would be skipped, unless
// KVRESHARD_REQUIRE_PYTHON=1 (CI), where it fails.
func requirePython(t *testing.T) pythonEnv {
	t.Helper()
	env, reason := findPython(context.Background(), &Options{})
	if reason != "" {
		if os.Getenv("KVRESHARD_REQUIRE_PYTHON") == "1" {
			t.Fatal(reason)
		}
		t.Skip(reason)
	}
	return env
}

// TestPythonProtocol drives the Python side of the Python figures
// (python3 -m kvreshard.bench --serve over a libkvreshard built for the
// test) on 3 pages written by the Go writers of the 70B case: a pool of
// the Go side's layout and size; a round of 3 pages reads 3 pages and as
// many bytes as the Go reader, and leaves the pool's bytes those of the
// Go reader's pool, which holds every element of the pages; a page
// missing from the store ends a round there; calls rounds are timed;
// a bad command is an error that ends the process.
func TestPythonProtocol(t *testing.T) {
	env := requirePython(t)
	ctx := context.Background()
	dir := t.TempDir()
	lib, err := env.buildLib(ctx, dir)
	require.NoError(t, err)
	c, err := newCase70((&Options{Quick: true}).sizes())
	require.NoError(t, err)
	_, err = c.fill(ctx, nil)
	require.NoError(t, err)
	st, err := filestore.Open(filepath.Join(dir, "store"), filestore.Options{})
	require.NoError(t, err)
	defer st.Close()
	keys := content.PageKeys("kvreshard", c.model.Domain(), 4)
	require.NoError(t, c.write(ctx, st, keys[:3]))
	gp, err := c.newGoPool(ctx, st, keys[:3])
	require.NoError(t, err)
	require.Equal(t, 3*2*64*40*2*128*2, gp.bytes)

	py, err := env.startPython(ctx, lib)
	require.NoError(t, err)
	defer py.close()
	op, err := py.open("file://"+filepath.Join(dir, "store"), &c.model, keys[:3], gp.slots)
	require.NoError(t, err)
	require.Equal(t, pyOpen{Layout: "page_first", Slots: 3, Regions: []int{3 * 64 * 40 * 2 * 128 * 2, 3 * 64 * 40 * 2 * 128 * 2}, Domain: c.model.Domain()}, op)
	require.Equal(t, gp.sizes(), op.Regions)
	// An empty pool is not the Go side's.
	d, err := py.digest()
	require.NoError(t, err)
	require.NotEqual(t, gp.digest(), d)
	rounds, err := py.read(2)
	require.NoError(t, err)
	require.Len(t, rounds, 2)
	for i, r := range rounds {
		require.Equal(t, i, r.Round)
		require.Equal(t, []any{3, gp.bytes, "NONE", ""}, []any{r.Hit, r.Bytes, r.Stop, r.Message})
		require.Positive(t, r.Ops)
		require.Positive(t, r.Seconds)
	}
	d, err = py.digest()
	require.NoError(t, err)
	require.Equal(t, gp.digest(), d)
	require.NoError(t, py.close())

	// keys[3] was never written: a read of keys 0, 3, 1 stops after one
	// page.
	py, err = env.startPython(ctx, lib)
	require.NoError(t, err)
	defer py.close()
	_, err = py.open("file://"+filepath.Join(dir, "store"), &c.model, []string{keys[0], keys[3], keys[1]}, []int{0, 1, 2})
	require.NoError(t, err)
	rounds, err = py.read(1)
	require.NoError(t, err)
	require.Equal(t, []any{1, gp.bytes / 3, "MISS"}, []any{rounds[0].Hit, rounds[0].Bytes, rounds[0].Stop})
	_, err = pyRead(py, 2, 3, gp.bytes)
	require.EqualError(t, err, "python side: round 0 read 1 of 3 pages, "+strconv.Itoa(gp.bytes/3)+" bytes (go: "+strconv.Itoa(gp.bytes)+"): MISS "+rounds[0].Message)
	calls, err := py.calls(3, 10)
	require.NoError(t, err)
	require.Len(t, calls, 3)
	for i, r := range calls {
		require.Equal(t, i, r.Round)
		require.Positive(t, r.US)
		require.Positive(t, r.RawUS)
		require.Positive(t, r.FloorUS)
	}
	err = py.send(map[string]any{"op": "write"}, 1, func(int) any { return new(pyRound) })
	require.EqualError(t, err, `python side: ValueError: unknown command {"op":"write"}`)
	err = py.close()
	require.Error(t, err)
	require.True(t, strings.HasPrefix(err.Error(), "python side: exit status 1"), err.Error())
}

// TestPythonOpenChecks: the Python side refuses a read before open, and
// a domain that is not its model's (here another revision's).
func TestPythonOpenChecks(t *testing.T) {
	env := requirePython(t)
	ctx := context.Background()
	dir := t.TempDir()
	lib, err := env.buildLib(ctx, dir)
	require.NoError(t, err)
	c, err := newCase70((&Options{Quick: true}).sizes())
	require.NoError(t, err)
	py, err := env.startPython(ctx, lib)
	require.NoError(t, err)
	_, err = py.read(1)
	require.EqualError(t, err, "python side: ValueError: read: open first")
	require.Error(t, py.close())

	py, err = env.startPython(ctx, lib)
	require.NoError(t, err)
	m := c.model
	m.Revision = "1" // the Python side's model is of revision 0
	_, err = py.open("file://"+dir, &m, []string{"kvreshard_00_" + m.Domain()}, []int{0})
	require.EqualError(t, err, "python side: ValueError: open: model domain "+c.model.Domain()+", not the caller's "+m.Domain())
	require.Error(t, py.close())
}

// TestPythonSkipped: with a configured interpreter or go command that
// does not exist, or an interpreter without numpy, the Python figures are
// skipped with the reason, after the pages step they would need.
func TestPythonSkipped(t *testing.T) {
	noNumpy := filepath.Join(t.TempDir(), "python3")
	require.NoError(t, os.WriteFile(noNumpy, []byte("#!/bin/sh\necho Traceback >&2\necho \"ModuleNotFoundError: No module named 'numpy'\" >&2\nexit 1\n"), 0o755))
	// The interpreter is looked at once go, cgo and the module are found.
	_, pre := findPython(context.Background(), &Options{Python: "/bin/sh"})
	pythonReached := strings.HasPrefix(pre, "/bin/sh cannot import numpy")
	for _, tc := range []struct {
		o      Options
		reason string
	}{
		{Options{Python: "/nonexistent/python3"}, `no Python: exec: "/nonexistent/python3": stat /nonexistent/python3: no such file or directory`},
		{Options{Go: "/nonexistent/go"}, `no go command to build libkvreshard: exec: "/nonexistent/go": stat /nonexistent/go: no such file or directory`},
		{Options{Python: noNumpy}, noNumpy + ` cannot import numpy (make venv installs it): ModuleNotFoundError: No module named 'numpy'`},
	} {
		if tc.o.Go == "" && !pythonReached {
			t.Logf("not checked with python %s: %s", tc.o.Python, pre)
			continue
		}
		var steps []step
		tc.o.Quick, tc.o.Steps = true, []string{"python"}
		tc.o.Progress = func(d, n int, s string) { steps = append(steps, step{d, n, s}) }
		figs, err := Run(context.Background(), tc.o)
		require.NoError(t, err)
		require.Equal(t, []step{{0, 2, "pages"}, {1, 2, "python"}, {2, 2, "done"}}, steps)
		require.Equal(t, []Figure{
			{Name: "python_vs_go_read", Unit: "x", BaselineUnit: "GB/s", Target: ">= 0.95", Skipped: tc.reason},
			{Name: "python_call_us", Unit: "µs", BaselineUnit: "µs", Target: "<= 5", Skipped: tc.reason},
		}, figs)
	}
}

// TestPythonNeedsModuleAndCgo: outside a Go module, or with cgo
// disabled, libkvreshard cannot be built: the reason says which.
func TestPythonNeedsModuleAndCgo(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command: ", err)
	}
	t.Setenv("GOFLAGS", "")
	t.Setenv("GOWORK", "off")
	t.Setenv("CGO_ENABLED", "0")
	_, reason := findPython(context.Background(), &Options{})
	require.Equal(t, "cgo is disabled ("+goCmd+` env CGO_ENABLED: "0"): libkvreshard cannot be built`, reason)
	t.Setenv("CGO_ENABLED", "1")
	t.Setenv("GO111MODULE", "on")
	t.Chdir(t.TempDir())
	_, reason = findPython(context.Background(), &Options{})
	require.Equal(t, `not in a Go module (go env GOMOD: "/dev/null"): run the bench from the kvreshard repository, whose libkvreshard and python/ the Python figures use`, reason)
	t.Setenv("GO111MODULE", "off")
	_, reason = findPython(context.Background(), &Options{})
	require.Equal(t, `not in a Go module (go env GOMOD: ""): run the bench from the kvreshard repository, whose libkvreshard and python/ the Python figures use`, reason)
}
