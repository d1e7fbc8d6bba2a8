// Package bench is kvreshard's benchmark suite, the figures that
// `kvreshard bench` prints. Each figure is measured against its baseline
// in the same run, on the machine at hand:
//
//	copy_vs_memmove           the generated copy kernel of the 70B case
//	                          (TP 8 PLHD parts into a TP 4 page_first pool)
//	                          against one copy() of as many contiguous
//	                          bytes
//	copy_vs_memmove_runs      the same kernel against copy() of the same
//	                          runs, one call per run
//	generated_vs_interpreter  the generated range kernels of the 12
//	                          built-in part -> pool pairs on the 70B
//	                          problem against the interpreter
//	plan_build_us_70b         Planner.Build of the 70B case (direct),
//	                          against a planner that places every element
//	                          and merges, as the reference planner does
//	plan_build_auto_us_70b    the same with auto on the Redis cost model,
//	                          against direct
//	ops_direct_70b            ops of the direct plan, against the merged
//	                          runs of the element-by-element planner
//	ops_auto_redis_70b        ops of auto on Redis, against direct
//	reshard_vs_identity_mem   resharded reads (TP 8 -> TP 4/PP 2 rank 0/0)
//	                          against identity reads (TP 8 -> TP 8 rank 0)
//	                          of as many bytes, memory store
//	gapped_vs_contiguous_mem  the resharding reader's source spans moved by
//	                          the kernels' row mover, without kvreshard,
//	                          against whole parts: what the access pattern
//	                          alone costs, the bound of the figure above
//	reshard_gbps_file         resharded reads (auto) from the file store,
//	                          against direct
//	redis_vs_get              resharded reads (auto) from Redis against
//	                          pipelined GET of values of the same size
//	redis_getrange_vs_get     the same spans read by plain pipelined
//	                          GETRANGE, without kvreshard, against the same
//	                          GET: what a range reader gets from the
//	                          server, the reference for the figure above
//	redis_vs_get_parts        the same reads against pipelined GET of the
//	                          whole parts that hold the bytes
//	reshard_gbps_redis        resharded reads (auto) from Redis, against
//	                          direct
//	auto_regret_file          the time of resharded reads from the file
//	                          store with the plan auto picks on the file
//	                          cost model, over the time of the fastest of
//	                          direct, scatter and staged, timed in turns
//	auto_regret_redis         the same from Redis, on the Redis cost model
//	checksum_cost             staged reads of whole parts from the file
//	                          store, every byte copied checked against its
//	                          part's checksums (ReaderOptions.CheckParts),
//	                          against the same reads unchecked
//	checksum_cost_range       a TP 2 rank's reads of half of each part of
//	                          pages written by TP 1, from the file store,
//	                          checked, against the same reads unchecked
//	checksum_cost_range_redis the same from Redis
//	mooncake_vs_get_into      resharded reads (TP 8 LPHD parts -> TP 4/PP 2
//	                          rank 0/0) from Mooncake Store through the
//	                          Python package, against Mooncake's own
//	                          batch_get_into of whole objects of as many
//	                          bytes, timed in turns; a master and a memory
//	                          holder of its own, in a loopback-only
//	                          network namespace (unshare -rn)
//	mooncake_query_cost       the hit prefix of 128 pages (Reader.exists)
//	                          on Mooncake Store, against one batch_is_exist
//	                          of their 128 commit keys
//	python_vs_go_read         resharded reads from the file store through
//	                          the Python package (python3 -m
//	                          kvreshard.bench --serve over libkvreshard,
//	                          built for the run) against the Go reader,
//	                          same pages, pools of the same layout and size,
//	                          timed in turns
//	python_call_us            one empty batch call, Reader.read([], []),
//	                          through the Python package, against the
//	                          library's cheapest call through ctypes
//
// Times are the best of several runs, and the kernel ratios the median of
// turns taken in alternation with their baselines: the machine may be
// shared.
package bench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Figure is one measured figure and its baseline.
type Figure struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Unit  string  `json:"unit"`
	// Baseline is what Value is measured against, in BaselineUnit; a
	// ratio's Value is the baseline's time over the subject's.
	Baseline     float64 `json:"baseline"`
	BaselineUnit string  `json:"baseline_unit"`
	// Target is the goal, such as ">= 0.8", and OK whether Value meets
	// it; both are absent for figures without one.
	Target string `json:"target,omitempty"`
	OK     *bool  `json:"ok,omitempty"`
	// Detail says what was measured.
	Detail string `json:"detail"`
	// Skipped is why the figure was not measured.
	Skipped string `json:"skipped,omitempty"`
}

// Names are the figures of the suite, in the order Run reports them.
var Names = []string{
	"copy_vs_memmove", "copy_vs_memmove_runs", "generated_vs_interpreter",
	"plan_build_us_70b", "plan_build_auto_us_70b", "ops_direct_70b", "ops_auto_redis_70b",
	"reshard_vs_identity_mem", "gapped_vs_contiguous_mem", "reshard_gbps_file", "redis_vs_get", "redis_getrange_vs_get", "redis_vs_get_parts", "reshard_gbps_redis",
	"auto_regret_file", "auto_regret_redis", "checksum_cost", "checksum_cost_range", "checksum_cost_range_redis",
	"mooncake_vs_get_into", "mooncake_query_cost",
	"python_vs_go_read", "python_call_us",
}

// Options configure a run.
type Options struct {
	// Quick runs fewer pages and repetitions: about ten seconds on two
	// cores instead of a minute.
	Quick bool
	// Progress, when set, is called before each step and once at the end
	// (done == total).
	Progress func(done, total int, step string)
	// Redis starts a Redis server for the Redis figures and returns its
	// URL and how to stop it; an error skips those figures, with the error
	// as the reason. Nil means StartRedis.
	Redis func() (url string, stop func(), err error)
	// TempDir holds the file store (default: the system's).
	TempDir string
	// Steps, when set, runs only the steps of these names (Steps lists
	// them), and the steps they need.
	Steps []string
	// Python is the interpreter of the Python figures (default
	// DefaultPython) and Go the go command that builds libkvreshard for
	// them (default: go on the PATH); either missing, or an interpreter
	// without numpy, skips those figures with the reason. The Mooncake
	// figures need the same, Mooncake's wheel in the interpreter and
	// unshare (a loopback-only network namespace), else they are skipped.
	Python, Go string
}

// Steps are the steps of a run, in order.
var Steps = []string{"kernels", "plans", "pages", "memory store", "file store", "redis store", "python", "mooncake"}

// sizes are the run's repetitions and pages.
type sizes struct {
	reps   int // best of
	builds int // plan builds timed
	pages  int // pages written and read, file and Redis stores
	// memPages are the pages of the memory store: enough that the pages
	// read and the pool (2.5 MiB a page each) do not fit a cache.
	memPages int
}

func (o *Options) sizes() sizes {
	if o.Quick {
		return sizes{reps: 5, builds: 11, pages: 4, memPages: 16}
	}
	return sizes{reps: 7, builds: 51, pages: 12, memPages: 32}
}

// Run runs the suite and returns its figures in the order of Names.
func Run(ctx context.Context, o Options) ([]Figure, error) {
	if o.Redis == nil {
		o.Redis = StartRedis
	}
	c, err := newCase70(o.sizes())
	if err != nil {
		return nil, err
	}
	steps := []struct {
		name string
		run  func(ctx context.Context, o *Options) ([]Figure, error)
	}{
		{"kernels", c.kernels},
		{"plans", c.plans},
		{"pages", c.fill},
		{"memory store", c.memory},
		{"file store", c.file},
		{"redis store", c.redis},
		{"python", c.python},
		{"mooncake", c.mooncake},
	}
	if o.Steps != nil {
		keep := steps[:0]
		for _, s := range steps {
			if slices.Contains(o.Steps, s.name) || s.name == "pages" && needsPages(o.Steps) {
				keep = append(keep, s)
			}
		}
		steps = keep
	}
	var out []Figure
	for i, s := range steps {
		if o.Progress != nil {
			o.Progress(i, len(steps), s.name)
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		figs, err := s.run(ctx, &o)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.name, err)
		}
		out = append(out, figs...)
	}
	if o.Progress != nil {
		o.Progress(len(steps), len(steps), "done")
	}
	slices.SortStableFunc(out, func(a, b Figure) int { return slices.Index(Names, a.Name) - slices.Index(Names, b.Name) })
	return out, nil
}

// needsPages reports whether steps read pages.
func needsPages(steps []string) bool {
	for _, s := range steps {
		if strings.HasSuffix(s, " store") || s == "python" {
			return true
		}
	}
	return false
}

// best returns the fastest of reps timings of n calls of f, per call.
func best(reps, n int, f func() error) (time.Duration, error) {
	b := time.Duration(math.MaxInt64)
	for range reps {
		start := time.Now()
		for range n {
			if err := f(); err != nil {
				return 0, err
			}
		}
		b = min(b, time.Since(start)/time.Duration(n))
	}
	return b, nil
}

// pairwise times f and g in turns, reps times n calls each, and returns
// the best time per call of each and the median of the turns' ratios of
// g's time to f's: on a shared machine, turns see the same load.
func pairwise(reps, n int, f, g func()) (tf, tg time.Duration, ratio float64) {
	tf, tg = time.Duration(math.MaxInt64), time.Duration(math.MaxInt64)
	ratios := make([]float64, reps)
	f()
	g()
	for i := range ratios {
		start := time.Now()
		for range n {
			f()
		}
		mid := time.Now()
		for range n {
			g()
		}
		df, dg := mid.Sub(start), time.Since(mid)
		tf, tg = min(tf, df/time.Duration(n)), min(tg, dg/time.Duration(n))
		ratios[i] = float64(dg) / float64(max(df, 1))
	}
	slices.Sort(ratios)
	return tf, tg, ratios[reps/2]
}

// pairwiseErr is pairwise for calls that may fail: every turn runs, and
// err is the first error either call gave.
func pairwiseErr(reps, n int, f, g func() error) (tf, tg time.Duration, ratio float64, err error) {
	wrap := func(h func() error) func() {
		return func() {
			if e := h(); e != nil && err == nil {
				err = e
			}
		}
	}
	tf, tg, ratio = pairwise(reps, n, wrap(f), wrap(g))
	return tf, tg, ratio, err
}

// median returns the median of n timings of f.
func median(n int, f func() error) (time.Duration, error) {
	ts := make([]time.Duration, n)
	for i := range ts {
		start := time.Now()
		if err := f(); err != nil {
			return 0, err
		}
		ts[i] = time.Since(start)
	}
	slices.Sort(ts)
	return ts[n/2], nil
}

// atLeast returns a figure's target and verdict for value >= goal.
func atLeast(f *Figure, goal float64) {
	ok := f.Value >= goal
	f.Target, f.OK = fmt.Sprintf(">= %g", goal), &ok
}

// atMost returns a figure's target and verdict for value <= goal.
func atMost(f *Figure, goal float64) {
	ok := f.Value <= goal
	f.Target, f.OK = fmt.Sprintf("<= %g", goal), &ok
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

func gbps(bytes int, d time.Duration) float64 { return float64(bytes) / float64(d.Nanoseconds()) }

// round keeps 3 significant digits.
func round(x float64) float64 {
	if x == 0 || math.IsInf(x, 0) || math.IsNaN(x) {
		return x
	}
	p := math.Pow(10, 2-math.Floor(math.Log10(math.Abs(x))))
	return math.Round(x*p) / p
}
