package tests

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// venvPython is the interpreter of the Python tests, relative to the
// repository's root: that of the virtual environment make venv makes
// (make test makes it first), with pytest, numpy and Mooncake's wheel.
const venvPython = ".venv/bin/python"

// TestPython runs the Python package's tests (python/tests) with pytest:
// pages resharded between TP1/PP3 and TP2/PP2 in every pool and part
// layout, writers and readers in separate Python processes, the SGLang
// HiCache backend on host pools of SGLang's shapes, threads, fork, and a
// pip build of the package. pytest builds libkvreshard once into a
// temporary directory. Without the virtual environment it skips, unless
// KVRESHARD_REQUIRE_PYTHON=1 (CI), where it fails.
func TestPython(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	python := filepath.Join(root, venvPython)
	if out, err := exec.Command(python, "-c", "import pytest, numpy").CombinedOutput(); err != nil {
		msg := "the Python tests need " + python + " with pytest and numpy (make venv): " +
			strings.TrimSpace(err.Error()+"\n"+string(out))
		if os.Getenv("KVRESHARD_REQUIRE_PYTHON") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	// No cache or bytecode left in the tree; KVRESHARD_LIB unset, so that
	// pytest builds the library of this tree.
	cmd := exec.CommandContext(ctx, python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "python/tests")
	cmd.Dir = root
	cmd.Env = append(withoutEnv(os.Environ(), "KVRESHARD_LIB"), "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s -m pytest python/tests: %v\n%s", python, err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	t.Log(lines[len(lines)-1])
}

// withoutEnv returns env without the variable name.
func withoutEnv(env []string, name string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}
