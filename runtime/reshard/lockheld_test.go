//go:build unix

package reshard_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/reshard"
	"github.com/kvreshard/kvreshard/runtime/store"
	"github.com/kvreshard/kvreshard/runtime/store/filestore"
)

const envHold = "KVRESHARD_RESHARD_HOLD" // the file TestLockHolderProcess locks

// TestLockHolderProcess locks a file exclusively and holds it until it is
// killed; it is not a test.
func TestLockHolderProcess(t *testing.T) {
	path := os.Getenv(envHold)
	if path == "" {
		t.Skip("run by TestWriterLockHeld")
	}
	fd, err := syscall.Open(path, syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err == nil {
		err = syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("locked")
	select {}
}

// TestWriterLockHeld: while another process holds a page's claim lock in
// the file store (as a writer stopped while it cleans up would), a rank
// writing that page reports it Failed, with the store's error naming the
// lock and the wait, and writes the other pages of the request.
func TestWriterLockHeld(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := filestore.Open(dir, filestore.Options{LockWait: 200 * time.Millisecond})
	require.NoError(t, err)
	defer st.Close()
	keys := content.PageKeys("held", small.Domain(), 3)
	m := manifestOf(t, small, tp2pp2, builtin(t, "PLHD"))
	got := writeRanks(t, st, m, tp2pp2, []placement.Rank{{TP: 1, PP: 0}}, "page_first", keys[:1])
	require.Equal(t, []reshard.Status{reshard.Written}, got[placement.Rank{TP: 1, PP: 0}])
	claims, err := filepath.Glob(filepath.Join(dir, "objects-v3", "*", "*", "claim"))
	require.NoError(t, err)
	require.Len(t, claims, 1, "page 0's claim")

	cmd := exec.Command(os.Args[0], "-test.run=^TestLockHolderProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), envHold+"="+claims[0])
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "locked\n", line)

	r := placement.Rank{TP: 0, PP: 0}
	part, writes, err := tp2pp2.Writer(&m.Descriptor, r)
	require.NoError(t, err)
	require.True(t, writes)
	b, err := plan.BindingFor(&m.Descriptor, tp2pp2, r, builtin(t, "page_first"), len(keys))
	require.NoError(t, err)
	w, err := reshard.NewWriter(st, m, part, true, b)
	require.NoError(t, err)
	regions := w.Geometry().NewRegions()
	for i, k := range keys {
		content.Fill(w.Geometry(), regions, i, content.Seed(k))
	}
	res, err := w.Write(ctx, keys, iota(len(keys)), regions)
	require.NoError(t, err)
	require.Len(t, res, 3)
	require.Equal(t, reshard.Failed, res[0].Status)
	require.EqualError(t, res[0].Err, fmt.Sprintf("write %s part %d: lock %s is held by another writer; the batch's lock wait (200ms) is spent", keys[0], part, claims[0]))
	require.Equal(t, []reshard.PageResult{{Key: keys[1], Status: reshard.Written}, {Key: keys[2], Status: reshard.Written}}, res[1:])
	stats := w.Stats()
	require.Equal(t, [3]int64{1, 2, 0}, [3]int64{stats.Failed, stats.Written, stats.Refused})
	require.Equal(t, []store.Object{{}, {}, {}}, query(t, st, keys))

	// Once the holder is gone, the page's part is written.
	require.NoError(t, cmd.Process.Kill())
	require.EqualError(t, cmd.Wait(), "signal: killed")
	res, err = w.Write(ctx, keys[:1], []int{0}, regions)
	require.NoError(t, err)
	require.Equal(t, []reshard.PageResult{{Key: keys[0], Status: reshard.Written}}, res)
}
