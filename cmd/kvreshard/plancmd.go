package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
)

// newFlags returns a flag set whose -h prints its flags on stderr.
func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("kvreshard "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parseFlags parses args: -h prints the flags and returns errHelp; a flag
// that does not parse is one usage error (the flag package would print
// the whole usage after it).
func parseFlags(fs *flag.FlagSet, args []string) error {
	out, usage := fs.Output(), fs.Usage
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.SetOutput(out)
	fs.Usage = usage
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.Usage()
			return errHelp
		}
		return usagef("%v", err)
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	return nil
}

// planJSON is what plan --json prints. ops lists the transport operations
// of the chosen strategy, and op_count counts them: for direct, one run
// each; for scatter, one read each, with region and dst those of its first
// segment and dsts every segment; for staged, the staging reads, with
// region "stage", dst the offset in the staging buffer and round the
// staging round, while staging.copies says how their bytes reach the pool.
type planJSON struct {
	ManifestID  string           `json:"manifest_id"`
	Parts       []partJSON       `json:"parts"`
	Regions     []regionJSON     `json:"regions"`
	Ops         []opJSON         `json:"ops"`
	OpCount     int              `json:"op_count"`
	Bytes       int              `json:"bytes"`
	ReadBytes   int              `json:"read_bytes"`
	Strategy    string           `json:"strategy"`
	Transport   string           `json:"transport"`
	EstimatedNS int64            `json:"estimated_ns"`
	Estimates   map[string]int64 `json:"estimates_ns,omitempty"`
	Staging     *stagingJSON     `json:"staging,omitempty"`
	PlanNS      *timingJSON      `json:"plan_ns,omitempty"`
}

// stagingJSON describes a staged plan: its staging bound, the bytes of
// its largest round, its rounds, and its copy steps in order (those of a
// round run after all its reads).
type stagingJSON struct {
	Bound  int        `json:"bound"`
	Bytes  int        `json:"bytes"`
	Rounds int        `json:"rounds"`
	Copies []copyJSON `json:"copies"`
}

// copyJSON is one copy step out of the staging buffer: the run of Len
// bytes at offset Src of part Part, staged by read Read at offset Stage of
// its round's staging buffer, goes to offset Dst of region Region. Kernel
// names the layout pair whose generated copy kernel moves the runs of a
// read that holds its whole part; the steps still list each run, so that
// the plan can be checked without the kernel.
type copyJSON struct {
	Read   int    `json:"read"`
	Part   int    `json:"part"`
	Src    int    `json:"src"`
	Stage  int    `json:"stage"`
	Region string `json:"region"`
	Dst    int    `json:"dst"`
	Len    int    `json:"len"`
	Kernel string `json:"kernel,omitempty"`
}

// partJSON is one part of the manifest: its layers, heads and token set
// (cp_size, cp_rank and interleave: 1, 0 and 1 without context
// parallelism), and its bytes.
type partJSON struct {
	Index      int   `json:"index"`
	Layers     []int `json:"layers"`
	HeadStart  int   `json:"head_start"`
	HeadCount  int   `json:"head_count"`
	CPSize     int   `json:"cp_size"`
	CPRank     int   `json:"cp_rank"`
	Interleave int   `json:"interleave"`
	Bytes      int   `json:"bytes"`
}

type regionJSON struct {
	Name  string `json:"name"`
	Bytes int    `json:"bytes"`
}

type opJSON struct {
	Part   int       `json:"part"`
	Src    int       `json:"src"`
	Region string    `json:"region"`
	Dst    int       `json:"dst"`
	Len    int       `json:"len"`
	Round  *int      `json:"round,omitempty"`
	Dsts   []segJSON `json:"dsts,omitempty"`
}

// segJSON is one destination segment of a scatter read.
type segJSON struct {
	Region string `json:"region"`
	Dst    int    `json:"dst"`
	Len    int    `json:"len"`
}

type timingJSON struct {
	Median int64 `json:"median"`
	Min    int64 `json:"min"`
}

// planSetup is what plan, read and write share: the model, the manifest the
// source topology writes, and the reader's planner.
type planSetup struct {
	model   *modelSpec
	src     *topoSpec
	dst     *topoSpec
	man     *manifest.Manifest
	planner *plan.Planner
}

func setupPlan(modelFlag, srcFlag, dstFlag, kvl string, opts plan.Options) (*planSetup, error) {
	ms, ts, err := parseSpecs(kvl, modelFlag, topoFlag{"--src", srcFlag, false}, topoFlag{"--dst", dstFlag, true})
	if err != nil {
		return nil, err
	}
	d := &ms.model.Descriptor
	src, dst := ts[0], ts[1]
	s := &planSetup{model: ms, src: src, dst: dst}
	if s.man, err = plan.ManifestFor(ms.model.Domain(), d, src.topo, src.layout); err != nil {
		return nil, usagef("--src: %v", err)
	}
	b, err := dst.binding(d)
	if err != nil {
		return nil, usagef("--dst: %v", err)
	}
	if s.planner, err = plan.NewPlanner(d, b, opts); err != nil {
		return nil, usagef("--dst: %v", err)
	}
	return s, nil
}

func planCmd(_ env, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("plan", stderr)
	model := fs.String("model", "", "the model: layers=12,kv-heads=4,head-dim=8,v-head-dim=8,dtype=fp32,page=16")
	src := fs.String("src", "", "the writer topology: tp=1,pp=3,layout=PLHD[,pp-layers=5/4/3][,cp=2,cp-interleave=1]")
	dst := fs.String("dst", "", "the reader rank: tp=2,pp=2,rank=1/0,layout=page_first[,slots=N,slot=S][,cp=2,cp-interleave=1,rank=1/0/1]")
	kvl := fs.String("kvl", "", "comma-separated .kvl `files` with more layouts (run on the interpreter)")
	asJSON := fs.Bool("json", false, "print the plan as JSON")
	repeat := intFlag(fs, "repeat", 0, "build the plan `N` times without the template cache and report the time")
	strategy := fs.String("strategy", "direct", "`direct`, scatter, staged, or auto (the transport's cost model chooses)")
	costs := fs.String("costs", "", "cost models `file` from bench --calibrate --out (default: the configured ones)")
	transport := fs.String("transport", "memory", "the cost model: `memory`, file, redis or rdma")
	segments := intFlag(fs, "max-segments", 0, "bound `N` of a scatter read's segments (0: the transport's default)")
	stage := intFlag(fs, "stage-bytes", 0, "bound of a staged plan's staging memory in `bytes` (0: 16 MiB)")
	gap := intFlag(fs, "max-gap", 0, "largest unneeded gap, in `bytes`, a staged read bridges (0: the transport's break-even gap; -1: none)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *repeat < 0 || *repeat > maxRepeat {
		return usagef("--repeat %d: give 0 to %d builds", *repeat, maxRepeat)
	}
	opts, err := strategyOptions(*strategy, *transport, *segments, *stage, *gap)
	if err != nil {
		return err
	}
	if err := applyCosts(&opts, *costs); err != nil {
		return err
	}
	s, err := setupPlan(*model, *src, *dst, *kvl, opts)
	if err != nil {
		return err
	}
	pl, err := s.planner.Build(s.man)
	if err != nil {
		return err
	}
	var timing *timingJSON
	if *repeat > 0 {
		times := make([]int64, *repeat)
		for i := range times {
			start := time.Now()
			if _, err := s.planner.Build(s.man); err != nil {
				return err
			}
			times[i] = time.Since(start).Nanoseconds()
		}
		slices.Sort(times)
		timing = &timingJSON{Median: times[len(times)/2], Min: times[0]}
	}
	out := s.planJSON(pl, timing)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		return enc.Encode(out)
	}
	s.printPlan(stdout, pl, out)
	return nil
}

// maxRepeat bounds plan --repeat: a million builds of the 70B case take
// minutes, and their times are kept.
const maxRepeat = 1000000

// strategyOptions returns the planner options of the strategy flags.
func strategyOptions(strategy, transport string, segments, stage, gap int) (plan.Options, error) {
	var o plan.Options
	var err error
	if o.Strategy, err = plan.ParseStrategy(strategy); err != nil {
		return o, usagef("--strategy: %v", err)
	}
	t, err := plan.TransportNamed(transport)
	if err != nil {
		return o, usagef("--transport: %v", err)
	}
	o.Transport = &t
	switch {
	case segments < 0 || segments > t.SegmentLimit:
		return o, usagef("--max-segments %d: transport %s takes 1 to %d segments a read", segments, t.Name, t.SegmentLimit)
	case stage < 0:
		return o, usagef("--stage-bytes %d is negative", stage)
	case gap < -1:
		return o, usagef("--max-gap %d: give a byte count, 0 for the transport's break-even gap, or -1 for none", gap)
	}
	o.MaxSegments, o.StageBytes, o.MaxGap = segments, stage, gap
	return o, nil
}

func (s *planSetup) planJSON(pl *plan.Plan, timing *timingJSON) *planJSON {
	g := s.planner.Geometry()
	opts := s.planner.Options()
	out := &planJSON{ManifestID: pl.ManifestID, OpCount: pl.OpCount(), Bytes: pl.Bytes, ReadBytes: pl.ReadBytes,
		Strategy: pl.Strategy.String(), Transport: opts.Transport.Name, EstimatedNS: pl.Estimate.Nanoseconds(), PlanNS: timing,
		Parts: []partJSON{}, Regions: []regionJSON{}, Ops: make([]opJSON, 0, pl.OpCount())}
	if opts.Strategy == plan.Auto {
		out.Estimates = map[string]int64{}
		for st, e := range pl.Estimates {
			if e > 0 {
				out.Estimates[plan.Strategy(st).String()] = e.Nanoseconds()
			}
		}
	}
	for i, p := range s.man.Parts {
		out.Parts = append(out.Parts, partJSON{Index: i, Layers: p.Layers, HeadStart: p.HeadStart, HeadCount: p.HeadCount,
			CPSize: p.CPSize, CPRank: p.CPRank, Interleave: p.Interleave, Bytes: s.man.PartBytes(i)})
	}
	for i, n := range g.Regions {
		out.Regions = append(out.Regions, regionJSON{Name: g.RegionNames[i], Bytes: n})
	}
	ops := s.planner.Instantiate(pl, s.dst.slot, nil)
	switch pl.Strategy {
	case plan.Direct:
		for _, op := range ops {
			out.Ops = append(out.Ops, opJSON{Part: int(op.Part), Src: op.Src, Region: g.RegionNames[op.Region], Dst: op.Dst, Len: op.Len})
		}
	case plan.Scatter:
		for _, r := range pl.Reads {
			segs := ops[r.First : r.First+r.N]
			o := opJSON{Part: int(r.Part), Src: r.Src, Region: g.RegionNames[segs[0].Region], Dst: segs[0].Dst, Len: r.Len}
			for _, op := range segs {
				o.Dsts = append(o.Dsts, segJSON{Region: g.RegionNames[op.Region], Dst: op.Dst, Len: op.Len})
			}
			out.Ops = append(out.Ops, o)
		}
	case plan.Staged:
		st := &stagingJSON{Bound: opts.StageBytes, Bytes: pl.StageBytes, Rounds: pl.Rounds, Copies: []copyJSON{}}
		for i, r := range pl.Reads {
			round := r.Round
			out.Ops = append(out.Ops, opJSON{Part: int(r.Part), Src: r.Src, Region: "stage", Dst: r.Stage, Len: r.Len, Round: &round})
			kernel := ""
			if r.Kernel {
				kernel = pl.CopyKernel(int(r.Part))
			}
			for _, op := range ops[r.First : r.First+r.N] {
				st.Copies = append(st.Copies, copyJSON{Read: i, Part: int(op.Part), Src: op.Src, Stage: r.Stage + op.Src - r.Src,
					Region: g.RegionNames[op.Region], Dst: op.Dst, Len: op.Len, Kernel: kernel})
			}
		}
		out.Staging = st
	}
	return out
}

func (s *planSetup) printPlan(w io.Writer, pl *plan.Plan, out *planJSON) {
	src, dst := s.src, s.dst
	fmt.Fprintf(w, "reader   tp=%d pp=%d%s rank %s, %s %s", dst.topo.TP, dst.topo.PP, cpText(dst.topo), rankName(dst.topo, dst.rank), dst.layout.Kind, dst.layout.Name)
	if dst.layout.Kind.String() == "pool" {
		fmt.Fprintf(w, " (slot %d of %d)", dst.slot, dst.slots)
	}
	g := s.planner.Geometry()
	fmt.Fprintf(w, ": layers %s, heads [%d,%d)%s\n", span(g.Layers), g.HeadStart, g.HeadStart+g.Heads, tokensText(g.Tokens.CPSize, g.Tokens.CPRank))
	fmt.Fprintf(w, "source   tp=%d pp=%d%s, part %s { order %s }\n", src.topo.TP, src.topo.PP, cpText(src.topo), src.layout.Name, src.layout.Order())
	fmt.Fprintf(w, "manifest %s\n", pl.ManifestID)
	for _, p := range out.Parts {
		fmt.Fprintf(w, "part %-3d layers %s, heads [%d,%d)%s, %d bytes\n", p.Index, span(p.Layers), p.HeadStart, p.HeadStart+p.HeadCount,
			tokensText(p.CPSize, p.CPRank), p.Bytes)
	}
	for _, r := range out.Regions {
		fmt.Fprintf(w, "region   %s, %d bytes\n", r.Name, r.Bytes)
	}
	kind := "compiled kernels"
	switch {
	case pl.Interpreted:
		kind = "interpreter"
	case pl.TokenLists:
		kind = "compiled kernels with token lists"
	}
	fmt.Fprintf(w, "plan     %d ops, %d bytes, strategy %s, %s\n", out.OpCount, out.Bytes, out.Strategy, kind)
	fmt.Fprintf(w, "cost     transport %s, estimated %s", out.Transport, time.Duration(out.EstimatedNS))
	if out.Estimates != nil {
		for _, st := range []string{"direct", "scatter", "staged"} {
			if e, ok := out.Estimates[st]; ok {
				fmt.Fprintf(w, "; %s %s", st, time.Duration(e))
			}
		}
	}
	fmt.Fprintln(w)
	if st := out.Staging; st != nil {
		fmt.Fprintf(w, "staging  %d reads of %d bytes in %d rounds of at most %d bytes (bound %d), %d copy steps\n",
			len(out.Ops), out.ReadBytes, st.Rounds, st.Bytes, st.Bound, len(st.Copies))
	}
	if out.PlanNS != nil {
		fmt.Fprintf(w, "timing   median %s, min %s per plan\n", time.Duration(out.PlanNS.Median), time.Duration(out.PlanNS.Min))
	}
	const show = 16
	fmt.Fprintf(w, "\n%6s %10s %6s %10s %8s\n", "part", "src", "region", "dst", "len")
	for i, op := range out.Ops {
		if i == show {
			fmt.Fprintf(w, "... %d more ops (--json prints all)\n", len(out.Ops)-show)
			break
		}
		fmt.Fprintf(w, "%6d %10d %6s %10d %8d", op.Part, op.Src, op.Region, op.Dst, op.Len)
		switch {
		case op.Round != nil:
			fmt.Fprintf(w, "  round %d", *op.Round)
		case len(op.Dsts) > 1:
			fmt.Fprintf(w, "  %d segments", len(op.Dsts))
		}
		fmt.Fprintln(w)
	}
}

// cpText prints a topology's context parallelism, "" without it.
func cpText(t placement.Topology) string {
	if t.CP <= 1 {
		return ""
	}
	return fmt.Sprintf(" cp=%d cp-interleave=%d", t.CP, max(t.Interleave, 1))
}

// tokensText prints which CP rank's tokens a part or binding holds, ""
// for every token.
func tokensText(cpSize, cpRank int) string {
	if cpSize <= 1 {
		return ""
	}
	return fmt.Sprintf(", tokens of cp rank %d of %d", cpRank, cpSize)
}

// span prints a layer list compactly: 0-3,5,7-9.
func span(ls []int) string {
	s := ""
	for i := 0; i < len(ls); {
		j := i
		for j+1 < len(ls) && ls[j+1] == ls[j]+1 {
			j++
		}
		if s != "" {
			s += ","
		}
		if j > i {
			s += fmt.Sprintf("%d-%d", ls[i], ls[j])
		} else {
			s += fmt.Sprint(ls[i])
		}
		i = j + 1
	}
	return s
}
