package main

import (
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/internal/spec"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/store"
)

// These tests build libkvreshard.so as a C program would get it
// (go build -buildmode=c-shared) and use it from C through kvreshard.h.

// requireGCC returns the path of gcc, or skips t when it is not installed.
func requireGCC(t *testing.T) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not found; install it (Debian: apt-get install gcc) to test the C library")
	}
	return gcc
}

var (
	libOnce sync.Once
	libDir  string
	libErr  error
)

// buildLib builds libkvreshard.so once per test binary into a temporary
// directory and returns the directory.
func buildLib(t *testing.T) string {
	t.Helper()
	requireGCC(t)
	libOnce.Do(func() {
		goCmd, err := exec.LookPath("go")
		if err != nil {
			libErr = fmt.Errorf("go not found: %v", err)
			return
		}
		libDir, libErr = os.MkdirTemp("", "libkvreshard")
		if libErr != nil {
			return
		}
		cmd := exec.Command(goCmd, "build", "-buildmode=c-shared", "-o", filepath.Join(libDir, "libkvreshard.so"), ".")
		if out, err := cmd.CombinedOutput(); err != nil {
			libErr = fmt.Errorf("go build -buildmode=c-shared: %v\n%s", err, out)
		}
	})
	require.NoError(t, libErr)
	return libDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if libDir != "" {
		os.RemoveAll(libDir)
	}
	os.Exit(code)
}

// compileC compiles C sources against kvreshard.h and the library into an
// executable and returns its path.
func compileC(t *testing.T, lib, name string, srcs ...string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), name)
	args := append([]string{"-std=c99", "-D_POSIX_C_SOURCE=200809L", "-Wall", "-Wextra", "-Werror", "-pthread",
		"-I", ".", "-o", bin}, srcs...)
	args = append(args, "-L", lib, "-lkvreshard", "-Wl,-rpath,"+lib, "-Wl,--no-undefined")
	out, err := exec.Command(requireGCC(t), args...).CombinedOutput()
	require.NoError(t, err, "gcc %s:\n%s", strings.Join(args, " "), out)
	return bin
}

// cProgram compiles the C test program, every .c file of testdata (its main
// kvreshard_test.c and the kvr_test_*.c files by topic, which share
// kvr_test.h), against the library and returns the executable's path.
func cProgram(t *testing.T, lib string) string {
	t.Helper()
	srcs, err := filepath.Glob(filepath.Join("testdata", "*.c"))
	require.NoError(t, err)
	require.Contains(t, srcs, filepath.Join("testdata", "kvreshard_test.c"), "the C test program's main")
	return compileC(t, lib, "kvreshard_test", srcs...)
}

// headerFunctions returns the functions kvreshard.h declares.
func headerFunctions(t *testing.T) []string {
	h, err := os.ReadFile("kvreshard.h")
	require.NoError(t, err)
	var out []string
	for _, m := range regexp.MustCompile(`(?m)^(?:int |const char \*)(kvr_\w+)\(`).FindAllSubmatch(h, -1) {
		out = append(out, string(m[1]))
	}
	require.Len(t, out, 20, "functions declared in kvreshard.h")
	return out
}

// TestExportedFunctions checks that the library exports exactly the
// functions kvreshard.h declares, and that a C program taking the address
// of each links against it. Their signatures are the header's because
// kvreshard.c, which defines them, includes kvreshard.h (a definition that
// differs from its declaration does not compile), and calls the Go exports
// through _cgo_export.h, whose prototypes cgo derives from the Go
// functions' C types.
func TestExportedFunctions(t *testing.T) {
	lib := buildLib(t)
	fns := headerFunctions(t)

	f, err := elf.Open(filepath.Join(lib, "libkvreshard.so"))
	require.NoError(t, err)
	defer f.Close()
	syms, err := f.DynamicSymbols()
	require.NoError(t, err)
	var exported []string
	for _, s := range syms {
		if strings.HasPrefix(s.Name, "kvr") && s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
			exported = append(exported, s.Name)
		}
	}
	slices.Sort(exported)
	want := slices.Clone(fns)
	slices.Sort(want)
	require.Equal(t, want, exported, "the library exports the header's functions and no other kvr* function")

	var src strings.Builder
	src.WriteString("#include <stdio.h>\n#include \"kvreshard.h\"\n\nstatic void *const fns[] = {\n")
	for _, fn := range fns {
		fmt.Fprintf(&src, "    (void *)&%s,\n", fn)
	}
	src.WriteString("};\n\nint main(void) {\n    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {\n" +
		"        if (fns[i] == NULL) return 1;\n    }\n    int32_t minor = -1;\n    int major = kvr_version(&minor);\n" +
		"    printf(\"%d %d.%d\\n\", (int)(sizeof fns / sizeof fns[0]), major, (int)minor);\n    return 0;\n}\n")
	c := filepath.Join(t.TempDir(), "addresses.c")
	require.NoError(t, os.WriteFile(c, []byte(src.String()), 0o644))
	out, err := exec.Command(compileC(t, lib, "addresses", c)).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Equal(t, fmt.Sprintf("%d %d.%d\n", len(fns), abiVersion, abiMinor), string(out))

	// The header also compiles as C++ (its extern "C" guards).
	cc := filepath.Join(t.TempDir(), "header.cc")
	require.NoError(t, os.WriteFile(cc, []byte("#include \"kvreshard.h\"\nint (*v)(int32_t *) = kvr_version;\n"), 0o644))
	if gpp, err := exec.LookPath("g++"); err == nil {
		out, err := exec.Command(gpp, "-std=c++11", "-Wall", "-Werror", "-I", ".", "-c", "-o", filepath.Join(t.TempDir(), "h.o"), cc).CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
}

// TestHandleTypes checks that the handle types are distinct: a program
// that passes a writer where a reader is expected does not compile with
// the flags the package builds with (-Werror=incompatible-pointer-types),
// while the same program passing a reader does.
func TestHandleTypes(t *testing.T) {
	gcc := requireGCC(t)
	compile := func(arg string) (string, error) {
		src := "#include \"kvreshard.h\"\n\nint f(kvr_writer *w, kvr_reader *r, kvr_read_result *res) {\n" +
			"    (void)w;\n    (void)r;\n    return kvr_reader_read(" + arg + ", NULL, NULL, NULL, 0, res, NULL, 0);\n}\n"
		c := filepath.Join(t.TempDir(), "handles.c")
		require.NoError(t, os.WriteFile(c, []byte(src), 0o644))
		out, err := exec.Command(gcc, "-std=c99", "-Wall", "-Werror=incompatible-pointer-types", "-I", ".", "-c",
			"-o", filepath.Join(t.TempDir(), "handles.o"), c).CombinedOutput()
		return string(out), err
	}
	out, err := compile("r")
	require.NoError(t, err, "a reader passed as a reader: %s", out)
	out, err = compile("w")
	require.Error(t, err, "a writer passed as a reader compiled")
	require.Contains(t, out, "incompatible pointer type")
	require.Contains(t, out, "kvr_writer")
}

// TestHeaderConstants checks that every constant of kvreshard.h equals the
// Go side's, and that neither has one the other lacks.
func TestHeaderConstants(t *testing.T) {
	h, err := os.ReadFile("kvreshard.h")
	require.NoError(t, err)
	got := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^#define (KVR_\w+) (\d+)`).FindAllSubmatch(h, -1) {
		v, err := strconv.Atoi(string(m[2]))
		require.NoError(t, err)
		got[string(m[1])] = v
	}
	require.Equal(t, headerConstants, got)
}

// cModel is the model of the C test program (testdata/*.c), named with the
// kvreshard command's defaults.
var cModel = manifest.Model{Namespace: "kvreshard", ModelID: "model", Revision: "0", Descriptor: manifest.Descriptor{
	Layers: []int{0, 1, 2, 3, 4, 5, 6}, KVHeads: 4, HeadDims: []int{8, 4}, Dtype: "fp32", ItemSize: 4, PageSize: 4}}

// TestCProgram runs the C test program (testdata/*.c) against the file
// store in a temporary directory: TP1/PP3 writers, TP2/PP2 readers, every
// element checked against the program's own oracle, misses, bad arguments
// with their exact messages, closed handles, four threads, and a forked
// child. Then it checks, in Go, that the pages are where the kvreshard
// command's read looks for them.
func TestCProgram(t *testing.T) {
	lib := buildLib(t)
	bin := cProgram(t, lib)
	dir := t.TempDir()
	out, err := exec.Command(bin, dir).CombinedOutput()
	require.NoError(t, err, "kvreshard_test:\n%s", out)
	require.Equal(t, "ok\n", string(out))

	st, err := store.Open(context.Background(), "file://"+dir)
	require.NoError(t, err)
	defer st.Close()
	// Pages 0-9 are complete, page 10 only partly written.
	keys := content.PageKeys("kvreshard", cModel.Domain(), 11)
	objs, err := st.Query(context.Background(), keys)
	require.NoError(t, err)
	for i, o := range objs {
		require.Equal(t, i < 10, o.Complete, "page %d (%s)", i, keys[i])
	}
}

// TestEmptyCallCost reports the cost of an empty kvr_reader_read from C,
// the floor of every call. It asserts nothing about time (the machine may
// be loaded); it fails only when a call fails.
func TestEmptyCallCost(t *testing.T) {
	lib := buildLib(t)
	bin := cProgram(t, lib)
	out, err := exec.Command(bin, "bench", "100000").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Regexp(t, `^empty kvr_reader_read: \d+ ns a call \(100000 calls\)\n$`, string(out))
	t.Logf("%s", strings.TrimSpace(string(out)))
}

// TestReadBench runs the C program's readbench on one page of python -m
// kvreshard.bench, written here as that benchmark's --write does, with
// the default copy workers and with one. It asserts nothing about time.
func TestReadBench(t *testing.T) {
	lib := buildLib(t)
	bin := cProgram(t, lib)
	url := "file://" + t.TempDir()
	write70B(t, url, 1)
	for _, args := range [][]string{{"readbench", url, "1", "2"}, {"readbench", url, "1", "1", "1"}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		require.NoError(t, err, "%s", out)
		reads := args[3]
		require.Regexp(t, `^read of 1 pages \(2621440 bytes\): best \d+\.\d{3} ms, median \d+\.\d{3} ms \(`+reads+` reads\)\n$`, string(out))
	}
	out, err := exec.Command(bin, "readbench", url, "2", "1").CombinedOutput()
	require.Error(t, err)
	model, err := buildModel(bench70B)
	require.NoError(t, err)
	key := content.PageKeys(spec.KeyPrefix, model.Domain(), 2)[1]
	require.Equal(t, "readbench: read 1 of 2 pages: code 0: page missing or incomplete: "+key+"\n", string(out))
	out, err = exec.Command(bin, "readbench", url, "0", "1").CombinedOutput()
	require.Error(t, err)
	require.Equal(t, "readbench: pages 1..4096, rounds 1..10000\n", string(out))
}
