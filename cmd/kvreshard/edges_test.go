package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler"
	"github.com/kvreshard/kvreshard/dsl"
	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/runtime/store"
)

// memStores numbers the memory stores of the tests.
var memStores atomic.Int64

// memStore returns the URL of a memory store of its own: a named memory
// store lives as long as the process, and go test -count=N runs a test N
// times in one process.
func memStore(t *testing.T) string {
	return fmt.Sprintf("mem://%s-%d", strings.NewReplacer("/", "-", "#", "-").Replace(t.Name()), memStores.Add(1))
}

// wantUsage runs args and requires exit status 2, nothing on stdout and
// exactly the one line "kvreshard <command>: msg" on stderr.
func wantUsage(t *testing.T, msg string, args ...string) {
	t.Helper()
	wantUsageIn(t, hostEnv, msg, args...)
}

// wantUsageIn is wantUsage with the command run in e.
func wantUsageIn(t *testing.T, e env, msg string, args ...string) {
	t.Helper()
	code, stdout, stderr := runIn(e, args...)
	require.Equal(t, 2, code, "%v: %s", args, stderr)
	require.Empty(t, stdout, "%v", args)
	require.Equal(t, "kvreshard "+args[0]+": "+msg+"\n", stderr, "%v", args)
}

// Issue 14, item 1: topologies past the bounds are refused before a rank
// is built (tp=4611686018427387904 used to panic in makeslice, and
// tp=1000000000 to list a billion ranks before --rank applied), and the
// largest topology within them writes one rank.
func TestTopologyBounds(t *testing.T) {
	url := memStore(t)
	const model = "layers=4,kv-heads=4,head-dim=8,dtype=fp32,page=16"
	for _, c := range []struct{ flag, msg string }{
		{"tp=4611686018427387904,layout=PLHD", "tp 4611686018427387904 is more than 1024"},
		{"tp=1000000000,layout=PLHD", "tp 1000000000 is more than 1024"},
		{"tp=512,layout=PLHD", "tp 512 replicates each of the 4 kv-heads on 128 ranks; at most 64"},
		{"tp=1,pp=5,layout=PLHD", "pp 5 is more than the 4 layers"},
		{"tp=1,pp=4611686018427387904,layout=PLHD", "pp 4611686018427387904 is more than the 4 layers"},
	} {
		wantUsage(t, "--src: "+c.msg, "write", "--store", url, "--model", model, "--src", c.flag, "--pages", "1", "--rank", "0/0")
		wantUsage(t, "--src: "+c.msg, "write", "--store", url, "--model", model, "--src", c.flag, "--pages", "1")
		wantUsage(t, "--dst: "+c.msg, "read", "--store", url, "--model", model, "--dst", strings.Replace(c.flag, "layout=PLHD", "rank=0/0,layout=page_first", 1), "--pages", "1")
	}
	// An MLA model's one head on 64 ranks is within the bounds; on 128 it
	// is not.
	const mla = "layers=2,kv-heads=1,head-dim=8,mla=1,dtype=fp8,page=2"
	code, stdout, stderr := runArgs("write", "--store", url, "--model", mla, "--src", "tp=64,layout=PLHD", "--pages", "2", "--rank", "63/0")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `^rank 63/0: 0 written, 0 already complete, 0 refused \(another layout\), 2 replica in \S+\n`, stdout)
	wantUsage(t, "--src: tp 128 replicates each of the 1 kv-heads on 128 ranks; at most 64",
		"write", "--store", url, "--model", mla, "--src", "tp=128,layout=PLHD", "--pages", "1", "--rank", "0/0")

	// TP 1024 x PP 4096 would store 4M parts: refused before they are
	// built (it took 9 s and 1.1 GB to refuse the manifest they made).
	wantUsage(t, "--src: tp 1024 x pp 4096 stores 4194304 parts a page; a manifest holds at most 12483",
		"write", "--store", url, "--model", "layers=4096,kv-heads=1024,head-dim=1,mla=1,dtype=fp8,page=1",
		"--src", "tp=1024,pp=4096,layout=PLHD", "--pages", "1", "--rank", "0/0")

	// TP 1024 of 1024 heads: --rank writes one rank, which a reader of
	// the same rank reads back.
	const wide = "layers=1,kv-heads=1024,head-dim=1,dtype=fp8,page=1"
	code, stdout, stderr = runArgs("write", "--store", url, "--model", wide, "--src", "tp=1024,layout=PLHD", "--pages", "2", "--rank", "1023/0")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, 2, strings.Count(stdout, "\n"), stdout)
	require.Regexp(t, `^rank 1023/0: 2 written, 0 already complete, 0 refused \(another layout\), 0 replica in \S+\n`, stdout)
}

// Issue 14, item 3: write refuses a manifest longer than readers accept
// (TP 64 with 4096 layers: 1.26 MB against 1 MiB) before it writes
// anything; plan refuses it too.
func TestManifestTooLarge(t *testing.T) {
	dir := t.TempDir()
	const model = "layers=4096,kv-heads=64,head-dim=8,dtype=fp8,page=1"
	const msg = "--src: manifest of 64 parts is 1264590 bytes encoded; readers accept at most 1048576"
	wantUsage(t, msg, "write", "--store", "file://"+dir, "--model", model, "--src", "tp=64,layout=PLHD", "--pages", "1", "--rank", "0/0")
	wantUsage(t, msg, "write", "--store", "file://"+dir, "--model", model, "--src", "tp=64,layout=PLHD", "--pages", "1")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, entries, "nothing was written")
	wantUsage(t, msg, "plan", "--model", model, "--src", "tp=64,layout=PLHD", "--dst", "tp=1,rank=0/0,layout=page_first")
	// Half the layers fit: 631 KB.
	code, _, stderr := runArgs("write", "--store", "file://"+dir, "--model", "layers=2048,kv-heads=64,head-dim=8,dtype=fp8,page=1",
		"--src", "tp=64,layout=PLHD", "--pages", "1", "--rank", "0/0")
	require.Equal(t, 0, code, stderr)
}

// withMemory is this machine with avail bytes of memory available, as the
// --pages guard sees it.
func withMemory(avail int) env {
	e := hostEnv
	e.memAvailable = func() int { return avail }
	return e
}

// Issue 14, item 11: the --pages guard compares with MemAvailable, not
// MemTotal.
func TestMemAvailable(t *testing.T) {
	const meminfo = `MemTotal:       24576000 kB
MemFree:         1024000 kB
MemAvailable:    4096000 kB
Buffers:          102400 kB
`
	require.Equal(t, 4096000<<10, memAvailable(meminfo))
	require.Equal(t, 0, memAvailable("MemTotal:       24576000 kB\n"), "no MemAvailable: not known")
	require.Equal(t, 0, memAvailable("MemAvailable: lots kB\n"))
	require.Equal(t, 0, memAvailable("MemAvailable: 99999999999999999999 kB\n"))
	if b, err := os.ReadFile("/proc/meminfo"); err == nil && strings.Contains(string(b), "MemAvailable:") {
		require.Positive(t, availableMemory())
	}
}

// The guard, on a configured 64 MiB available: one page more than fits
// is a usage error, as many pages as fit are not.
func TestPagesGuard(t *testing.T) {
	url := memStore(t)
	const avail = 64 << 20
	e := withMemory(avail)
	const model = "layers=4,kv-heads=4,head-dim=8,dtype=fp32,page=16" // 16384 bytes a page
	for _, c := range []struct {
		args      []string
		pageBytes int
	}{
		{[]string{"write", "--store", url, "--model", model, "--src", "tp=1,layout=PLHD"}, 16384},
		{[]string{"read", "--store", url, "--model", model, "--dst", "tp=2,rank=1/0,layout=page_first"}, 8192},
		{[]string{"demo", "--store", url}, 147456},
	} {
		pages := avail/c.pageBytes + 1
		wantUsageIn(t, e, fmt.Sprintf("--pages %d: %d pages of %d bytes do not fit in the %d bytes of memory available", pages, pages, c.pageBytes, avail),
			append(c.args, "--pages", strconv.Itoa(pages))...)
	}
	code, stdout, stderr := runIn(e, "read", "--store", url, "--model", model, "--dst", "tp=2,rank=1/0,layout=page_first", "--pages", strconv.Itoa(avail/8192))
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "read 0 of 8192 pages: ")

	wantUsageIn(t, withMemory(100000), "--pages 1: 1 page of 147456 bytes does not fit in the 100000 bytes of memory available", "demo", "--store", url, "--pages", "1")
}

// Issue 14, item 12: usage errors exit 2 with one line.
func TestUsageErrorsExit2(t *testing.T) {
	url := memStore(t)
	wantUsage(t, `--store: store URL "foo": missing scheme; use one of file://, mem://, redis+cluster://, redis://`, "demo", "--store", "foo")
	wantUsage(t, `--store: store URL "file://host/x": host "host" is not empty or localhost; write file:///abs/dir, with three slashes`,
		"demo", "--store", "file://host/x")

	// Flags are checked before the store is opened: no connection to a
	// closed port, and exit 2 for the flag.
	wantUsage(t, `--strategy: unknown strategy "bogus"; strategies are direct, scatter, staged, auto`,
		"read", "--store", "redis://127.0.0.1:1", "--model", "layers=2,kv-heads=2,head-dim=4,dtype=fp32,page=2",
		"--dst", "tp=1,rank=0/0,layout=page_first", "--pages", "1", "--strategy", "bogus")

	// The flag package's errors: one line, not the usage after it.
	wantUsage(t, "flag provided but not defined: -bogus", "read", "--bogus")
	wantUsage(t, `invalid value "x" for flag -pages: not a decimal whole number`, "write", "--pages", "x")
	wantUsage(t, "flag needs an argument: -store", "demo", "--store")
	wantUsage(t, `invalid boolean value "maybe" for -json: parse error`, "plan", "--json=maybe")
	// -h still prints every flag, and exits 0.
	code, stdout, stderr := runArgs("read", "-h")
	require.Equal(t, 0, code)
	require.Empty(t, stdout)
	require.True(t, strings.HasPrefix(stderr, "Usage of kvreshard read:\n"), stderr)
	for _, f := range []string{"-check-parts", "-copy-workers", "-dst", "-pages", "-verify"} {
		require.Regexp(t, "\n  "+f+"[ \n]", stderr)
	}

	// A writer pool whose split does not divide the model's head dim.
	kvl := filepath.Join(t.TempDir(), "split.kvl")
	require.NoError(t, os.WriteFile(kvl, []byte("pool blockpool { order C S T L H D/3 D%3 }\n"), 0o644))
	const model = "layers=2,kv-heads=2,head-dim=8,dtype=fp32,page=2"
	for _, rank := range [][]string{nil, {"--rank", "0/1"}} {
		wantUsage(t, "--src: the writer's pool: layout blockpool splits D by 3, which does not divide head dim 8",
			append([]string{"write", "--store", url, "--kvl", kvl, "--model", model, "--src", "tp=1,pp=2,layout=PLHD,pool=blockpool", "--pages", "1"}, rank...)...)
	}
	wantUsage(t, "--dst: layout blockpool splits D by 3, which does not divide head dim 8",
		"read", "--store", url, "--kvl", kvl, "--model", model, "--dst", "tp=1,rank=0/0,layout=blockpool", "--pages", "1")
}

// Issue 14, item 12: a part layout as a reader's pool holds --pages pages,
// one slot after another, and reads them all.
func TestReadIntoPartLayout(t *testing.T) {
	url := memStore(t)
	const model = "layers=4,kv-heads=4,head-dim=8,dtype=fp32,page=4"
	code, _, stderr := runArgs("write", "--store", url, "--model", model, "--src", "tp=2,pp=2,layout=HPLD", "--pages", "4")
	require.Equal(t, 0, code, stderr)
	for _, layout := range []string{"PLHD", "LPHD", "HPLD"} {
		code, stdout, stderr := runArgs("read", "--store", url, "--model", model, "--dst", "tp=4,rank=3/0,layout="+layout,
			"--pages", "4", "--verify", "--json")
		require.Equal(t, 0, code, stderr)
		var got readJSON
		require.NoError(t, json.Unmarshal([]byte(stdout), &got))
		// 4 layers x 1 head x 4 tokens x (8+8) x 4 bytes a page; the
		// built-in pools of these orders have compiled kernels.
		require.Equal(t, readJSON{Requested: 4, Hit: 4, Verified: true, Bytes: 4 * 1024, Ops: got.Ops, Seconds: got.Seconds, GBps: got.GBps}, got, layout)
	}
	// A part layout with no built-in pool of its order reads on the
	// interpreter.
	kvl := filepath.Join(t.TempDir(), "flash.kvl")
	require.NoError(t, os.WriteFile(kvl, []byte("part flash { order C H D L T }\n"), 0o644))
	code, stdout, stderr := runArgs("read", "--store", url, "--kvl", kvl, "--model", model, "--dst", "tp=2,pp=2,rank=1/1,layout=flash",
		"--pages", "3", "--verify")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `^read 3 of 3 pages: 3072 bytes in \d+ ops, \S+ \([\d.]+ GB/s\)\nverified every element of 3 pages\n$`, stdout)
	require.Empty(t, stderr)
}

// kvreshard --kvl prints at most 20 errors, as kvlc does.
func TestKVLErrorCap(t *testing.T) {
	kvl := filepath.Join(t.TempDir(), "bad.kvl")
	var src strings.Builder
	for i := range 30 {
		fmt.Fprintf(&src, "part p%d { order C T L H X }\n", i)
	}
	require.NoError(t, os.WriteFile(kvl, []byte(src.String()), 0o644))
	_, err := compiler.CompileAll(compiler.Source{Name: kvl, Text: []byte(src.String())})
	var list dsl.ErrorList
	require.True(t, errors.As(err, &list))
	require.Len(t, list, 60)
	var want strings.Builder
	for i, e := range list[:20] {
		if i == 0 {
			want.WriteString("kvreshard plan: --kvl: ")
		}
		fmt.Fprintln(&want, e)
	}
	want.WriteString("and 40 more errors\n")
	code, stdout, stderr := runArgs("plan", "--kvl", kvl, "--model", planModel, "--src", "tp=1,layout=PLHD", "--dst", "tp=1,rank=0/0,layout=page_first")
	require.Equal(t, 2, code)
	require.Empty(t, stdout)
	require.Equal(t, want.String(), stderr)

	// 20 errors are all printed.
	src.Reset()
	for i := range 10 {
		fmt.Fprintf(&src, "part p%d { order C T L H X }\n", i)
	}
	require.NoError(t, os.WriteFile(kvl, []byte(src.String()), 0o644))
	_, stdout, stderr = runArgs("plan", "--kvl", kvl, "--model", planModel, "--src", "tp=1,layout=PLHD", "--dst", "tp=1,rank=0/0,layout=page_first")
	require.Empty(t, stdout)
	require.Equal(t, 20, strings.Count(stderr, "\n"), stderr)
	require.NotContains(t, stderr, "more errors")
}

// Issue 14, item 14: counts are decimal, with no sign, space or leading
// zero, in specs and in flags.
func TestStrictCounts(t *testing.T) {
	const good = "layers=12,kv-heads=4,head-dim=8,dtype=fp32,page=16"
	plan := func(model, src, dst string, more ...string) []string {
		return append([]string{"plan", "--model", model, "--src", src, "--dst", dst}, more...)
	}
	const src, dst = "tp=1,layout=PLHD", "tp=1,rank=0/0,layout=page_first"
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{plan(strings.Replace(good, "layers=12", "layers=+12", 1), src, dst), "--model: layers=+12 is not a whole number >= 1"},
		{plan(strings.Replace(good, "layers=12", "layers=012", 1), src, dst), "--model: layers=012 is not a whole number >= 1"},
		{plan(strings.Replace(good, "layers=12", "layers= 12", 1), src, dst), "--model: layers= 12 is not a whole number >= 1"},
		{plan(strings.Replace(good, "layers=12", "layers=12 ", 1), src, dst), "--model: layers=12  is not a whole number >= 1"},
		{plan(strings.Replace(good, "page=16", "page=0x10", 1), src, dst), "--model: page=0x10 is not a whole number >= 1"},
		{plan(strings.Replace(good, "kv-heads=4", "kv-heads=-4", 1), src, dst), "--model: kv-heads=-4 is not a whole number >= 1"},
		{plan(good, "tp=+1,layout=PLHD", dst), "--src: tp=+1 is not a whole number >= 1"},
		{plan(good, "tp=1,pp=2,pp-layers=+6/6,layout=PLHD", dst), "--src: pp-layers=+6/6 is not a list of positive layer counts like 5/4/3"},
		{plan(good, "tp=1,pp=2,pp-layers=06/6,layout=PLHD", dst), "--src: pp-layers=06/6 is not a list of positive layer counts like 5/4/3"},
		{plan(good, src, "tp=1,rank=+0/0,layout=page_first"), "--dst: rank=+0/0 is not TP/PP ranks like 1/0, or TP/PP/CP ranks like 1/0/1"},
		{plan(good, src, "tp=1,rank=0/00,layout=page_first"), "--dst: rank=0/00 is not TP/PP ranks like 1/0, or TP/PP/CP ranks like 1/0/1"},
		{plan(good, src, "tp=1,rank=0/0,layout=page_first,slots=+2"), "--dst: slots=+2 is not a whole number >= 1"},
		{plan(good, src, dst, "--repeat", "+3"), `invalid value "+3" for flag -repeat: not a decimal whole number`},
		{plan(good, src, dst, "--max-gap", "0x10"), `invalid value "0x10" for flag -max-gap: not a decimal whole number`},
		{plan(good, src, dst, "--max-gap", "-0"), `invalid value "-0" for flag -max-gap: not a decimal whole number`},
		{[]string{"write", "--store", "mem://", "--model", good, "--src", src, "--pages", "010"}, `invalid value "010" for flag -pages: not a decimal whole number`},
		{[]string{"write", "--store", "mem://", "--model", good, "--src", src, "--pages", "1", "--rank", "0/+0"}, "--rank 0/+0 is not TP/PP ranks like 1/0, or TP/PP/CP ranks like 1/0/1"},
		{plan("layers=0\n,kv-heads=4,head-dim=8,dtype=fp32,page=16", src, dst), `--model: "layers=0\n,kv-heads=4,head-dim=8,dtype=fp32,page=16" has a control character at byte 8`},
		{plan(good, "tp=1,layout=PLHD\t", dst), `--src: "tp=1,layout=PLHD\t" has a control character at byte 16`},
		{[]string{"write", "--store", "mem://", "--model", good, "--src", src, "--pages", "1", "--rank", "0/\n0"}, `--rank "0/\n0" is not TP/PP ranks like 1/0, or TP/PP/CP ranks like 1/0/1`},
		{[]string{"read", "--store", "mem://", "--model", good, "--dst", dst, "--pages", " 1"}, `invalid value " 1" for flag -pages: not a decimal whole number`},
		{[]string{"demo", "--pages", "1e3"}, `invalid value "1e3" for flag -pages: not a decimal whole number`},
	} {
		wantUsage(t, c.msg, c.args...)
	}
	// What is written the one way still parses, negative flags included.
	code, _, stderr := runArgs(plan(good, "tp=1,pp=2,pp-layers=10/2,layout=PLHD", "tp=1,rank=0/0,layout=page_first,slots=10,slot=9", "--max-gap", "-1")...)
	require.Equal(t, 0, code, stderr)
	wantUsage(t, "--max-gap -2: give a byte count, 0 for the transport's break-even gap, or -1 for none", plan(good, src, dst, "--max-gap", "-2")...)
}

// Issue 14, item 14: after a read that failed, or that read nothing, no
// line says pages were verified; one page is "1 page".
func TestReadSummary(t *testing.T) {
	dir := t.TempDir()
	const model = "layers=2,kv-heads=2,head-dim=4,dtype=fp32,page=2"
	code, _, stderr := runArgs("write", "--store", "file://"+dir, "--model", model, "--src", "tp=1,layout=PLHD", "--pages", "1")
	require.Equal(t, 0, code, stderr)
	read := func(pages string) (int, string, string) {
		return runArgs("read", "--store", "file://"+dir, "--model", model, "--dst", "tp=1,rank=0/0,layout=page_first", "--pages", pages, "--verify")
	}
	code, stdout, stderr := read("1")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `^read 1 of 1 page: 256 bytes in \d+ ops, \S+ \([\d.]+ GB/s\)\nverified every element of 1 page\n$`, stdout)

	ms, err := parseModel(model)
	require.NoError(t, err)
	keys := content.PageKeys("kvreshard", ms.model.Domain(), 2)
	// A miss after the first page: one page verified, exit 0.
	code, stdout, stderr = read("2")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `^read 1 of 2 pages: 256 bytes in \d+ ops, \S+ \([\d.]+ GB/s\)\nstopped: page missing or incomplete: `+keys[1]+`\nverified every element of 1 page\n$`, stdout)
	require.Empty(t, stderr)

	// A miss on the first page: nothing was verified.
	code, stdout, stderr = runArgs("read", "--store", "file://"+dir, "--model", model, "--dst", "tp=1,rank=0/0,layout=page_first", "--pages", "1", "--verify", "--prefix", "other")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `^read 0 of 1 page: 0 bytes in 0 ops, \S+ \([\d.]+ GB/s\)\nstopped: page missing or incomplete: other_\S+\n$`, stdout)

	// A corrupt manifest: the read fails, and says so only on stderr.
	var metas []string
	require.NoError(t, filepath.WalkDir(filepath.Join(dir, "meta"), func(path string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			metas = append(metas, path)
		}
		return err
	}))
	require.Len(t, metas, 1)
	require.NoError(t, os.WriteFile(metas[0], []byte("{}"), 0o666))
	code, stdout, stderr = read("1")
	require.Equal(t, 1, code)
	require.NotContains(t, stdout, "verified")
	require.Regexp(t, `^read 0 of 1 page: 0 bytes in 0 ops, \S+ \([\d.]+ GB/s\)\nstopped: page `+keys[0]+`: manifest [^\n]+\n$`, stdout)
	require.True(t, strings.HasPrefix(stderr, "kvreshard read: read 0 of 1 page: page "+keys[0]+": manifest "), stderr)
}

// read --check-parts sets ReaderOptions.CheckParts: pages of a sound
// store read and verify with it; on a part with a flipped byte, an
// unchecked read only --verify notices, and --check-parts stops at the
// checksum of the byte's block, exit 1.
func TestReadCheckParts(t *testing.T) {
	dir := t.TempDir()
	const model = "layers=2,kv-heads=2,head-dim=4,dtype=fp32,page=2"
	code, _, stderr := runArgs("write", "--store", "file://"+dir, "--model", model, "--src", "tp=2,layout=PLHD", "--pages", "2")
	require.Equal(t, 0, code, stderr)
	read := func(more ...string) (int, string, string) {
		return runArgs(append([]string{"read", "--store", "file://" + dir, "--model", model, "--dst", "tp=2,rank=1/0,layout=page_first",
			"--pages", "2", "--verify"}, more...)...)
	}
	for _, strategy := range []string{"direct", "scatter", "staged"} {
		code, stdout, stderr := read("--check-parts", "--strategy", strategy)
		require.Equal(t, 0, code, stderr)
		require.Contains(t, stdout, "verified every element of 2 pages\n", strategy)
	}
	wantUsage(t, `invalid boolean value "x" for -check-parts: parse error`, "read", "--check-parts=x")

	// Flip the first byte of every part: head 0 then head 1 of each page.
	n := 0
	require.NoError(t, filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil || !strings.HasPrefix(e.Name(), "part-") {
			return err
		}
		data, err := os.ReadFile(path)
		if err == nil {
			data[0] ^= 1
			err = os.WriteFile(path, data, 0o666)
		}
		n++
		return err
	}))
	require.Equal(t, 4, n)
	ms, err := parseModel(model)
	require.NoError(t, err)
	key := content.PageKeys("kvreshard", ms.model.Domain(), 1)[0]

	code, stdout, stderr := read("--strategy", "direct")
	require.Equal(t, 1, code)
	require.Regexp(t, `^read 2 of 2 pages: 256 bytes in 4 ops, \S+ \([\d.]+ GB/s\)\n$`, stdout)
	require.True(t, strings.HasPrefix(stderr, "kvreshard read: page 0 ("+key+"): component 0 layer 0 head 1 token 0 element 0 (region k offset 0): got "), stderr)

	stop := "page " + key + ": part 1: block 0 (bytes 0-128): part checksum mismatch"
	code, stdout, stderr = read("--strategy", "direct", "--check-parts")
	require.Equal(t, 1, code)
	require.Regexp(t, `^read 0 of 2 pages: 0 bytes in 0 ops, \S+ \([\d.]+ GB/s\)\nstopped: `+regexp.QuoteMeta(stop)+`\n$`, stdout)
	require.Equal(t, "kvreshard read: read 0 of 2 pages: "+stop+"\n", stderr)
}

// failWriter takes n writes, then fails every one.
type failWriter struct{ n int }

func (w *failWriter) Write(p []byte) (int, error) {
	if w.n == 0 {
		return 0, errors.New("stdout is closed")
	}
	w.n--
	return len(p), nil
}

// Issue 14, item 13: demo reports a table it could not print (its
// tabwriter's Flush error used to be dropped, and demo exited 0).
func TestDemoOutputError(t *testing.T) {
	url := memStore(t)
	var stderr strings.Builder
	code := run(hostEnv, []string{"demo", "--store", url, "--pages", "1"}, &failWriter{n: 3}, &stderr)
	require.Equal(t, 1, code)
	require.Equal(t, "kvreshard demo: stdout is closed\n", stderr.String())
}

// evictAfterQuery is a store whose query reports page evict complete, as
// page like says, though it was never written (or was evicted since): the
// read of its parts then finds nothing.
type evictAfterQuery struct {
	store.Store
	like, evict string
}

func (s *evictAfterQuery) Query(ctx context.Context, keys []string) ([]store.Object, error) {
	objs, err := s.Store.Query(ctx, keys)
	for i, k := range keys {
		if k != s.evict {
			continue
		}
		like, err := s.Store.Query(ctx, []string{s.like})
		if err != nil {
			return nil, err
		}
		objs[i] = like[0]
	}
	return objs, err
}

// Issue 14, item 4: a page evicted between query and read is a miss: read
// stops there, names it, and exits 0 with the pages before it verified.
func TestReadEvictedAfterQuery(t *testing.T) {
	dir := t.TempDir()
	url := "file://" + dir
	const model = "layers=2,kv-heads=2,head-dim=4,dtype=fp32,page=2"
	ms, err := parseModel(model)
	require.NoError(t, err)
	keys := content.PageKeys("kvreshard", ms.model.Domain(), 3)
	code, _, stderr := runArgs("write", "--store", url, "--model", model, "--src", "tp=2,layout=PLHD", "--pages", "1")
	require.Equal(t, 0, code, stderr)

	e := wrapStores(func(st store.Store) store.Store { return &evictAfterQuery{Store: st, like: keys[0], evict: keys[1]} })
	for _, strategy := range []string{"direct", "staged"} {
		code, stdout, stderr := runIn(e, "read", "--store", url, "--model", model, "--dst", "tp=1,rank=0/0,layout=page_first", "--pages", "3",
			"--verify", "--strategy", strategy)
		require.Equal(t, 0, code, stderr)
		require.Empty(t, stderr)
		require.Regexp(t, `^read 1 of 3 pages: 256 bytes in \d+ ops, \S+ \([\d.]+ GB/s\)\n`+
			`stopped: page missing or incomplete: `+keys[1]+`: read `+keys[1]+` part 0 \[0,\d+\): [^\n]*not found[^\n]*\n`+
			`verified every element of 1 page\n$`, stdout)
	}
}

// --kvl reads regular files of at most 1 MiB: a FIFO used to block the
// command forever and /dev/zero to fill its memory.
func TestKVLFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.kvl")
	require.NoError(t, syscall.Mkfifo(fifo, 0o644))
	big := filepath.Join(dir, "big.kvl")
	require.NoError(t, os.WriteFile(big, []byte(strings.Repeat("\n", maxKVLBytes+1)), 0o644))
	// Exactly the limit: 31 bytes of layout after the blank lines.
	fits := filepath.Join(dir, "fits.kvl")
	require.NoError(t, os.WriteFile(fits, []byte(strings.Repeat("\n", maxKVLBytes-31)+"part flash { order C H D L T }\n"), 0o644))
	args := func(kvl string) []string {
		return []string{"plan", "--kvl", kvl, "--model", planModel, "--src", "tp=1,layout=flash", "--dst", "tp=1,rank=0/0,layout=page_first"}
	}
	wantUsage(t, "--kvl: "+fifo+" is not a regular file", args(fifo)...)
	wantUsage(t, "--kvl: /dev/zero is not a regular file", args("/dev/zero")...)
	wantUsage(t, "--kvl: "+dir+" is not a regular file", args(dir)...)
	wantUsage(t, "--kvl: stat "+dir+"/none.kvl: no such file or directory", args(dir+"/none.kvl")...)
	wantUsage(t, "--kvl: "+big+" is more than 1048576 bytes", args(big)...)
	code, _, stderr := runArgs(args(fits)...)
	require.Equal(t, 0, code, stderr)
}
