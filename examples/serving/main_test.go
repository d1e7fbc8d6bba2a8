package main

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPrefillThenDecode runs the example as two processes on one file
// store: prefill stores its pages and exits; decode, with another
// topology and pool layout, reads the shared prefix and verifies it.
func TestPrefillThenDecode(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "serving")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, string(out))
	url := "file://" + filepath.Join(dir, "kv")
	run := func(args ...string) (string, string, int) {
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else {
			require.NoError(t, err)
		}
		return stdout.String(), stderr.String(), code
	}

	stdout, stderr, code := run("-role", "prefill", "-store", url)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, `prefill rank 0/0 (heads 0-1): wrote its part of 4 of 4 pages in PLHD
prefill rank 1/0 (heads 2-3): wrote its part of 4 of 4 pages in PLHD
`, stdout)

	// Each rank reads 4 pages of 4 layers x 4 heads x 16 tokens x (64+64)
	// x 2 bytes, in 2 reads a page: auto on the file store's cost model
	// reads each of the page's two parts once, across the other layers'
	// bytes, and copies its layers out.
	stdout, stderr, code = run("-role", "decode", "-store", url)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, `decode rank 0/0 (layers 0-3): read 4 of 6 pages, 262144 bytes in 8 reads, every element verified; prefill resumes at token 64
decode rank 0/1 (layers 4-7): read 4 of 6 pages, 262144 bytes in 8 reads, every element verified; prefill resumes at token 64
`, stdout)

	// Prefill again: every page is complete, so nothing is written.
	stdout, _, code = run("-role", "prefill", "-store", url)
	require.Equal(t, 0, code)
	require.Equal(t, `prefill rank 0/0 (heads 0-1): wrote its part of 0 of 4 pages in PLHD
prefill rank 1/0 (heads 2-3): wrote its part of 0 of 4 pages in PLHD
`, stdout)

	// Both roles in one process, on the memory store: the same pages.
	stdout, stderr, code = run("-store", "mem://serving")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, `prefill rank 0/0 (heads 0-1): wrote its part of 4 of 4 pages in PLHD
prefill rank 1/0 (heads 2-3): wrote its part of 4 of 4 pages in PLHD
decode rank 0/0 (layers 0-3): read 4 of 6 pages, 262144 bytes in 8 reads, every element verified; prefill resumes at token 64
decode rank 0/1 (layers 4-7): read 4 of 6 pages, 262144 bytes in 8 reads, every element verified; prefill resumes at token 64
`, stdout)

	_, stderr, code = run("-role", "x")
	require.Equal(t, 2, code)
	require.Equal(t, "serving: -role \"x\": want prefill, decode or both\n", stderr)
}
