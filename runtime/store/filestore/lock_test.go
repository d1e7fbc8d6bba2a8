package filestore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestLockWaitIsTheBatchs: the lock wait is spent by a batch's waits in
// all. A wait for a held lock spends what is left of it; once it is spent,
// a held lock fails at once (the bound's timer is of zero), with the
// batch's message; a free lock is still taken.
func TestLockWaitIsTheBatchs(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{LockWait: 50 * time.Millisecond})
	require.NoError(t, err)
	defer s.Close()
	open := func(name string) int {
		fd, err := unix.Open(filepath.Join(dir, name), unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o666)
		require.NoError(t, err)
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	// Another open file description of the same file holds its lock, as
	// another writer would.
	for _, name := range []string{"held1", "held2"} {
		ok, err := tryFlock(open(name), name, unix.LOCK_EX)
		require.True(t, ok)
		require.NoError(t, err)
	}
	ctx := context.Background()
	wait := &lockBudget{left: s.lockWait}
	err = s.waitFlock(ctx, wait, open("held1"), "held1", unix.LOCK_SH)
	var held *lockHeldError
	require.True(t, errors.As(err, &held))
	require.EqualError(t, err, "lock held1 is held by another writer; the batch's lock wait (50ms) is spent")
	require.Zero(t, wait.left, "the wait spent the batch's lock wait")
	err = s.waitFlock(ctx, wait, open("held2"), "held2", unix.LOCK_SH)
	require.EqualError(t, err, "lock held2 is held by another writer; the batch's lock wait (50ms) is spent")
	require.NoError(t, s.waitFlock(ctx, wait, open("free"), "free", unix.LOCK_EX))
	require.Zero(t, wait.left)

	// A lock taken without waiting spends nothing.
	wait = &lockBudget{left: time.Hour}
	require.NoError(t, s.waitFlock(ctx, wait, open("free2"), "free2", unix.LOCK_EX))
	require.Equal(t, time.Hour, wait.left)
	_, err = os.Stat(filepath.Join(dir, "free2"))
	require.NoError(t, err)
}
