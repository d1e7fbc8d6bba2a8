package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The Mooncake figures are measured by the Python package on a Mooncake
// Store of its own (python3 -m kvreshard.bench --mooncake): Mooncake's
// client is Python, and the Go runtime reaches it through the C library's
// object engine (python/kvreshard/mooncake.py). Its clients listen on
// every address of the host, so the Python side runs in a user and network
// namespace with only loopback (netnsScript), where it starts
// mooncake_master and a memory holder and is itself the reader: a client
// with no memory of its own, every byte over TCP.

// netnsScript brings up loopback in a namespace of unshare -rn and runs
// the command after it.
const netnsScript = `ip link set lo up && exec "$@"`

// mooncakeSkipped are the Mooncake figures, skipped for reason.
func mooncakeSkipped(reason string) []Figure {
	return []Figure{
		{Name: "mooncake_vs_get_into", Unit: "x", BaselineUnit: "GB/s", Target: ">= 0.8", Skipped: reason},
		{Name: "mooncake_query_cost", Unit: "x", BaselineUnit: "µs", Skipped: reason},
	}
}

// mooncakeReason says why the Mooncake figures cannot be measured with
// env (no Mooncake in the interpreter, no loopback-only namespace), or "".
func (e pythonEnv) mooncakeReason(ctx context.Context) string {
	cmd := exec.CommandContext(ctx, e.python, "-c",
		"from kvreshard import mooncake_local as ml; print(ml.mooncake_reason() or ml.netns_reason() or '')")
	cmd.Dir = e.root
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(e.root, "python"), "PYTHONDONTWRITEBYTECODE=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Sprintf("%s cannot check for Mooncake: %s", e.python, lastLine(stderr.String(), err))
	}
	return strings.TrimSpace(string(out))
}

// mcResult is what python3 -m kvreshard.bench --mooncake prints: the
// times in seconds of every turn, [subject, baseline].
type mcResult struct {
	Error      *string `json:"error"`
	Pages      int     `json:"pages"`
	Turns      int     `json:"turns"`
	PageBytes  int     `json:"page_bytes"`
	Share      int     `json:"share"`
	Segment    int     `json:"segment"`
	WriteSecs  float64 `json:"write_seconds"`
	PartStored int     `json:"part_stored_bytes"`
	Layouts    map[string]struct {
		Bytes     int          `json:"bytes"`
		Ops       int          `json:"ops"`
		Ranges    int          `json:"ranges"`
		Turns     [][2]float64 `json:"turns"`      // Reader.read, batch_get_into
		RawRanges [][2]float64 `json:"raw_ranges"` // get_into_ranges of the spans, batch_get_into
		Parts     [][2]float64 `json:"parts"`      // batch_get_into of the whole parts, batch_get_into
	} `json:"layouts"`
	Query struct {
		Pages int          `json:"pages"`
		Cold  float64      `json:"cold"`
		Turns [][2]float64 `json:"turns"` // Reader.exists, batch_is_exist
	} `json:"query"`
	Engine map[string]int `json:"engine"`
}

// turnStats are the medians of turns of a subject against a baseline:
// the ratio baseline/subject, and each side's time.
type turnStats struct {
	ratio            float64
	subject, base    time.Duration // medians
	bestSub, bestBas time.Duration
}

func statsOf(turns [][2]float64) turnStats {
	n := len(turns)
	ratios, sub, bas := make([]float64, n), make([]float64, n), make([]float64, n)
	for i, t := range turns {
		ratios[i], sub[i], bas[i] = t[1]/max(t[0], 1e-9), t[0], t[1]
	}
	slices.Sort(ratios)
	slices.Sort(sub)
	slices.Sort(bas)
	d := func(s float64) time.Duration { return time.Duration(s * 1e9) }
	return turnStats{ratio: ratios[n/2], subject: d(sub[n/2]), base: d(bas[n/2]), bestSub: d(sub[0]), bestBas: d(bas[0])}
}

// mooncake measures mooncake_vs_get_into and mooncake_query_cost (see
// mooncakeFigures), or skips them with the reason: no go, cgo, repository,
// interpreter or numpy (as the Python figures), no Mooncake in the
// interpreter (make venv installs it), or no unshare for a loopback-only
// network namespace.
func (c *case70) mooncake(ctx context.Context, o *Options) ([]Figure, error) {
	env, reason := findPython(ctx, o)
	if reason != "" {
		return mooncakeSkipped(reason), nil
	}
	if reason := env.mooncakeReason(ctx); reason != "" {
		return mooncakeSkipped(reason), nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute) // nothing waits for ever on the processes
	defer cancel()
	dir, lib, err := env.workDir(ctx, o, "mooncake")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	turns := 3 * c.sz.reps
	args := []string{"-rn", "sh", "-c", netnsScript, "sh", env.python, "-m", "kvreshard.bench", "--mooncake",
		"--pages", strconv.Itoa(c.sz.pages), "--turns", strconv.Itoa(turns)}
	cmd := exec.CommandContext(ctx, "unshare", args...)
	cmd.Dir = env.root
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(env.root, "python"), "KVRESHARD_LIB="+lib,
		"PYTHONDONTWRITEBYTECODE=1", "MC_STORE_MEMCPY=false", "MC_LOG_LEVEL=ERROR", "TMPDIR="+dir)
	cmd.WaitDelay = 10 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var r mcResult
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		return nil, fmt.Errorf("python3 -m kvreshard.bench --mooncake: %v (%v)\n%s", runErr, err, tail(stderr.String(), 3000))
	}
	if r.Error != nil {
		return nil, fmt.Errorf("python3 -m kvreshard.bench --mooncake: %s\n%s", *r.Error, tail(stderr.String(), 3000))
	}
	if runErr != nil {
		return nil, fmt.Errorf("python3 -m kvreshard.bench --mooncake: %v\n%s", runErr, tail(stderr.String(), 3000))
	}
	return mooncakeFigures(&r)
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// mooncakeFigures makes the figures of a run of the Python side.
//
// mooncake_vs_get_into is the resharded read of the pages written by TP 8
// in LPHD, read by rank 0/0 of TP 4 x PP 2 into a page_first pool, against
// batch_get_into of as many objects of the reader's bytes of a page: the
// read an identity layout would make. The figure uses LPHD parts because
// that is the part layout a Mooncake deployment whose readers split the
// layers should write: a PP-split reader of LPHD parts needs one run per
// part and component (4 ranges of 640 KiB a page), of PLHD parts a run of
// 10 KiB per token (256 ranges a page, each costing Mooncake's ranged read
// about 12 µs) or, as auto then picks, the whole parts (twice the bytes).
// Both layouts are in the detail, with what bounds them, measured in the
// same run: get_into_ranges of the same spans without kvreshard, and
// batch_get_into of the whole parts holding them.
func mooncakeFigures(r *mcResult) ([]Figure, error) {
	lp, ok1 := r.Layouts["LPHD"]
	pp, ok2 := r.Layouts["PLHD"]
	if !ok1 || !ok2 || len(lp.Turns) == 0 || len(pp.Turns) == 0 || len(r.Query.Turns) == 0 || r.Pages == 0 {
		return nil, fmt.Errorf("python3 -m kvreshard.bench --mooncake: incomplete answer: %+v", r)
	}
	n, bytes := r.Pages, lp.Bytes
	l, lr, lw := statsOf(lp.Turns), statsOf(lp.RawRanges), statsOf(lp.Parts)
	p, pr, pw := statsOf(pp.Turns), statsOf(pp.RawRanges), statsOf(pp.Parts)
	vs := Figure{Name: "mooncake_vs_get_into", Value: round(l.ratio), Unit: "x", Baseline: round(gbps(bytes, l.bestBas)), BaselineUnit: "GB/s",
		Detail: fmt.Sprintf("%d pages of the 70B case written by TP 8 in LPHD, read by TP 4/PP 2 rank 0/0 into page_first through the Python package on Mooncake Store (a master and a holder process on loopback, the reader a client with no memory: every byte over TCP; one get_into_ranges a batch of pages into staging, %d ranges a page, then the copy kernel): %.2f GB/s best, %.2f median; batch_get_into of %d objects of %d bytes into registered memory: %.2f GB/s best, %.2f median; median of %d turns (ABBA). "+
			"What bounds it, same run: get_into_ranges of the same %d spans without kvreshard, one call: %.2fx of batch_get_into; batch_get_into of the whole parts holding them (%d bytes each): %.2fx. "+
			"PLHD parts (auto reads %d ranges a page, the parts nearly whole): %.2fx; their %d spans of 10 KiB by get_into_ranges without kvreshard: %.2fx; their whole parts: %.2fx",
			n, lp.Ops/n, gbps(bytes, l.bestSub), gbps(bytes, l.subject), n, r.Share, gbps(bytes, l.bestBas), gbps(bytes, l.base), len(lp.Turns),
			lp.Ranges, lr.ratio, r.PartStored, lw.ratio,
			pp.Ops/n, p.ratio, pp.Ranges, pr.ratio, pw.ratio)}
	atLeast(&vs, 0.8)
	q := statsOf(r.Query.Turns)
	query := Figure{Name: "mooncake_query_cost", Value: round(q.ratio), Unit: "x", Baseline: round(us(q.base)), BaselineUnit: "µs",
		Detail: fmt.Sprintf("the hit prefix of %d pages, Reader.exists through the Python package on Mooncake Store (one batch_is_exist of their commits through the engine; the commits read once, then remembered): %.1f µs median (the first call, reading the commits: %.0f µs); one batch_is_exist of the %d commit keys from Python: %.1f µs; batch_is_exist's time over Reader.exists', median of %d turns of 10 calls each",
			r.Query.Pages, us(q.subject), r.Query.Cold*1e6, r.Query.Pages, us(q.base), len(r.Query.Turns))}
	return []Figure{vs, query}, nil
}
