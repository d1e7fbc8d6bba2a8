package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/kvreshard/kvreshard/runtime/bench"
)

func benchCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench", stderr)
	quick := fs.Bool("quick", false, "fewer pages and repetitions (about ten seconds)")
	asJSON := fs.Bool("json", false, `print {"machine":{...},"figures":[...]} instead of the table`)
	calibrate := fs.Bool("calibrate", false, "measure the cost model of each store instead (op cost, segment cost, bandwidth)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	ctx := context.Background()
	if *calibrate {
		return calibrateCmd(ctx, stdout)
	}
	figs, err := bench.Run(ctx, bench.Options{Quick: *quick, Progress: progress(stderr)})
	if err != nil {
		return err
	}
	m := bench.ThisMachine()
	if *asJSON {
		return json.NewEncoder(stdout).Encode(struct {
			Machine bench.Machine  `json:"machine"`
			Figures []bench.Figure `json:"figures"`
		}{m, figs})
	}
	fmt.Fprintf(stdout, "machine: %s\n\n", m)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tvalue\tbaseline\ttarget\t")
	for _, f := range figs {
		if f.Skipped != "" {
			fmt.Fprintf(tw, "%s\tskipped\t\t%s\t%s\n", f.Name, f.Target, f.Skipped)
			continue
		}
		verdict := ""
		if f.OK != nil {
			verdict = "ok"
			if !*f.OK {
				verdict = "MISSED"
			}
		}
		fmt.Fprintf(tw, "%s\t%g %s\t%g %s\t%s\t%s\n", f.Name, f.Value, f.Unit, f.Baseline, f.BaselineUnit, f.Target, verdict)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	for _, f := range figs {
		if f.Detail != "" {
			fmt.Fprintf(stdout, "%s: %s\n", f.Name, f.Detail)
		}
	}
	return nil
}

// progress reports the suite's steps on w: a bar redrawn in place on a
// terminal, one plain line a step otherwise (a log, a pipe). A few lines
// of our own do this; a progress-bar library would add a dependency for
// six steps.
func progress(w io.Writer) func(done, total int, step string) {
	tty := false
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil {
			tty = fi.Mode()&os.ModeCharDevice != 0
		}
	}
	return func(done, total int, step string) {
		if !tty {
			fmt.Fprintf(w, "bench: %d/%d %s\n", done, total, step)
			return
		}
		const width = 24
		n := done * width / total
		fmt.Fprintf(w, "\r\033[K[%s%s] %d/%d %s", strings.Repeat("=", n), strings.Repeat(" ", width-n), done, total, step)
		if done == total {
			fmt.Fprintln(w)
		}
	}
}

// calibrateCmd measures the cost model of the memory, file and Redis
// stores, whose figures are the defaults of runtime/plan/cost.go.
func calibrateCmd(ctx context.Context, stdout io.Writer) error {
	for _, name := range []string{"memory", "file", "redis"} {
		c, err := bench.Calibrate(ctx, name, nil)
		if err != nil {
			fmt.Fprintf(stdout, "%-7s %v\n", name, err)
			continue
		}
		fmt.Fprintf(stdout, "%-7s %s\n", name, c)
	}
	return nil
}
