package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/internal/content"
	_ "github.com/kvreshard/kvreshard/layouts"
	"github.com/kvreshard/kvreshard/runtime/kernel"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/store"
)

// runArgs runs the command line args on this machine and returns its
// exit code, stdout and stderr.
func runArgs(args ...string) (int, string, string) {
	return runIn(hostEnv, args...)
}

// runIn runs the command line args in e and returns its exit code, stdout
// and stderr.
func runIn(e env, args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := run(e, args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// wrapStores is this machine with every store it opens wrapped by wrap.
func wrapStores(wrap func(store.Store) store.Store) env {
	e := hostEnv
	e.open = func(ctx context.Context, u string) (store.Store, error) {
		st, err := store.Open(ctx, u)
		if err != nil {
			return nil, err
		}
		return wrap(st), nil
	}
	return e
}

// keysOf returns the keys of a JSON object.
func keysOf(t *testing.T, raw json.RawMessage) []string {
	t.Helper()
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(raw, &m), string(raw))
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

const planModel = "layers=12,kv-heads=4,head-dim=8,v-head-dim=8,dtype=fp32,page=16"

// plan --json prints every field issue 3 lists, and its ops move exactly
// the reader's share of the page: applied to parts filled with the page's
// content, they give a pool that verifies.
func TestPlanJSON(t *testing.T) {
	code, stdout, stderr := runArgs("plan", "--model", planModel, "--src", "tp=1,pp=3,layout=PLHD",
		"--dst", "tp=2,pp=2,rank=1/0,layout=page_first,slots=3,slot=2", "--json", "--repeat", "3")
	require.Equal(t, 0, code, stderr)
	require.Empty(t, stderr)
	require.Equal(t, 1, strings.Count(stdout, "\n"), "one line of JSON")

	var top map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(stdout), &top))
	for _, k := range []string{"manifest_id", "parts", "regions", "ops", "op_count", "bytes", "strategy", "plan_ns"} {
		require.Contains(t, top, k)
	}
	var raw struct {
		Parts   []json.RawMessage `json:"parts"`
		Regions []json.RawMessage `json:"regions"`
		Ops     []json.RawMessage `json:"ops"`
		PlanNS  json.RawMessage   `json:"plan_ns"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &raw))
	require.NotEmpty(t, raw.Ops)
	for _, p := range raw.Parts {
		require.Subset(t, keysOf(t, p), []string{"index", "layers", "head_start", "head_count", "cp_size", "cp_rank", "interleave", "bytes"})
	}
	for _, r := range raw.Regions {
		require.Subset(t, keysOf(t, r), []string{"name", "bytes"})
	}
	for _, o := range raw.Ops {
		require.Subset(t, keysOf(t, o), []string{"part", "src", "region", "dst", "len"})
	}
	require.Subset(t, keysOf(t, raw.PlanNS), []string{"median", "min"})

	var out planJSON
	require.NoError(t, json.Unmarshal([]byte(stdout), &out))
	require.Regexp(t, `^sha256:[0-9a-f]{64}$`, out.ManifestID)
	// TP1/PP3 parts: 4 layers x 4 heads x 16 tokens x (8+8) x 4 bytes.
	require.Equal(t, []partJSON{
		{Index: 0, Layers: []int{0, 1, 2, 3}, HeadStart: 0, HeadCount: 4, CPSize: 1, Interleave: 1, Bytes: 16384},
		{Index: 1, Layers: []int{4, 5, 6, 7}, HeadStart: 0, HeadCount: 4, CPSize: 1, Interleave: 1, Bytes: 16384},
		{Index: 2, Layers: []int{8, 9, 10, 11}, HeadStart: 0, HeadCount: 4, CPSize: 1, Interleave: 1, Bytes: 16384},
	}, out.Parts)
	// Rank 1/0 of TP2/PP2 holds layers 0-5, heads 2-3: 6x2x16x8x4 bytes a
	// component and page; three slots.
	require.Equal(t, []regionJSON{{Name: "k", Bytes: 3 * 6144}, {Name: "v", Bytes: 3 * 6144}}, out.Regions)
	require.Equal(t, 2*6144, out.Bytes)
	require.Equal(t, len(out.Ops), out.OpCount)
	require.Contains(t, []string{"direct", "staged", "scatter"}, out.Strategy)
	require.NotNil(t, out.PlanNS)
	require.Positive(t, out.PlanNS.Min)
	require.LessOrEqual(t, out.PlanNS.Min, out.PlanNS.Median)

	sum := 0
	for _, op := range out.Ops {
		sum += op.Len
	}
	require.Equal(t, out.Bytes, sum)

	// Apply the ops to parts holding the page's content.
	ms, err := parseModel(planModel)
	require.NoError(t, err)
	d := &ms.model.Descriptor
	src := placement.Topology{TP: 1, PP: 3}
	partL := mustLayout(t, "PLHD")
	seed := content.Seed("plan-json")
	var parts [][]byte
	for _, r := range src.Ranks() {
		b, err := plan.BindingFor(d, src, r, partL, 1)
		require.NoError(t, err)
		g, err := plan.NewGeometry(d, b)
		require.NoError(t, err)
		regions := [][]byte{make([]byte, g.Regions[0]), make([]byte, g.Regions[1])}
		content.Fill(g, regions, 0, seed)
		parts = append(parts, append(regions[0], regions[1]...))
	}
	b, err := plan.BindingFor(d, placement.Topology{TP: 2, PP: 2}, placement.Rank{TP: 1, PP: 0}, mustLayout(t, "page_first"), 3)
	require.NoError(t, err)
	g, err := plan.NewGeometry(d, b)
	require.NoError(t, err)
	pool := map[string][]byte{"k": make([]byte, g.Regions[0]), "v": make([]byte, g.Regions[1])}
	for _, op := range out.Ops {
		require.Equal(t, op.Len, copy(pool[op.Region][op.Dst:op.Dst+op.Len], parts[op.Part][op.Src:op.Src+op.Len]))
	}
	require.NoError(t, content.Verify(g, [][]byte{pool["k"], pool["v"]}, 2, seed))
}

func mustLayout(t *testing.T, name string) *ir.Layout {
	t.Helper()
	l, err := kernel.LayoutNamed(name)
	require.NoError(t, err)
	return l
}

func TestPlanUsageError(t *testing.T) {
	code, stdout, stderr := runArgs("plan", "--model", planModel, "--src", "tp=1,pp=3,layout=PLHD", "--dst", "tp=2,pp=2,layout=page_first", "--json")
	require.Equal(t, 2, code)
	require.Empty(t, stdout)
	require.Equal(t, "kvreshard plan: --dst: rank is required (rank=T/P or T/P/C: the TP rank, the PP rank, then the CP rank)\n", stderr)
}

// demo on a memory store writes, reads and verifies every pair of the
// table.
func TestDemo(t *testing.T) {
	code, stdout, stderr := runArgs("demo", "--store", "mem://", "--pages", "2")
	require.Equal(t, 0, code, stderr)
	require.Empty(t, stderr)
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	require.Equal(t, "kvreshard demo: store mem://", lines[0])
	require.Equal(t, "every byte of every page verified, by every reader rank, in both directions and across context parallelism.", lines[len(lines)-1])
	row := regexp.MustCompile(`^\s*(TP1/PP3|TP2/PP2)\s+(PLHD|LPHD|HPLD)\s+(TP1/PP3|TP2/PP2)\s+(page_first|page_first_direct|layer_first|page_head)\s+2\s+(\d+)\s+\d+\s+\S+\s+[\d.]+\s+true\s*$`)
	rows := map[string]bool{}
	for _, l := range lines {
		if m := row.FindStringSubmatch(l); m != nil {
			require.NotEqual(t, m[1], m[3], l)
			// A reader topology reads the whole page once: 2 pages of
			// 12x4x16x(64+32)x2 bytes.
			require.Equal(t, "294912", m[5], l)
			rows[m[1]+m[2]+m[4]] = true
		}
	}
	require.Len(t, rows, 24, stdout)
	// The context-parallel row: the reader's four CP ranks each read a
	// quarter of the tokens, the whole page between them.
	cp := regexp.MustCompile(`(?m)^\s*TP2/CP2\s+PLHD\s+TP1/CP4\s+page_first\s+2\s+294912\s+\d+\s+\S+\s+[\d.]+\s+true\s*$`)
	require.Regexp(t, cp, stdout)
	require.Len(t, lines, 3+1+1+25+1+1) // three header lines, a blank line, the table head, 25 rows, a blank line, the summary
}

// write and read in one process share a named memory store.
func TestWriteReadMem(t *testing.T) {
	url := memStore(t)
	const model = "layers=6,kv-heads=4,head-dim=16,v-head-dim=8,dtype=bf16,page=8"
	code, stdout, stderr := runArgs("write", "--store", url, "--model", model, "--src", "tp=2,pp=2,layout=HPLD", "--pages", "3", "--prefix", "t")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `^rank 0/0: 3 written, 0 already complete, 0 refused \(another layout\), 0 replica in \S+
rank 1/0: 3 written, 0 already complete, 0 refused \(another layout\), 0 replica in \S+
rank 0/1: 3 written, 0 already complete, 0 refused \(another layout\), 0 replica in \S+
rank 1/1: 3 written, 0 already complete, 0 refused \(another layout\), 0 replica in \S+
manifest sha256:[0-9a-f]{64} \(HPLD\): kv/[0-9a-f]{64}/manifests/[0-9a-f]{64}
$`, stdout)
	for _, r := range []string{"0/0", "0/1", "0/2"} {
		code, stdout, stderr = runArgs("read", "--store", url, "--model", model, "--dst", "tp=1,pp=3,layout=page_first_direct,rank="+r,
			"--pages", "3", "--prefix", "t", "--verify", "--json")
		require.Equal(t, 0, code, stderr)
		var got readJSON
		require.NoError(t, json.Unmarshal([]byte(stdout), &got))
		// 2 layers x 4 heads x 8 tokens x (16+8) x 2 bytes a page.
		require.Equal(t, readJSON{Requested: 3, Hit: 3, Verified: true, Bytes: 3 * 3072, Ops: got.Ops, Seconds: got.Seconds, GBps: got.GBps}, got)
	}
}

// read --copy-workers: any count reads the same verified pages; a
// negative one is a usage error.
func TestReadCopyWorkers(t *testing.T) {
	url := memStore(t)
	const model = "layers=6,kv-heads=4,head-dim=16,v-head-dim=8,dtype=bf16,page=8"
	code, _, stderr := runArgs("write", "--store", url, "--model", model, "--src", "tp=4,layout=PLHD", "--pages", "4", "--prefix", "w")
	require.Equal(t, 0, code, stderr)
	for _, w := range []string{"0", "1", "3"} {
		code, stdout, stderr := runArgs("read", "--store", url, "--model", model, "--dst", "tp=2,pp=2,layout=page_first,rank=1/1",
			"--pages", "4", "--prefix", "w", "--verify", "--json", "--strategy", "staged", "--copy-workers", w)
		require.Equal(t, 0, code, stderr)
		var got readJSON
		require.NoError(t, json.Unmarshal([]byte(stdout), &got))
		// 3 layers x 2 heads x 8 tokens x (16+8) x 2 bytes a page.
		require.Equal(t, readJSON{Requested: 4, Hit: 4, Verified: true, Bytes: 4 * 2304, Ops: got.Ops, Seconds: got.Seconds, GBps: got.GBps}, got)
	}
	code, stdout, stderr := runArgs("read", "--store", url, "--model", model, "--dst", "tp=2,pp=2,layout=page_first,rank=1/1",
		"--pages", "4", "--prefix", "w", "--copy-workers", "-2")
	require.Equal(t, 2, code)
	require.Empty(t, stdout)
	require.Equal(t, "kvreshard read: --copy-workers: -2; want 0 (GOMAXPROCS) or more\n", stderr)
}

// read --verify exits 1 and names the first wrong element when a stored
// byte is wrong. The reads are direct: they fetch runs, not whole parts,
// so no checksum is checked (TestReadCheckParts).
func TestReadDetectsWrongByte(t *testing.T) {
	dir := t.TempDir()
	const model = "layers=2,kv-heads=2,head-dim=4,dtype=fp32,page=2"
	code, _, stderr := runArgs("write", "--store", "file://"+dir, "--model", model, "--src", "tp=1,layout=PLHD", "--pages", "1")
	require.Equal(t, 0, code, stderr)
	// Flip the first byte of the page's only part.
	var parts []string
	require.NoError(t, filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(e.Name(), "part-") {
			parts = append(parts, path)
		}
		return err
	}))
	require.Len(t, parts, 1)
	data, err := os.ReadFile(parts[0])
	require.NoError(t, err)
	data[0] ^= 0xff
	require.NoError(t, os.WriteFile(parts[0], data, 0o666))

	ms, err := parseModel(model)
	require.NoError(t, err)
	key := content.PageKeys("kvreshard", ms.model.Domain(), 1)[0]
	want := make([]byte, 4)
	content.Element(content.Seed(key), 0, 0, 0, 0, 0, want)
	got := append([]byte(nil), want...)
	got[0] ^= 0xff
	detail := fmt.Sprintf("page 0 (%s): component 0 layer 0 head 0 token 0 element 0 (region k offset 0): got %x, want %x", key, got, want)

	code, stdout, stderr := runArgs("read", "--store", "file://"+dir, "--model", model, "--dst", "tp=1,rank=0/0,layout=page_first", "--pages", "1", "--verify", "--json", "--strategy", "direct")
	require.Equal(t, 1, code)
	require.Empty(t, stderr)
	var res readJSON
	require.NoError(t, json.Unmarshal([]byte(stdout), &res))
	require.Equal(t, readJSON{Requested: 1, Hit: 1, Verified: false, Bytes: 256, Ops: res.Ops, Seconds: res.Seconds, GBps: res.GBps, Error: detail}, res)

	code, stdout, stderr = runArgs("read", "--store", "file://"+dir, "--model", model, "--dst", "tp=1,rank=0/0,layout=page_first", "--pages", "1", "--verify", "--strategy", "direct")
	require.Equal(t, 1, code)
	require.Equal(t, "kvreshard read: "+detail+"\n", stderr)
	require.Regexp(t, `^read 1 of 1 page: 256 bytes in \d+ ops, \S+ \([\d.]+ GB/s\)\n$`, stdout)
}

// read exits 0 on a miss, which a cache answers, and 1 when a page cannot
// be read for another reason (here its manifest is corrupt), saying why on
// stderr; the JSON says what was read either way.
func TestReadExitCodes(t *testing.T) {
	dir := t.TempDir()
	const model = "layers=2,kv-heads=2,head-dim=4,dtype=fp32,page=2"
	code, _, stderr := runArgs("write", "--store", "file://"+dir, "--model", model, "--src", "tp=1,layout=PLHD", "--pages", "2")
	require.Equal(t, 0, code, stderr)
	read := func(pages string) (int, readJSON, string) {
		code, stdout, stderr := runArgs("read", "--store", "file://"+dir, "--model", model, "--dst", "tp=1,rank=0/0,layout=page_first", "--pages", pages, "--verify", "--json")
		var res readJSON
		require.NoError(t, json.Unmarshal([]byte(stdout), &res), stdout)
		res.Seconds, res.GBps, res.Ops = 0, 0, 0
		return code, res, stderr
	}
	ms, err := parseModel(model)
	require.NoError(t, err)
	keys := content.PageKeys("kvreshard", ms.model.Domain(), 3)

	code, res, stderr := read("3")
	require.Equal(t, 0, code, stderr)
	require.Empty(t, stderr)
	require.Equal(t, readJSON{Requested: 3, Hit: 2, Verified: true, Bytes: 512, Stop: "page missing or incomplete: " + keys[2]}, res)

	// Corrupt the one manifest.
	var metas []string
	require.NoError(t, filepath.WalkDir(filepath.Join(dir, "meta"), func(path string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			metas = append(metas, path)
		}
		return err
	}))
	require.Len(t, metas, 1)
	require.NoError(t, os.WriteFile(metas[0], []byte("{}"), 0o666))
	code, res, stderr = read("2")
	require.Equal(t, 1, code)
	require.Equal(t, 0, res.Hit)
	require.True(t, strings.HasPrefix(res.Stop, "page "+keys[0]+": manifest "), res.Stop)
	require.Equal(t, "kvreshard read: read 0 of 2 pages: "+res.Stop+"\n", stderr)
}

// Flags that would make a command allocate more than the machine has are
// usage errors, before anything is written: more layers than maxLayers,
// pools past plan.MaxPoolBytes, and more pages than fit in memory
// (TestPagesGuard).
func TestTooLarge(t *testing.T) {
	code, stdout, stderr := runArgs("plan", "--model", "layers=300000000,kv-heads=4,head-dim=8,dtype=fp32,page=16",
		"--src", "tp=1,layout=PLHD", "--dst", "tp=1,rank=0/0,layout=page_first")
	require.Equal(t, 2, code)
	require.Empty(t, stdout)
	require.Equal(t, "kvreshard plan: --model: layers=300000000 is not from 1 to 4096\n", stderr)

	code, stdout, stderr = runArgs("plan", "--model", "layers=4,kv-heads=4,head-dim=8,dtype=fp32,page=16",
		"--src", "tp=1,layout=PLHD", "--dst", "tp=1,rank=0/0,layout=page_first,slots=9223372036854775807,slot=1")
	require.Equal(t, 2, code)
	require.Empty(t, stdout)
	require.Equal(t, "kvreshard plan: --dst: pool page_first of 9223372036854775807 slots is more than 1125899906842624 bytes\n", stderr)

	// --repeat keeps a time per build: it panicked in makeslice.
	for _, n := range []string{"4611686018427387904", "1000001", "-1"} {
		wantUsage(t, "--repeat "+n+": give 0 to 1000000 builds", "plan", "--model", "layers=4,kv-heads=4,head-dim=8,dtype=fp32,page=16",
			"--src", "tp=1,layout=PLHD", "--dst", "tp=1,rank=0/0,layout=page_first", "--repeat", n)
	}
	// Pages past the memory available: TestPagesGuard, on a configured
	// figure.
}
