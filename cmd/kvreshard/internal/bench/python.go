package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/reshard"
	"github.com/kvreshard/kvreshard/runtime/store/filestore"
)

// DefaultPython is the interpreter of the Python figures, relative to the
// repository's root: that of the virtual environment make venv makes,
// with numpy, which the Python package's pools need.
const DefaultPython = ".venv/bin/python"

// pythonEnv is what the Python figures need: the go command, the module's
// root and the interpreter.
type pythonEnv struct {
	goCmd, root, python string
}

// findPython finds the go command, the module's root (go env GOMOD, from
// the working directory) and an interpreter with numpy, or says which is
// missing: the reason the Python figures are skipped.
func findPython(ctx context.Context, o *Options) (env pythonEnv, reason string) {
	goCmd, err := exec.LookPath(cmp.Or(o.Go, "go"))
	if err != nil {
		return env, "no go command to build libkvreshard: " + err.Error()
	}
	out, err := exec.CommandContext(ctx, goCmd, "env", "GOMOD", "CGO_ENABLED").Output()
	if err != nil {
		return env, fmt.Sprintf("%s env GOMOD: %v", goCmd, err)
	}
	f := strings.Split(strings.TrimRight(string(out), "\n"), "\n") // GOMOD may be empty
	if len(f) != 2 || f[1] != "1" {
		return env, fmt.Sprintf("cgo is disabled (%s env CGO_ENABLED: %q): libkvreshard cannot be built", goCmd, f[len(f)-1])
	}
	root := filepath.Dir(f[0])
	if f[0] == "" || f[0] == os.DevNull {
		return env, fmt.Sprintf("not in a Go module (go env GOMOD: %q): run the bench from the kvreshard repository, whose libkvreshard and python/ the Python figures use", f[0])
	}
	if _, err := os.Stat(filepath.Join(root, "python", "kvreshard", "bench.py")); err != nil {
		return env, fmt.Sprintf("%s is not the kvreshard repository (no python/kvreshard/bench.py): run the bench from it", root)
	}
	python := o.Python
	if python == "" {
		python = filepath.Join(root, DefaultPython)
		if _, err := os.Stat(python); err != nil {
			return env, fmt.Sprintf("no %s: run make venv", python)
		}
	}
	python, err = exec.LookPath(python)
	if err != nil {
		return env, "no Python: " + err.Error()
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, python, "-c", "import numpy")
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return env, fmt.Sprintf("%s cannot import numpy (make venv installs it): %s", python, lastLine(stderr.String(), err))
	}
	return pythonEnv{goCmd: goCmd, root: root, python: python}, ""
}

// lastLine is the last line of a process's stderr, or its error when
// the stderr is empty.
func lastLine(stderr string, err error) string {
	s := strings.TrimSpace(stderr)
	if s == "" {
		return err.Error()
	}
	return s[strings.LastIndexByte(s, '\n')+1:]
}

// buildLib builds libkvreshard.so into dir and returns its path.
func (e pythonEnv) buildLib(ctx context.Context, dir string) (string, error) {
	lib := filepath.Join(dir, "libkvreshard.so")
	cmd := exec.CommandContext(ctx, e.goCmd, "build", "-buildmode=c-shared", "-o", lib, "./cmd/libkvreshard")
	cmd.Dir = e.root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building libkvreshard in %s: %v\n%s", e.root, err, out)
	}
	return lib, nil
}

// pySide is the Python side of the Python figures: one process of
// `python3 -m kvreshard.bench --serve`, which reads on command.
type pySide struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Scanner
	stderr bytes.Buffer
}

// startPython starts the Python side with the package of the module's
// python/ directory on the library lib.
func (e pythonEnv) startPython(ctx context.Context, lib string) (*pySide, error) {
	p := &pySide{cmd: exec.CommandContext(ctx, e.python, "-m", "kvreshard.bench", "--serve")}
	p.cmd.Dir = e.root
	p.cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(e.root, "python"), "KVRESHARD_LIB="+lib, "PYTHONDONTWRITEBYTECODE=1")
	p.cmd.Stderr = &p.stderr
	var err error
	if p.in, err = p.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p.out = bufio.NewScanner(out)
	p.out.Buffer(nil, 1<<20)
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	return p, nil
}

// pyOpen is the Python side's answer to open.
type pyOpen struct {
	Layout  string `json:"layout"`
	Slots   int    `json:"slots"`
	Regions []int  `json:"regions"`
	Domain  string `json:"domain"`
}

// pyRound is one round of the Python side's read.
type pyRound struct {
	Round   int     `json:"round"`
	Seconds float64 `json:"seconds"`
	Hit     int     `json:"hit"`
	Bytes   int     `json:"bytes"`
	Ops     int     `json:"ops"`
	Stop    string  `json:"stop"`
	Message string  `json:"message"`
}

// pyCalls is one round of the Python side's empty calls.
type pyCalls struct {
	Round   int     `json:"round"`
	US      float64 `json:"us"`       // Reader.read([], [])
	RawUS   float64 `json:"raw_us"`   // kvr_reader_read through ctypes, its arguments ready
	FloorUS float64 `json:"floor_us"` // kvr_set_max_procs(0) through ctypes
}

// send sends one command and decodes the answer's n lines into each(i).
func (p *pySide) send(cmd map[string]any, n int, each func(i int) any) error {
	b, err := json.Marshal(cmd)
	if err != nil {
		return err
	}
	if _, err := p.in.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("python side: %s: %w", cmd["op"], err)
	}
	for i := range n {
		if !p.out.Scan() {
			err := p.out.Err()
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("python side: %s: %w", cmd["op"], err)
		}
		line := p.out.Bytes()
		var e struct {
			Error *string `json:"error"`
		}
		if err := json.Unmarshal(line, &e); err != nil {
			return fmt.Errorf("python side: %s: %q: %w", cmd["op"], line, err)
		}
		if e.Error != nil {
			return fmt.Errorf("python side: %s", *e.Error)
		}
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(each(i)); err != nil {
			return fmt.Errorf("python side: %s: %q: %w", cmd["op"], line, err)
		}
	}
	return nil
}

// failed ends the Python side after err (see close) and adds its stderr
// to err.
func (p *pySide) failed(err error) error {
	p.close()
	if s := strings.TrimSpace(p.stderr.String()); s != "" {
		return fmt.Errorf("%w\n%s", err, s)
	}
	return err
}

// close ends the Python side: the end of its input, which it answers by
// exiting, or a kill when it has not exited 10 seconds later (it hangs).
func (p *pySide) close() error {
	p.in.Close()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		err = <-done
	}
	if err != nil {
		return fmt.Errorf("python side: %v\n%s", err, strings.TrimSpace(p.stderr.String()))
	}
	return nil
}

// open opens the Python side's store and reader of the resharding rank
// on the pages of keys (made by content.PageKeys with the prefix the
// library gives its keys), into slots.
func (p *pySide) open(url string, m *manifest.Model, keys []string, slots []int) (pyOpen, error) {
	hashes := make([]string, len(keys))
	for i, k := range keys {
		prefix, hash, _, ok := manifest.SplitPageKey(k)
		if !ok || prefix != "kvreshard" {
			return pyOpen{}, fmt.Errorf("python side: key %q is not a page key of prefix kvreshard", k)
		}
		hashes[i] = hash
	}
	var o pyOpen
	err := p.send(map[string]any{"op": "open", "url": url, "name": m.ModelID, "domain": m.Domain(), "keys": hashes, "slots": slots},
		1, func(int) any { return &o })
	return o, err
}

// read reads all the pages rounds times.
func (p *pySide) read(rounds int) ([]pyRound, error) {
	out := make([]pyRound, rounds)
	err := p.send(map[string]any{"op": "read", "rounds": rounds}, rounds, func(i int) any { return &out[i] })
	return out, err
}

// calls times rounds rounds of n empty reads.
func (p *pySide) calls(rounds, n int) ([]pyCalls, error) {
	out := make([]pyCalls, rounds)
	err := p.send(map[string]any{"op": "calls", "rounds": rounds, "calls": n}, rounds, func(i int) any { return &out[i] })
	return out, err
}

// digest returns the SHA-256 of each of the Python side's pool regions.
func (p *pySide) digest() ([]string, error) {
	var d struct {
		SHA256 []string `json:"sha256"`
	}
	err := p.send(map[string]any{"op": "digest"}, 1, func(int) any { return &d })
	return d.SHA256, err
}

// goPool is the Go side of python_vs_go_read: a reader of the resharding
// rank with the library's options (auto on the file cost model, a copy
// worker per GOMAXPROCS), its pool of one slot a page, and the slots.
type goPool struct {
	rd      *reshard.Reader
	regions [][]byte
	slots   []int
	bytes   int // of a read of every page
}

// newGoPool makes the Go side's reader and pool, reads the pages once and
// checks every slot element by element.
func (c *case70) newGoPool(ctx context.Context, st *filestore.Store, keys []string) (*goPool, error) {
	b, err := plan.BindingFor(c.d, c.reshard, placement.Rank{}, c.poolL, len(keys))
	if err != nil {
		return nil, err
	}
	tr := plan.FileTransport()
	rd, err := reshard.NewReader(st, c.model.Domain(), c.d, b, reshard.ReaderOptions{Plan: plan.Options{Strategy: plan.Auto, Transport: &tr}})
	if err != nil {
		return nil, err
	}
	g := rd.Geometry()
	gp := &goPool{rd: rd, regions: g.NewRegions(), slots: make([]int, len(keys))}
	for i := range gp.slots {
		gp.slots[i] = len(keys) - 1 - i
	}
	if gp.bytes, err = gp.read(ctx, keys); err != nil {
		return nil, err
	}
	for _, s := range gp.slots {
		if err := content.Verify(g, gp.regions, s, c.seed); err != nil {
			return nil, fmt.Errorf("go side, after the read: %w", err)
		}
	}
	return gp, nil
}

// read reads every page of keys and returns the bytes read.
func (gp *goPool) read(ctx context.Context, keys []string) (int, error) {
	res, err := gp.rd.Read(ctx, keys, gp.slots, gp.regions)
	if err != nil {
		return 0, err
	}
	if res.Hit != len(keys) {
		return 0, fmt.Errorf("go side: read %d of %d pages: %v", res.Hit, len(keys), res.Stop)
	}
	return res.Bytes, nil
}

// digest returns the SHA-256 of each of the Go side's pool regions.
func (gp *goPool) digest() []string {
	out := make([]string, len(gp.regions))
	for i, r := range gp.regions {
		s := sha256.Sum256(r)
		out[i] = hex.EncodeToString(s[:])
	}
	return out
}

// pythonSkipped are the Python figures, skipped for reason.
func pythonSkipped(reason string) []Figure {
	return []Figure{
		{Name: "python_vs_go_read", Unit: "x", BaselineUnit: "GB/s", Target: ">= 0.95", Skipped: reason},
		{Name: "python_call_us", Unit: "µs", BaselineUnit: "µs", Target: "<= 5", Skipped: reason},
	}
}

// workDir makes a temporary directory for a step that runs Python (name
// names it) and builds libkvreshard into it; the caller removes it.
func (e pythonEnv) workDir(ctx context.Context, o *Options, name string) (dir, lib string, err error) {
	if dir, err = os.MkdirTemp(o.TempDir, "kvreshard-bench-"+name+"-"); err != nil {
		return "", "", err
	}
	if lib, err = e.buildLib(ctx, dir); err != nil {
		os.RemoveAll(dir)
		return "", "", err
	}
	return dir, lib, nil
}

// python measures python_vs_go_read and python_call_us: the resharded
// read of the 70B case through the Python package (a process of python3
// -m kvreshard.bench --serve over libkvreshard, built for the run from
// the module's source) against the Go reader, the same pages of the same
// file store into pools of the same layout and size, in turns; and an
// empty read call through the package. Without go, cgo, the repository,
// the interpreter or numpy both are skipped with the reason.
func (c *case70) python(ctx context.Context, o *Options) ([]Figure, error) {
	env, reason := findPython(ctx, o)
	if reason != "" {
		return pythonSkipped(reason), nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute) // nothing waits for ever on the processes
	defer cancel()
	dir, lib, err := env.workDir(ctx, o, "python")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	storeDir := filepath.Join(dir, "store")
	st, err := filestore.Open(storeDir, filestore.Options{})
	if err != nil {
		return nil, err
	}
	defer st.Close()
	keys := content.PageKeys("kvreshard", c.model.Domain(), c.sz.pages)
	if err := c.write(ctx, st, keys); err != nil {
		return nil, err
	}
	gp, err := c.newGoPool(ctx, st, keys)
	if err != nil {
		return nil, err
	}
	py, err := env.startPython(ctx, lib)
	if err != nil {
		return nil, err
	}
	figs, err := c.pythonFigures(ctx, py, gp, "file://"+storeDir, keys, o.Quick)
	if err != nil {
		return nil, py.failed(err)
	}
	return figs, py.close()
}

// pythonFigures measures the two figures with the two sides ready.
func (c *case70) pythonFigures(ctx context.Context, py *pySide, gp *goPool, url string, keys []string, quick bool) ([]Figure, error) {
	op, err := py.open(url, &c.model, keys, gp.slots)
	if err != nil {
		return nil, err
	}
	if want := gp.sizes(); op.Layout != c.poolL.Name || op.Slots != len(keys) || !slices.Equal(op.Regions, want) {
		return nil, fmt.Errorf("python side: a %s pool of %d slots, regions of %v bytes; the go side's is %s, %d slots, %v", op.Layout, op.Slots, op.Regions, c.poolL.Name, len(keys), want)
	}
	// A read that fills the caches, and the two pools compared.
	if _, err := pyRead(py, 1, len(keys), gp.bytes); err != nil {
		return nil, err
	}
	pd, err := py.digest()
	if err != nil {
		return nil, err
	}
	if gd := gp.digest(); !slices.Equal(pd, gd) {
		return nil, fmt.Errorf("python side: pool regions of SHA-256 %v after the read; the go side's are %v", pd, gd)
	}
	// In turns, each side reading the pages k times (about pyTurnBytes),
	// twice a turn, in the order Go Python Python Go, then Python Go Go
	// Python: load that rises or falls during a turn weighs on both
	// alike. Go's time over Python's, the median of the turns'; the times
	// are per read.
	n, bytes := 3*c.sz.reps, gp.bytes
	k := max(1, pyTurnBytes/bytes)
	ratios, goTimes, pyTimes := make([]float64, n), make([]time.Duration, n), make([]time.Duration, n)
	for i := range n {
		for j := range 4 {
			if goFirst, inner := i%2 == 0, j == 1 || j == 2; goFirst != inner {
				start := time.Now()
				for range k {
					if _, err := gp.read(ctx, keys); err != nil {
						return nil, err
					}
				}
				goTimes[i] += time.Since(start)
				continue
			}
			s, err := pyRead(py, k, len(keys), bytes)
			if err != nil {
				return nil, err
			}
			pyTimes[i] += time.Duration(s * 1e9)
		}
		goTimes[i], pyTimes[i] = goTimes[i]/time.Duration(2*k), pyTimes[i]/time.Duration(2*k)
		ratios[i] = float64(goTimes[i]) / float64(max(pyTimes[i], 1))
	}
	slices.Sort(ratios)
	slices.Sort(goTimes)
	slices.Sort(pyTimes)
	read := Figure{Name: "python_vs_go_read", Value: round(ratios[n/2]), Unit: "x", Baseline: round(gbps(bytes, goTimes[0])), BaselineUnit: "GB/s",
		Detail: fmt.Sprintf("%d pages from the file store, TP 4/PP 2 rank 0/0 into page_first, through the Python package (one python3 process over libkvreshard, numpy pools): %.2f GB/s best, %.2f median; the Go reader with the library's options into a pool of the same layout and size: %.2f GB/s best, %.2f median; Go's time over Python's, median of %d turns of %d reads a side (ABBA)",
			len(keys), gbps(bytes, pyTimes[0]), gbps(bytes, pyTimes[n/2]), gbps(bytes, goTimes[0]), gbps(bytes, goTimes[n/2]), n, 2*k)}
	atLeast(&read, 0.95)

	calls := 2000
	if !quick {
		calls = 10000
	}
	rounds, err := py.calls(n, calls)
	if err != nil {
		return nil, err
	}
	each, raw, floor := make([]float64, n), make([]float64, n), make([]float64, n)
	for i, r := range rounds {
		each[i], raw[i], floor[i] = r.US, r.RawUS, r.FloorUS
	}
	slices.Sort(each)
	slices.Sort(raw)
	slices.Sort(floor)
	goEmpty, err := median(n*calls/10, func() error { _, err := gp.rd.Read(ctx, nil, nil, gp.regions); return err })
	if err != nil {
		return nil, err
	}
	call := Figure{Name: "python_call_us", Value: round(each[n/2]), Unit: "µs", Baseline: round(floor[n/2]), BaselineUnit: "µs",
		Detail: fmt.Sprintf("Reader.read([], []) through the Python package, median of %d rounds of %d calls; kvr_reader_read through ctypes with its arguments ready, without the package's Python: %.2f µs; the same empty read from Go, without C: %.3f µs; baseline: the library's cheapest call through ctypes (kvr_set_max_procs(0)), the floor of any call",
			n, calls, raw[n/2], us(goEmpty))}
	atMost(&call, 5)
	return []Figure{read, call}, nil
}

// pyTurnBytes are about the bytes each side of python_vs_go_read reads
// at a time, twice a turn: a full run's 12 pages, three reads of a quick
// run's 4.
const pyTurnBytes = 30 << 20

// pyRead reads the pages rounds times on the Python side, checks that
// each read every page, as many bytes as the Go side, and returns the
// seconds of the reads.
func pyRead(py *pySide, rounds, pages, bytes int) (float64, error) {
	rs, err := py.read(rounds)
	if err != nil {
		return 0, err
	}
	var s float64
	for _, r := range rs {
		if r.Hit != pages || r.Bytes != bytes {
			return 0, fmt.Errorf("python side: round %d read %d of %d pages, %d bytes (go: %d): %s %s", r.Round, r.Hit, pages, r.Bytes, bytes, r.Stop, r.Message)
		}
		s += r.Seconds
	}
	return s, nil
}

// sizes are the bytes of the Go side's regions.
func (gp *goPool) sizes() []int {
	out := make([]int, len(gp.regions))
	for i, r := range gp.regions {
		out[i] = len(r)
	}
	return out
}
