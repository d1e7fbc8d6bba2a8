package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"unicode"

	"github.com/kvreshard/kvreshard/compiler"
	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/dsl"
	"github.com/kvreshard/kvreshard/internal/spec"
	_ "github.com/kvreshard/kvreshard/layouts"
	"github.com/kvreshard/kvreshard/runtime/kernel"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
)

// usageError is a malformed flag: one message, exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// keyValues parses "a=1,b=2" into a map, rejecting unknown and repeated keys.
func keyValues(flag, s string, keys ...string) (map[string]string, error) {
	if s == "" {
		return nil, usagef("%s is required", flag)
	}
	if i := strings.IndexFunc(s, unicode.IsControl); i >= 0 {
		return nil, usagef("%s: %q has a control character at byte %d", flag, s, i)
	}
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || v == "" {
			return nil, usagef("%s: %q is not key=value", flag, kv)
		}
		known := false
		for _, x := range keys {
			known = known || x == k
		}
		if !known {
			return nil, usagef("%s: unknown key %q; keys are %s", flag, k, strings.Join(keys, ", "))
		}
		if _, dup := out[k]; dup {
			return nil, usagef("%s: key %q given twice", flag, k)
		}
		out[k] = v
	}
	return out, nil
}

func intValue(flag string, kv map[string]string, key string, def int, min int) (int, error) {
	v, ok := kv[key]
	if !ok {
		if def < min {
			return 0, usagef("%s: %s is required", flag, key)
		}
		return def, nil
	}
	n, ok := parseCount(v)
	if !ok || n < min {
		return 0, usagef("%s: %s=%s is not a whole number >= %d", flag, key, v, min)
	}
	return n, nil
}

// parseCount parses a count written the one way: decimal digits with no
// sign, space or leading zero, within int. strconv.Atoi alone would take
// "+12" and "012".
func parseCount(s string) (int, bool) {
	if s == "" || len(s) > 1 && s[0] == '0' {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}

// decimal is an int flag written in decimal, with a minus sign for a
// negative value: the flag package's own int flags also take "+5", "0x10"
// and "010" (which is 8).
type decimal int

func (d *decimal) String() string { return strconv.Itoa(int(*d)) }

func (d *decimal) Set(s string) error {
	n, ok := parseCount(strings.TrimPrefix(s, "-"))
	if !ok || s == "-0" {
		return errors.New("not a decimal whole number")
	}
	if strings.HasPrefix(s, "-") {
		n = -n
	}
	*d = decimal(n)
	return nil
}

// intFlag defines a decimal int flag.
func intFlag(fs *flag.FlagSet, name string, value int, usage string) *int {
	p := new(int)
	*p = value
	fs.Var((*decimal)(p), name, usage)
	return p
}

// plural returns n and noun, with an s unless n is 1: "1 page", "2 pages".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// checkPages returns a usage error when pages pages of pageBytes bytes
// each, the least a command holds in memory at once, do not fit in the
// memory this machine has available (where it is known), rather than let
// the allocation kill the process or push others out.
func (e env) checkPages(flag string, pages, pageBytes int) error {
	avail := e.memAvailable()
	if avail <= 0 || pages <= avail/max(pageBytes, 1) {
		return nil
	}
	verb := "do"
	if pages == 1 {
		verb = "does"
	}
	return usagef("%s %d: %s of %d bytes %s not fit in the %d bytes of memory available", flag, pages, plural(pages, "page"), pageBytes, verb, avail)
}

// availableMemory returns the bytes of memory available to a new
// allocation without swapping, from /proc/meminfo (Linux); 0 where it
// cannot tell.
func availableMemory() int {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	return memAvailable(string(b))
}

// memAvailable returns MemAvailable of a /proc/meminfo text in bytes, or
// 0 when it has none (kernels before 3.14). MemTotal is not what a new
// allocation can have: the page cache and other processes hold part of it.
func memAvailable(meminfo string) int {
	for _, line := range strings.Split(meminfo, "\n") {
		if v, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			kb, ok := parseCount(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if !ok || kb <= 0 || kb > math.MaxInt>>10 {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// modelSpec is a parsed --model flag.
type modelSpec struct {
	model manifest.Model
}

// parseModel parses
// layers=12,kv-heads=4,head-dim=8[,v-head-dim=8],dtype=fp32,page=16[,mla=1][,draft-layers=N][,name=..][,revision=..][,namespace=..][,fingerprint=..].
// draft-layers=N says that the last N of the layers are the draft layers of
// speculative decoding (MTP), which a page holds after the model's own; it
// enters the model domain.
func parseModel(s string) (*modelSpec, error) {
	const f = "--model"
	kv, err := keyValues(f, s, "layers", "kv-heads", "head-dim", "v-head-dim", "dtype", "page", "mla",
		"draft-layers", "name", "revision", "namespace", "fingerprint")
	if err != nil {
		return nil, err
	}
	m := spec.Model{Name: "model", Revision: "0", Namespace: "kvreshard"}
	for _, c := range []struct {
		key      string
		dst      *int
		def, min int
	}{
		{"layers", &m.Layers, -1, 1}, {"kv-heads", &m.KVHeads, -1, 1}, {"head-dim", &m.HeadDim, -1, 1},
		{"v-head-dim", &m.VHeadDim, 0, 1}, {"page", &m.Page, -1, 1}, {"draft-layers", &m.DraftLayers, 0, 0},
	} {
		if _, given := kv[c.key]; !given && c.def >= 0 {
			continue // 0: v-head-dim is head-dim, no draft layers
		}
		if *c.dst, err = intValue(f, kv, c.key, c.def, c.min); err != nil {
			return nil, err
		}
	}
	mla, err := intValue(f, kv, "mla", 0, 0)
	if err != nil || mla > 1 {
		return nil, usagef("%s: mla=%s is not 0 or 1", f, kv["mla"])
	}
	m.MLA = mla == 1
	m.Dtype = kv["dtype"]
	for key, dst := range map[string]*string{"name": &m.Name, "revision": &m.Revision, "namespace": &m.Namespace, "fingerprint": &m.Fingerprint} {
		if v, ok := kv[key]; ok {
			*dst = v
		}
	}
	mm, err := m.Build()
	var fe *spec.FieldError
	switch {
	case errors.As(err, &fe) && fe.Value == "":
		return nil, usagef("%s: %s %s", f, strings.ReplaceAll(fe.Field, "_", "-"), fe.Reason)
	case errors.As(err, &fe):
		return nil, usagef("%s: %s=%s %s", f, strings.ReplaceAll(fe.Field, "_", "-"), fe.Value, fe.Reason)
	case err != nil:
		return nil, usagef("%s: %v", f, err)
	}
	return &modelSpec{model: mm}, nil
}

// topoSpec is a parsed --src or --dst flag.
type topoSpec struct {
	topo   placement.Topology
	rank   placement.Rank
	ranked bool // rank= was given
	layout *ir.Layout
	pool   *ir.Layout // a writer's pool (pool=NAME, or poolFor(layout))
	slots  int
	slot   int
	placed bool // slots= or slot= was given
}

// parseTopo parses a writer's tp=2,pp=2,layout=NAME[,pp-layers=a/b/..][,pool=NAME]
// or a reader's tp=2,pp=2,rank=T/P[/C],layout=NAME[,pp-layers=..][,slots=N,slot=S],
// either with [,cp=N][,cp-interleave=I] (context parallelism; 1 and 1 by
// default).
func parseTopo(flag, s string, d *manifest.Descriptor, custom map[string]*ir.Layout, withRank bool) (*topoSpec, error) {
	keys := []string{"tp", "pp", "layout", "pp-layers", "cp", "cp-interleave"}
	if withRank {
		keys = append(keys, "rank", "slots", "slot")
	} else {
		keys = append(keys, "pool")
	}
	kv, err := keyValues(flag, s, keys...)
	if err != nil {
		return nil, err
	}
	t := &topoSpec{}
	if t.topo.TP, err = intValue(flag, kv, "tp", 1, 1); err != nil {
		return nil, err
	}
	if t.topo.PP, err = intValue(flag, kv, "pp", 1, 1); err != nil {
		return nil, err
	}
	if t.topo.CP, err = intValue(flag, kv, "cp", 1, 1); err != nil {
		return nil, err
	}
	if t.topo.Interleave, err = intValue(flag, kv, "cp-interleave", 1, 1); err != nil {
		return nil, err
	}
	if v, ok := kv["pp-layers"]; ok {
		for _, x := range strings.Split(v, "/") {
			n, ok := parseCount(x)
			if !ok || n < 1 {
				return nil, usagef("%s: pp-layers=%s is not a list of positive layer counts like 5/4/3", flag, v)
			}
			t.topo.PPLayers = append(t.topo.PPLayers, n)
		}
	}
	if err := t.topo.Validate(d); err != nil {
		return nil, usagef("%s: %v", flag, err)
	}
	if v, ok := kv["rank"]; ok {
		if t.rank, err = parseRank(flag+": rank="+v, v, t.topo); err != nil {
			return nil, err
		}
		t.ranked = true
	}
	name := kv["layout"]
	if name == "" {
		return nil, usagef("%s: layout is required (%s)", flag, strings.Join(layoutNames(custom), ", "))
	}
	if t.layout = custom[name]; t.layout == nil {
		if t.layout, err = kernel.LayoutNamed(name); err != nil {
			return nil, usagef("%s: unknown layout %q; layouts are %s", flag, name, strings.Join(layoutNames(custom), ", "))
		}
	}
	if !withRank {
		if t.layout.Kind != ir.Part {
			return nil, usagef("%s: layout %s is a pool layout; pages are stored in part layouts (name the writer's pool with pool=)", flag, name)
		}
		t.pool = poolFor(t.layout)
		if pn, ok := kv["pool"]; ok {
			if t.pool = custom[pn]; t.pool == nil {
				if t.pool, err = kernel.LayoutNamed(pn); err != nil {
					return nil, usagef("%s: unknown pool layout %q; layouts are %s", flag, pn, strings.Join(layoutNames(custom), ", "))
				}
			}
			if t.pool.Kind != ir.Pool {
				return nil, usagef("%s: pool=%s is a part layout; the writer's pool needs a pool layout", flag, pn)
			}
		}
	}
	if t.slots, err = intValue(flag, kv, "slots", 1, 1); err != nil {
		return nil, err
	}
	if t.slot, err = intValue(flag, kv, "slot", 0, 0); err != nil {
		return nil, err
	}
	t.placed = kv["slots"] != "" || kv["slot"] != ""
	if t.layout.Kind == ir.Part && t.placed {
		return nil, usagef("%s: slots and slot are for pool layouts; %s is a part layout (one page)", flag, name)
	}
	if t.slot >= t.slots {
		return nil, usagef("%s: slot=%d is outside slots=%d", flag, t.slot, t.slots)
	}
	return t, nil
}

// parseRank parses T/P or T/P/C, the TP rank, the PP rank and the CP rank
// (0 when left out), of topology t; label names the flag in errors.
func parseRank(label, v string, t placement.Topology) (placement.Rank, error) {
	fields := strings.Split(v, "/")
	var n [3]int
	ok := len(fields) == 2 || len(fields) == 3
	for i := 0; ok && i < len(fields); i++ {
		n[i], ok = parseCount(fields[i])
	}
	if !ok {
		return placement.Rank{}, usagef("%s is not TP/PP ranks like 1/0, or TP/PP/CP ranks like 1/0/1", label)
	}
	cp := max(t.CP, 1)
	if n[0] >= t.TP || n[1] >= t.PP || n[2] >= cp {
		if len(fields) == 2 && cp == 1 {
			return placement.Rank{}, usagef("%s is outside tp=%d x pp=%d", label, t.TP, t.PP)
		}
		return placement.Rank{}, usagef("%s is outside tp=%d x pp=%d x cp=%d", label, t.TP, t.PP, cp)
	}
	return placement.Rank{TP: n[0], PP: n[1], CP: n[2]}, nil
}

// rankName prints rank r of topology t as its flags take it: T/P, or
// T/P/C under context parallelism.
func rankName(t placement.Topology, r placement.Rank) string {
	if t.CP > 1 {
		return fmt.Sprintf("%d/%d/%d", r.TP, r.PP, r.CP)
	}
	return fmt.Sprintf("%d/%d", r.TP, r.PP)
}

func layoutNames(custom map[string]*ir.Layout) []string {
	names := kernel.LayoutNames()
	var extra []string
	for n := range custom {
		extra = append(extra, n)
	}
	sort.Strings(extra)
	return append(names, extra...)
}

// maxKVLBytes bounds a .kvl file: a layout takes a line or two.
const maxKVLBytes = 1 << 20

// readKVL reads a .kvl file: a regular file of at most maxKVLBytes (not a
// FIFO that would block, nor /dev/zero).
func readKVL(name string) ([]byte, error) {
	fi, err := os.Stat(name)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", name)
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	text, err := io.ReadAll(io.LimitReader(f, maxKVLBytes+1))
	if err != nil {
		return nil, err
	}
	if len(text) > maxKVLBytes {
		return nil, fmt.Errorf("%s is more than %d bytes", name, maxKVLBytes)
	}
	return text, nil
}

// loadKVL reads custom layouts from .kvl files named by a comma-separated
// list; their pairs with other layouts run on the interpreter.
func loadKVL(list string) (map[string]*ir.Layout, error) {
	out := map[string]*ir.Layout{}
	if list == "" {
		return out, nil
	}
	var srcs []compiler.Source
	for _, name := range strings.Split(list, ",") {
		text, err := readKVL(name)
		if err != nil {
			return nil, usagef("--kvl: %v", err)
		}
		srcs = append(srcs, compiler.Source{Name: name, Text: text})
	}
	f, err := compiler.CompileAll(srcs...)
	if err != nil {
		return nil, usagef("--kvl: %s", capErrors(err))
	}
	for _, l := range f.Layouts {
		if _, err := kernel.LayoutNamed(l.Name); err == nil {
			return nil, usagef("--kvl: layout %s (%s) has the name of a built-in layout", l.Name, l.Pos)
		}
		out[l.Name] = l
	}
	return out, nil
}

// maxKVLErrors caps the errors printed for bad .kvl files, as kvlc does.
const maxKVLErrors = 20

// capErrors returns the text of a compile error, one error a line, with
// at most maxKVLErrors of them and a count of the rest.
func capErrors(err error) string {
	var list dsl.ErrorList
	if !errors.As(err, &list) || len(list) <= maxKVLErrors {
		return err.Error()
	}
	return list[:maxKVLErrors].Error() + fmt.Sprintf("\nand %d more errors", len(list)-maxKVLErrors)
}

// topoFlag is one topology flag to parse: a writer's (--src) or a reader
// rank's (--dst, which must name its rank).
type topoFlag struct {
	name, value string
	reader      bool
}

// parseSpecs parses --kvl, --model and topology flags, in that order.
func parseSpecs(kvl, model string, flags ...topoFlag) (*modelSpec, []*topoSpec, error) {
	custom, err := loadKVL(kvl)
	if err != nil {
		return nil, nil, err
	}
	ms, err := parseModel(model)
	if err != nil {
		return nil, nil, err
	}
	var out []*topoSpec
	for _, f := range flags {
		ts, err := parseTopo(f.name, f.value, &ms.model.Descriptor, custom, f.reader)
		if err != nil {
			return nil, nil, err
		}
		if f.reader && !ts.ranked {
			return nil, nil, usagef("%s: rank is required (rank=T/P or T/P/C: the TP rank, the PP rank, then the CP rank)", f.name)
		}
		out = append(out, ts)
	}
	return ms, out, nil
}

// binding returns the binding of a ranked topology spec.
func (t *topoSpec) binding(d *manifest.Descriptor) (plan.Binding, error) {
	return plan.BindingFor(d, t.topo, t.rank, t.layout, t.slots)
}
