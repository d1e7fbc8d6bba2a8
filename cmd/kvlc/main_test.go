package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler"
	"github.com/kvreshard/kvreshard/gen"
)

const usage = `usage: kvlc [-o out.go] [-pkg name] [-check] file.kvl...
  -check
    	write nothing; exit 1 if the output is missing or stale
  -o file
    	output file (default: first input with _kvl.go for .kvl)
  -pkg name
    	package name of the output (default: $GOPACKAGE, else the output directory's name)
`

const small = `// A custom part and a custom pool.
part flash "vLLM flash" { order L C T H D }
pool host { order L C S T H D }
`

// kvlc runs the command and returns its exit code, stdout and stderr.
func kvlc(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(name), 0o755))
	require.NoError(t, os.WriteFile(name, []byte(text), 0o644))
	return name
}

// generated is what kvlc must write for one .kvl file.
func generated(t *testing.T, name, text, pkg string) []byte {
	t.Helper()
	f, err := compiler.Compile(name, []byte(text))
	require.NoError(t, err)
	src, err := gen.Generate(f, pkg)
	require.NoError(t, err)
	return src
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		stderr string
	}{
		{"no args", nil, "kvlc: no .kvl files given\n" + usage},
		{"only flags", []string{"-o", "x.go"}, "kvlc: no .kvl files given\n" + usage},
		{"unknown flag", []string{"-x", "a.kvl"}, "flag provided but not defined: -x\n" + usage},
		{"flag without value", []string{"-o"}, "flag needs an argument: -o\n" + usage},
		{"not a .kvl file", []string{"layouts.txt"}, "kvlc: layouts.txt: not a .kvl file\n"},
		{"second file not .kvl", []string{"a.kvl", "b.go"}, "kvlc: b.go: not a .kvl file\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := kvlc(t, tc.args...)
			require.Equal(t, 2, code)
			require.Empty(t, stdout)
			require.Equal(t, tc.stderr, stderr)
		})
	}
}

func TestMissingInput(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "nope.kvl")
	code, stdout, stderr := kvlc(t, in)
	require.Equal(t, 1, code)
	require.Empty(t, stdout)
	require.Equal(t, "kvlc: open "+in+": no such file or directory\n", stderr)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, entries)
}

// TestGoldenErrors runs kvlc on every failing case of the parser,
// ../../dsl/testdata/errors/<case>, and of kvlc, testdata/errors/<case>:
// each holds a layout.kvl and the exact stderr.txt. kvlc exits 1, prints
// nothing on stdout and writes no output file.
func TestGoldenErrors(t *testing.T) {
	var dirs []string
	for _, pattern := range []string{"../../dsl/testdata/errors/*", "testdata/errors/*"} {
		d, err := filepath.Glob(pattern)
		require.NoError(t, err)
		require.NotEmpty(t, d, pattern)
		dirs = append(dirs, d...)
	}
	for _, dir := range dirs {
		dir, err := filepath.Abs(dir)
		require.NoError(t, err)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			src, err := os.ReadFile(filepath.Join(dir, "layout.kvl"))
			require.NoError(t, err)
			want, err := os.ReadFile(filepath.Join(dir, "stderr.txt"))
			require.NoError(t, err)
			tmp := t.TempDir()
			writeFile(t, filepath.Join(tmp, "layout.kvl"), string(src))
			t.Chdir(tmp)
			code, stdout, stderr := kvlc(t, "-pkg", "x", "layout.kvl")
			require.Equal(t, 1, code)
			require.Empty(t, stdout)
			require.Equal(t, string(want), stderr)
			require.NoFileExists(t, "layout_kvl.go")
		})
	}
}

func TestErrorCap(t *testing.T) {
	var b strings.Builder
	for i := range 23 {
		b.WriteString("part p" + string(rune('a'+i)) + " { order C T L H }\n")
	}
	tmp := t.TempDir()
	writeFile(t, filepath.Join(tmp, "many.kvl"), b.String())
	t.Chdir(tmp)
	code, _, stderr := kvlc(t, "many.kvl")
	require.Equal(t, 1, code)
	lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
	require.Len(t, lines, 21)
	require.Equal(t, "many.kvl:1:1: layout pa is missing axis D", lines[0])
	require.Equal(t, "many.kvl:20:1: layout pt is missing axis D", lines[19])
	require.Equal(t, "kvlc: and 3 more errors", lines[20])

	// Exactly 20 errors: no count line.
	writeFile(t, filepath.Join(tmp, "twenty.kvl"), strings.Join(strings.SplitAfter(b.String(), "\n")[:20], ""))
	code, _, stderr = kvlc(t, "twenty.kvl")
	require.Equal(t, 1, code)
	require.Equal(t, 20, strings.Count(stderr, "\n"))
	require.NotContains(t, stderr, "more errors")
}

func TestGenerate(t *testing.T) {
	tmp := t.TempDir()
	in := writeFile(t, filepath.Join(tmp, "custom.kvl"), small)
	out := filepath.Join(tmp, "out", "kernels.go")
	require.NoError(t, os.Mkdir(filepath.Dir(out), 0o755))
	code, stdout, stderr := kvlc(t, "-o", out, "-pkg", "mykernels", in)
	require.Equal(t, 0, code, stderr)
	require.Empty(t, stdout)
	require.Empty(t, stderr)
	got, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Equal(t, string(generated(t, "custom.kvl", small, "mykernels")), string(got))
	require.True(t, strings.HasPrefix(string(got), "// Code generated by kvlc from custom.kvl; DO NOT EDIT.\n\npackage mykernels\n"))
	fi, err := os.Stat(out)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o644), fi.Mode().Perm())
}

// TestDefaults: the output is named after the first input and the package
// is $GOPACKAGE, else the output directory's name made an identifier.
func TestDefaults(t *testing.T) {
	tmp := t.TempDir()
	in := writeFile(t, filepath.Join(tmp, "my-kv.layouts", "custom.kvl"), small)
	out := filepath.Join(tmp, "my-kv.layouts", "custom_kvl.go")

	t.Setenv("GOPACKAGE", "")
	code, _, stderr := kvlc(t, in)
	require.Equal(t, 0, code, stderr)
	got, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Equal(t, string(generated(t, "custom.kvl", small, "my_kv_layouts")), string(got))

	t.Setenv("GOPACKAGE", "fromgenerate")
	code, _, stderr = kvlc(t, in)
	require.Equal(t, 0, code, stderr)
	got, err = os.ReadFile(out)
	require.NoError(t, err)
	require.Equal(t, string(generated(t, "custom.kvl", small, "fromgenerate")), string(got))
}

// TestSeveralFiles: the files compile as one unit, and a pair may join
// layouts of different files.
func TestSeveralFiles(t *testing.T) {
	tmp := t.TempDir()
	a := writeFile(t, filepath.Join(tmp, "a.kvl"), "part flash { order L C T H D }\n")
	b := writeFile(t, filepath.Join(tmp, "b.kvl"), "pool host { order L C S T H D }\n")
	code, _, stderr := kvlc(t, "-pkg", "p", a, b)
	require.Equal(t, 0, code, stderr)
	got, err := os.ReadFile(filepath.Join(tmp, "a_kvl.go"))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(got), "// Code generated by kvlc from a.kvl, b.kvl; DO NOT EDIT.\n"))
	require.Contains(t, string(got), "func range_5_flash_to_host(")
	require.Contains(t, string(got), "func copy_4_host_to_flash(")

	// A name declared in both files is an error citing the first.
	c := writeFile(t, filepath.Join(tmp, "c.kvl"), "\npool flash { order C S T L H D }\n")
	code, _, stderr = kvlc(t, "-pkg", "p", a, c)
	require.Equal(t, 1, code)
	require.Equal(t, c+`:2:1: duplicate layout "flash", first defined at `+a+":1:1\n", stderr)
}

func TestCheck(t *testing.T) {
	tmp := t.TempDir()
	in := writeFile(t, filepath.Join(tmp, "custom.kvl"), small)
	out := filepath.Join(tmp, "custom_kvl.go")
	stale := "kvlc: " + out + " is out of date; run go generate\n"

	// Missing output: stale, and -check writes nothing.
	code, stdout, stderr := kvlc(t, "-check", "-pkg", "p", in)
	require.Equal(t, 1, code)
	require.Empty(t, stdout)
	require.Equal(t, stale, stderr)
	require.NoFileExists(t, out)

	code, _, stderr = kvlc(t, "-pkg", "p", in)
	require.Equal(t, 0, code, stderr)
	code, stdout, stderr = kvlc(t, "-check", "-pkg", "p", in)
	require.Equal(t, 0, code)
	require.Empty(t, stdout)
	require.Empty(t, stderr)

	// Another package name, an edited output, an edited input: stale.
	code, _, stderr = kvlc(t, "-check", "-pkg", "q", in)
	require.Equal(t, 1, code)
	require.Equal(t, stale, stderr)

	fresh, err := os.ReadFile(out)
	require.NoError(t, err)
	writeFile(t, out, strings.Replace(string(fresh), "run := I * D", "run := D * I", 1))
	code, _, stderr = kvlc(t, "-check", "-pkg", "p", in)
	require.Equal(t, 1, code)
	require.Equal(t, stale, stderr)
	edited, err := os.ReadFile(out)
	require.NoError(t, err)
	require.NotEqual(t, string(fresh), string(edited), "-check must not rewrite the output")

	writeFile(t, out, string(fresh))
	writeFile(t, in, small+"part PLHD { order C T L H D }\n")
	code, _, stderr = kvlc(t, "-check", "-pkg", "p", in)
	require.Equal(t, 1, code)
	require.Equal(t, stale, stderr)

	// A bad .kvl under -check is a bad .kvl.
	writeFile(t, in, "part x { order C T L H }\n")
	code, _, stderr = kvlc(t, "-check", "-pkg", "p", in)
	require.Equal(t, 1, code)
	require.Equal(t, in+":1:1: layout x is missing axis D\n", stderr)
}

// TestAtomicWrite: a failing run leaves the old output alone, a successful
// one leaves no temporary file behind, and a reader racing with writers
// only ever sees a whole file.
func TestAtomicWrite(t *testing.T) {
	const tiny = "part flash { order L C T H D }\n"
	tmp := t.TempDir()
	in := writeFile(t, filepath.Join(tmp, "custom.kvl"), tiny)
	out := filepath.Join(tmp, "custom_kvl.go")
	writeFile(t, out, "old")

	bad := writeFile(t, filepath.Join(tmp, "bad.kvl"), "part x { order C T L H }\n")
	code, _, _ := kvlc(t, "-o", out, bad)
	require.Equal(t, 1, code)
	old, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Equal(t, "old", string(old))

	versions := map[string]bool{
		string(generated(t, "custom.kvl", tiny, "a")): true,
		string(generated(t, "custom.kvl", tiny, "b")): true,
	}
	code, _, stderr := kvlc(t, "-pkg", "a", in)
	require.Equal(t, 0, code, stderr)

	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(done)
		for i := range 12 {
			var stdout, stderr bytes.Buffer
			if run([]string{"-pkg", string(rune('a' + i%2)), in}, &stdout, &stderr) != 0 {
				t.Errorf("kvlc failed: %s", stderr.String())
				return
			}
		}
	}()
	reads := 0
	for running := true; running; reads++ {
		select {
		case <-done:
			running = false
		default:
		}
		b, err := os.ReadFile(out)
		require.NoError(t, err)
		require.True(t, versions[string(b)], "read a partial output of %d bytes", len(b))
		time.Sleep(100 * time.Microsecond) // leave the writers the CPU
	}
	wg.Wait()
	require.Greater(t, reads, 1)

	entries, err := os.ReadDir(tmp)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	require.Equal(t, []string{"bad.kvl", "custom.kvl", "custom_kvl.go"}, names)

	// An output directory that does not exist: exit 1, nothing written.
	code, _, stderr = kvlc(t, "-o", filepath.Join(tmp, "nodir", "out.go"), "-pkg", "p", in)
	require.Equal(t, 1, code)
	require.Regexp(t, "^kvlc: open "+regexp.QuoteMeta(filepath.Join(tmp, "nodir", ".out.go."))+"[0-9]+: no such file or directory\n$", stderr)
}

func TestHelpExitsZero(t *testing.T) {
	code, stdout, stderr := kvlc(t, "-h")
	require.Equal(t, 0, code)
	require.Empty(t, stdout)
	require.Equal(t, usage, stderr)
}
