package main

import (
	"bytes"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/tools/txtar"
)

var update = flag.Bool("update", false, "rewrite the expected sections of testdata/golden/*.txtar")

// TestGolden runs kvlc on every case of testdata/golden/<case>.txtar. The
// archive's comment holds the command line ("args: ..."), the exit status
// ("exit: N") and any environment ("env: NAME=value"). Its files are
// written to an empty directory, where kvlc runs: a go.mod has $REPO
// replaced by this checkout and gets its go.sum, so that kvlc can load and
// type-check the package as in a framework's module. The sections "stdout"
// and "stderr" are what kvlc must print (nothing when absent), and
// "want/<path>" each file it must write; it must write nothing else.
func TestGolden(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "golden", "*.txtar"))
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(files), 10)
	repo, err := filepath.Abs("../..")
	require.NoError(t, err)
	sum, err := os.ReadFile(filepath.Join(repo, "go.sum"))
	require.NoError(t, err)
	for _, file := range files {
		file, err := filepath.Abs(file)
		require.NoError(t, err)
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txtar"), func(t *testing.T) {
			ar, err := txtar.ParseFile(file)
			require.NoError(t, err)
			var args []string
			exit := 0
			t.Setenv("GOPACKAGE", "")
			t.Setenv("GOFLAGS", "-mod=mod")
			t.Setenv("GOPROXY", "off")
			t.Setenv("GOWORK", "off")
			for _, line := range strings.Split(string(ar.Comment), "\n") {
				key, val, _ := strings.Cut(line, ": ")
				switch key {
				case "args":
					args = strings.Fields(val)
				case "exit":
					exit, err = strconv.Atoi(val)
					require.NoError(t, err)
				case "env":
					k, v, _ := strings.Cut(val, "=")
					t.Setenv(k, v)
				}
			}
			dir := t.TempDir()
			want := map[string]string{}
			var stdoutWant, stderrWant string
			inputs := map[string]bool{}
			for _, f := range ar.Files {
				switch {
				case f.Name == "stdout":
					stdoutWant = string(f.Data)
				case f.Name == "stderr":
					stderrWant = string(f.Data)
				case strings.HasPrefix(f.Name, "want/"):
					want[strings.TrimPrefix(f.Name, "want/")] = string(f.Data)
				default:
					data := f.Data
					if f.Name == "go.mod" {
						data = bytes.ReplaceAll(data, []byte("$REPO"), []byte(repo))
						writeFile(t, filepath.Join(dir, "go.sum"), string(sum))
						inputs["go.sum"] = true
					}
					writeFile(t, filepath.Join(dir, f.Name), string(data))
					inputs[f.Name] = true
				}
			}
			t.Chdir(dir)
			code, stdout, stderr := kvlc(t, args...)
			stderr = strings.ReplaceAll(stderr, dir, "$DIR")
			got := map[string]string{}
			require.NoError(t, filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() || inputs[filepath.ToSlash(path)] {
					return err
				}
				b, err := os.ReadFile(path)
				got[filepath.ToSlash(path)] = string(b)
				return err
			}))
			if *update {
				rewrite(t, file, ar, code, stdout, stderr, got)
				return
			}
			require.Equal(t, exit, code, "stderr: %s", stderr)
			require.Equal(t, stdoutWant, stdout)
			require.Equal(t, stderrWant, stderr)
			require.Equal(t, want, got)
		})
	}
}

// rewrite stores what kvlc did as the expected sections of the archive.
func rewrite(t *testing.T, file string, ar *txtar.Archive, code int, stdout, stderr string, got map[string]string) {
	var lines []string
	for _, line := range strings.Split(strings.TrimSuffix(string(ar.Comment), "\n"), "\n") {
		if !strings.HasPrefix(line, "exit: ") {
			lines = append(lines, line)
		}
	}
	lines = append(lines, fmt.Sprintf("exit: %d", code))
	out := &txtar.Archive{Comment: []byte(strings.Join(lines, "\n") + "\n")}
	for _, f := range ar.Files {
		if f.Name != "stdout" && f.Name != "stderr" && !strings.HasPrefix(f.Name, "want/") {
			out.Files = append(out.Files, f)
		}
	}
	if stdout != "" {
		out.Files = append(out.Files, txtar.File{Name: "stdout", Data: []byte(stdout)})
	}
	if stderr != "" {
		out.Files = append(out.Files, txtar.File{Name: "stderr", Data: []byte(stderr)})
	}
	var names []string
	for name := range got {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		out.Files = append(out.Files, txtar.File{Name: "want/" + name, Data: []byte(got[name])})
	}
	require.NoError(t, os.WriteFile(file, txtar.Format(out), 0o644))
}
