package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvreshard/kvreshard/cmd/kvreshard/internal/bench"
	"github.com/kvreshard/kvreshard/runtime/plan"
)

func benchCmd(_ env, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench", stderr)
	quick := fs.Bool("quick", false, "fewer pages and repetitions (about ten seconds)")
	asJSON := fs.Bool("json", false, `print {"machine":{...},"figures":[...]} instead of the table`)
	calibrate := fs.Bool("calibrate", false, "measure the cost model of each store instead (op and segment costs, bandwidth, copy speed)")
	out := fs.String("out", "", "with --calibrate: write the measured cost models to this `file`, for --costs of plan, read and demo")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case *out != "" && !*calibrate:
		return usagef("--out is for --calibrate")
	case *quick && *calibrate:
		return usagef("--quick is for the figures, not --calibrate")
	}
	ctx := context.Background()
	if *calibrate {
		return calibrateCmd(ctx, stdout, *out, *asJSON)
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
// stores (the defaults of runtime/plan/cost.go were measured so), prints
// the measurements, or with asJSON the costs file, and writes the costs
// file to out when set. A store that cannot be measured (no redis-server)
// is reported and left out: its default stays.
func calibrateCmd(ctx context.Context, stdout io.Writer, out string, asJSON bool) error {
	f := plan.CostsFile{Measured: fmt.Sprintf("kvreshard bench --calibrate at %s on %s", time.Now().UTC().Format(time.RFC3339), bench.ThisMachine()),
		Transports: map[string]plan.TransportCosts{}}
	var names []string
	for _, name := range []string{"memory", "file", "redis"} {
		c, err := bench.Calibrate(ctx, name, nil)
		if err == nil {
			var t plan.Transport
			if t, err = c.Transport(); err == nil {
				f.Transports[name] = t.Costs()
				names = append(names, name)
			}
		}
		if asJSON {
			continue
		}
		if err != nil {
			fmt.Fprintf(stdout, "%-7s %v\n", name, err)
			continue
		}
		fmt.Fprintf(stdout, "%-7s %s\n", name, c)
	}
	if len(names) == 0 {
		return errors.New("no store could be measured")
	}
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	if asJSON {
		if _, err := stdout.Write(data); err != nil {
			return err
		}
	}
	if out == "" {
		return nil
	}
	if err := writeFileAtomic(out, data); err != nil {
		return err
	}
	if !asJSON {
		fmt.Fprintf(stdout, "wrote the cost models of %s to %s (load them with --costs %s)\n", strings.Join(names, ", "), out, out)
	}
	return nil
}

// writeFileAtomic writes data to a temporary file next to path and renames
// it over path: a reader never sees half a file.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	_, err = tmp.Write(data)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}

// applyCosts gives planner options the cost model of their transport
// from a costs file (--costs of plan, read and demo; bench --calibrate
// --out writes one); without a file the options keep the default. A file
// that cannot be read or parsed, or a --max-segments over the file's
// segment limit, is a usage error that names the file and the field.
func applyCosts(o *plan.Options, path string) error {
	if path == "" {
		return nil
	}
	ts, err := plan.LoadTransports(path)
	if err != nil {
		return usagef("--costs: %v", err)
	}
	name := "memory"
	if o.Transport != nil {
		name = o.Transport.Name
	}
	t, err := ts.Named(name)
	if err != nil {
		return usagef("--costs: %v", err)
	}
	if o.MaxSegments > t.SegmentLimit {
		return usagef("--max-segments %d: transport %s takes 1 to %d segments a read (--costs %s)", o.MaxSegments, t.Name, t.SegmentLimit, path)
	}
	o.Transport = &t
	return nil
}
