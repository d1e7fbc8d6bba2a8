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
	"github.com/kvreshard/kvreshard/runtime/plan"
)

// newFlags returns a flag set that reports errors on stderr and through
// errFlags/errHelp.
func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("kvreshard "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errHelp
		}
		return errFlags
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	return nil
}

type planJSON struct {
	LayoutID string       `json:"layout_id"`
	Parts    []partJSON   `json:"parts"`
	Regions  []regionJSON `json:"regions"`
	Ops      []opJSON     `json:"ops"`
	OpCount  int          `json:"op_count"`
	Bytes    int          `json:"bytes"`
	Strategy string       `json:"strategy"`
	PlanNS   *timingJSON  `json:"plan_ns,omitempty"`
}

type partJSON struct {
	Index     int   `json:"index"`
	Layers    []int `json:"layers"`
	HeadStart int   `json:"head_start"`
	HeadCount int   `json:"head_count"`
	Bytes     int   `json:"bytes"`
}

type regionJSON struct {
	Name  string `json:"name"`
	Bytes int    `json:"bytes"`
}

type opJSON struct {
	Part   int    `json:"part"`
	Src    int    `json:"src"`
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
	custom, err := loadKVL(kvl)
	if err != nil {
		return nil, err
	}
	ms, err := parseModel(modelFlag)
	if err != nil {
		return nil, err
	}
	d := &ms.model.Descriptor
	src, err := parseTopo("--src", srcFlag, d, custom, false)
	if err != nil {
		return nil, err
	}
	dst, err := parseTopo("--dst", dstFlag, d, custom, true)
	if err != nil {
		return nil, err
	}
	if !dst.ranked {
		return nil, usagef("--dst: rank is required (rank=T/P, the TP rank then the PP rank)")
	}
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

func planCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("plan", stderr)
	model := fs.String("model", "", "the model: layers=12,kv-heads=4,head-dim=8,v-head-dim=8,dtype=fp32,page=16")
	src := fs.String("src", "", "the writer topology: tp=1,pp=3,layout=PLHD[,pp-layers=5/4/3]")
	dst := fs.String("dst", "", "the reader rank: tp=2,pp=2,rank=1/0,layout=page_first[,slots=N,slot=S]")
	kvl := fs.String("kvl", "", "comma-separated .kvl `files` with more layouts (run on the interpreter)")
	asJSON := fs.Bool("json", false, "print the plan as JSON")
	repeat := fs.Int("repeat", 0, "build the plan `N` times without the template cache and report the time")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *repeat < 0 {
		return usagef("--repeat %d is negative", *repeat)
	}
	s, err := setupPlan(*model, *src, *dst, *kvl, plan.Options{})
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

func (s *planSetup) planJSON(pl *plan.Plan, timing *timingJSON) *planJSON {
	g := s.planner.Geometry()
	out := &planJSON{LayoutID: pl.LayoutID, OpCount: len(pl.Ops), Bytes: pl.Bytes, Strategy: "direct", PlanNS: timing,
		Parts: []partJSON{}, Regions: []regionJSON{}, Ops: make([]opJSON, 0, len(pl.Ops))}
	for i, p := range s.man.Parts {
		out.Parts = append(out.Parts, partJSON{Index: i, Layers: p.Layers, HeadStart: p.HeadStart, HeadCount: p.HeadCount, Bytes: s.man.PartBytes(i)})
	}
	for i, n := range g.Regions {
		out.Regions = append(out.Regions, regionJSON{Name: g.RegionNames[i], Bytes: n})
	}
	for _, op := range s.planner.Instantiate(pl, s.dst.slot, nil) {
		out.Ops = append(out.Ops, opJSON{Part: int(op.Part), Src: op.Src, Region: g.RegionNames[op.Region], Dst: op.Dst, Len: op.Len})
	}
	return out
}

func (s *planSetup) printPlan(w io.Writer, pl *plan.Plan, out *planJSON) {
	src, dst := s.src, s.dst
	fmt.Fprintf(w, "reader   tp=%d pp=%d rank %d/%d, %s %s", dst.topo.TP, dst.topo.PP, dst.rank.TP, dst.rank.PP, dst.layout.Kind, dst.layout.Name)
	if dst.layout.Kind.String() == "pool" {
		fmt.Fprintf(w, " (slot %d of %d)", dst.slot, dst.slots)
	}
	g := s.planner.Geometry()
	fmt.Fprintf(w, ": layers %s, heads [%d,%d)\n", span(g.Layers), g.HeadStart, g.HeadStart+g.Heads)
	fmt.Fprintf(w, "source   tp=%d pp=%d, part %s { order %s }\n", src.topo.TP, src.topo.PP, src.layout.Name, src.layout.Order())
	fmt.Fprintf(w, "layout   %s\n", pl.LayoutID)
	for _, p := range out.Parts {
		fmt.Fprintf(w, "part %-3d layers %s, heads [%d,%d), %d bytes\n", p.Index, span(p.Layers), p.HeadStart, p.HeadStart+p.HeadCount, p.Bytes)
	}
	for _, r := range out.Regions {
		fmt.Fprintf(w, "region   %s, %d bytes\n", r.Name, r.Bytes)
	}
	kind := "compiled kernels"
	if pl.Interpreted {
		kind = "interpreter"
	}
	fmt.Fprintf(w, "plan     %d ops, %d bytes, strategy %s, %s\n", out.OpCount, out.Bytes, out.Strategy, kind)
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
		fmt.Fprintf(w, "%6d %10d %6s %10d %8d\n", op.Part, op.Src, op.Region, op.Dst, op.Len)
	}
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
