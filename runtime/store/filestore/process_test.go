//go:build unix

package filestore

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/runtime/store"
	"github.com/kvreshard/kvreshard/runtime/store/storetest"
)

// The tests below run this test binary again as writer processes. The
// helper's arguments travel in environment variables.
const (
	envMode = "KVRESHARD_FILESTORE_HELPER"
	envDir  = "KVRESHARD_FILESTORE_DIR"
	envArgs = "KVRESHARD_FILESTORE_ARGS"
)

// TestHelperProcess is a writer process, not a test.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(envMode)
	if mode == "" {
		t.Skip("run by the multi-process tests")
	}
	s, err := Open(os.Getenv(envDir), Options{})
	if err != nil {
		fail(err)
	}
	args := strings.Split(os.Getenv(envArgs), "|")
	switch mode {
	case "race":
		// args: manifest, sizes, key prefix, key count, seed
		sizes := ints(strings.Split(args[1], ","))
		nkeys := ints(args[3:4])[0]
		seed := ints(args[4:5])[0]
		go_ := filepath.Join(s.Dir(), "go")
		for {
			if _, err := os.Stat(go_); err == nil {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if err := storetest.RaceWrite(s, args[0], sizes, raceKeys(args[2], nkeys), uint64(seed)); err != nil {
			fail(err)
		}
	case "killed":
		// args: key. Writes part 1, then starts part 0 and blocks in it.
		l := bigLayout()
		require.Equal(t, []error{nil}, s.WriteParts(context.Background(), []store.PartWrite{l.write(args[0], 1)}))
		testHookFragment = func(part, fragment int) {
			if fragment == 3 {
				fmt.Println("blocked")
				select {} // until killed
			}
		}
		s.WriteParts(context.Background(), []store.PartWrite{l.write(args[0], 0)})
		fail(fmt.Errorf("part 0 was written"))
	}
	os.Exit(0)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}

func ints(ss []string) []int {
	var n []int
	for _, s := range ss {
		i, err := strconv.Atoi(s)
		if err != nil {
			fail(err)
		}
		n = append(n, i)
	}
	return n
}

func raceKeys(prefix string, n int) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return ks
}

func helper(t *testing.T, dir, mode string, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), envMode+"="+mode, envDir+"="+dir, envArgs+"="+strings.Join(args, "|"))
	cmd.Stderr = os.Stderr
	t.Cleanup(func() {
		if cmd.Process != nil {
			cmd.Process.Kill() // in case the test failed before the child ended
		}
	})
	return cmd
}

// TestProcessesRace has writer processes of two layouts race on the same
// keys: every key ends complete in exactly one layout, never mixed.
func TestProcessesRace(t *testing.T) {
	dir := t.TempDir()
	const nkeys = 120
	layouts := map[string][]int{"kv/d/manifests/a": {3000, 5000}, "kv/d/manifests/b": {2000, 2000, 4000}}
	var cmds []*exec.Cmd
	for i := range 4 {
		m := "kv/d/manifests/a"
		if i%2 == 1 {
			m = "kv/d/manifests/b"
		}
		sizes := fmt.Sprint(layouts[m][0])
		for _, n := range layouts[m][1:] {
			sizes += "," + strconv.Itoa(n)
		}
		cmd := helper(t, dir, "race", m, sizes, "page", strconv.Itoa(nkeys), strconv.Itoa(i))
		require.NoError(t, cmd.Start())
		cmds = append(cmds, cmd)
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go"), nil, 0o666))
	for _, cmd := range cmds {
		require.NoError(t, cmd.Wait())
	}
	s, err := Open(dir, Options{})
	require.NoError(t, err)
	defer s.Close()
	ks := raceKeys("page", nkeys)
	storetest.CheckRaced(t, s, ks, layouts)
	objs, err := s.Query(context.Background(), ks)
	require.NoError(t, err)
	won := map[string]int{}
	for _, o := range objs {
		won[o.Manifest]++
	}
	t.Logf("keys won per layout: %v", won)
}

// bigLayout is the layout of TestKilledWriter: part 0 is 2 MiB in 8
// fragments.
type bigLayoutT struct{ manifest string }

func bigLayout() bigLayoutT { return bigLayoutT{"kv/d/manifests/big"} }

func (l bigLayoutT) data(key string, part int) []byte {
	return storetest.Pattern(fmt.Sprintf("%s/%s/%d", l.manifest, key, part), []int{2 << 20, 1000}[part])
}

func (l bigLayoutT) write(key string, part int) store.PartWrite {
	b := l.data(key, part)
	var frags [][]byte
	for len(b) > 256<<10 {
		frags = append(frags, b[:256<<10])
		b = b[256<<10:]
	}
	frags = append(frags, b)
	return store.PartWrite{Key: key, Part: part, Parts: 2, Manifest: l.manifest, Data: frags, Checksum: store.PartChecksum(l.manifest, part, frags)}
}

func (l bigLayoutT) sum(key string, part int) uint64 { return l.write(key, part).Checksum }

// TestKilledWriter kills a writer process in the middle of a part: the part
// never reads as written, the object is not complete, and another process's
// retry completes it with the right bytes.
func TestKilledWriter(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	const key = "kv_killed"
	cmd := helper(t, dir, "killed", key)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "blocked\n", line)

	s, err := Open(dir, Options{})
	require.NoError(t, err)
	defer s.Close()
	tmps, err := filepath.Glob(filepath.Join(s.objectDir(key), ".tmp-*"))
	require.NoError(t, err)
	require.Len(t, tmps, 1, "the child is writing part 0")
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	require.EqualError(t, cmd.Wait(), "signal: killed")

	objs, err := s.Query(ctx, []string{key})
	require.NoError(t, err)
	require.Equal(t, []store.Object{{}}, objs)
	for part, size := range []int{2 << 20, 1000} {
		n, err := s.ReadRanges(ctx, []store.Range{{Key: key, Part: part, Dst: [][]byte{make([]byte, size)}}})
		require.Equal(t, 0, n)
		require.EqualError(t, err, fmt.Sprintf("read kv_killed part %d [0,%d): not found", part, size))
	}
	require.NoFileExists(t, filepath.Join(s.objectDir(key), "part-0"))
	fi, err := os.Stat(tmps[0])
	require.NoError(t, err)
	require.Equal(t, int64(4*256<<10), fi.Size(), "the child wrote 4 fragments")

	// This process retries part 0 and completes the object.
	l := bigLayout()
	require.Equal(t, []error{nil}, s.WriteParts(ctx, []store.PartWrite{l.write(key, 0)}))
	objs, err = s.Query(ctx, []string{key})
	require.NoError(t, err)
	require.Equal(t, []store.Object{{Complete: true, Manifest: l.manifest, PartSizes: []int{2 << 20, 1000}, Checksums: []uint64{l.sum(key, 0), l.sum(key, 1)}}}, objs)
	for part, size := range []int{2 << 20, 1000} {
		got := make([]byte, size)
		n, err := s.ReadRanges(ctx, []store.Range{{Key: key, Part: part, Dst: [][]byte{got}}})
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, l.data(key, part), got)
	}
}
