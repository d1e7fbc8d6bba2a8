package filestore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// Backoff between tries of a lock that another writer holds.
const (
	minLockBackoff = time.Millisecond
	maxLockBackoff = 32 * time.Millisecond
)

// lockHeldError is a lock that a writer could not take in time.
type lockHeldError struct {
	path string
	wait time.Duration // the store's lock wait, when the batch's was spent
	err  error         // the context's error, when its deadline ended the wait
}

func (e *lockHeldError) Error() string {
	if e.err != nil {
		return fmt.Sprintf("lock %s is held by another writer; waited until the context's deadline", e.path)
	}
	return fmt.Sprintf("lock %s is held by another writer; the batch's lock wait (%v) is spent", e.path, e.wait)
}

func (e *lockHeldError) Unwrap() error { return e.err }

// tryFlock applies the flock operation how (LOCK_SH or LOCK_EX) without
// waiting, and reports whether it took the lock. Converting a lock that fd
// holds is not atomic: when it fails, fd may hold none.
func tryFlock(fd int, path string, how int) (bool, error) {
	for {
		switch err := unix.Flock(fd, how|unix.LOCK_NB); err {
		case nil:
			return true, nil
		case unix.EINTR:
		case unix.EWOULDBLOCK:
			return false, nil
		default:
			return false, fmt.Errorf("lock %s: %w", path, err)
		}
	}
}

// lockBudget is what is left of a batch's lock wait: the time its writes
// may still wait for locks that other writers hold.
type lockBudget struct{ left time.Duration }

// waitFlock takes a lock on fd, trying again with a short backoff while
// another holds it, for at most what is left of the batch's lock wait
// (which it spends) and until ctx's deadline. It never blocks in flock.
// When the wait ends it gives a *lockHeldError; when ctx is cancelled it
// returns ctx.Err() at once.
func (s *Store) waitFlock(ctx context.Context, wait *lockBudget, fd int, path string, how int) error {
	if ok, err := tryFlock(fd, path, how); ok || err != nil {
		return err
	}
	start := time.Now()
	defer func() { wait.left = max(0, wait.left-time.Since(start)) }()
	bound := time.NewTimer(wait.left)
	defer bound.Stop()
	backoff := minLockBackoff
	retry := time.NewTimer(backoff)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return &lockHeldError{path: path, err: ctx.Err()}
			}
			return ctx.Err()
		case <-bound.C:
			if ok, err := tryFlock(fd, path, how); ok || err != nil {
				return err
			}
			return &lockHeldError{path: path, wait: s.lockWait}
		case <-retry.C:
		}
		if ok, err := tryFlock(fd, path, how); ok || err != nil {
			return err
		}
		backoff = min(2*backoff, maxLockBackoff)
		retry.Reset(backoff)
	}
}

// claimFile is an object's claim file, open. Its lock is the lock of the
// writers of its generation: a takeover replaces the file, and with it the
// lock, so that a writer stopped while holding the old one holds up nobody.
type claimFile struct {
	fd       int
	path     string
	dev, ino uint64
	mtime    time.Time
	c        *claim // nil when bad is set
	bad      error  // a *corruptError or *tooBigError: the claim does not parse
}

// openClaim opens and reads the claim at path. An error that is neither of
// those in claimFile.bad leaves nothing open.
func (s *Store) openClaim(path string) (*claimFile, error) {
	// Read-write: flock on NFS is a byte-range lock, which needs it.
	fd, st, err := s.openFd(path, unix.O_RDWR)
	if err != nil {
		return nil, err
	}
	b, err := readFd(fd, path, st.Size, maxClaimBytes)
	cl := &claimFile{fd: fd, path: path, dev: uint64(st.Dev), ino: uint64(st.Ino), mtime: time.Unix(st.Mtim.Unix())}
	if err == nil {
		cl.c, err = parseClaim(path, b)
	}
	var corrupt *corruptError
	var tooBig *tooBigError
	if errors.As(err, &corrupt) || errors.As(err, &tooBig) {
		cl.bad = err
	} else if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return cl, nil
}

// close closes the claim file, which releases its lock.
func (cl *claimFile) close() { unix.Close(cl.fd) }

// current reports whether the claim is still the object's: claims are
// replaced by rename only, and cl's file, held open, keeps its inode number.
func (cl *claimFile) current() (bool, error) {
	var st unix.Stat_t
	if err := unix.Lstat(cl.path, &st); err != nil {
		if err == unix.ENOENT {
			return false, nil
		}
		return false, &fs.PathError{Op: "lstat", Path: cl.path, Err: err}
	}
	return uint64(st.Dev) == cl.dev && uint64(st.Ino) == cl.ino, nil
}

// modTime returns the claim's modification time now.
func (cl *claimFile) modTime() (time.Time, error) {
	var st unix.Stat_t
	if err := unix.Fstat(cl.fd, &st); err != nil {
		return time.Time{}, &fs.PathError{Op: "stat", Path: cl.path, Err: err}
	}
	return time.Unix(st.Mtim.Unix()), nil
}

// stamp sets the claim's modification time to t. It sets that of the file
// cl holds open, so that a writer whose claim was replaced while it wrote
// never refreshes the claim that replaced it.
func (cl *claimFile) stamp(t time.Time) error {
	if err := futimens(cl.fd, t); err != nil {
		return &fs.PathError{Op: "utimes", Path: cl.path, Err: err}
	}
	return nil
}

// expired reports whether a claim last written at mtime is older than the
// lease.
func (s *Store) expired(mtime time.Time) bool { return s.now().Sub(mtime) > s.lease }

// lockTakeover opens the object's lock file, creating it if it is missing,
// and locks it exclusively, waiting as waitFlock does; it then sets the
// file's modification time to the time it took the lock. A lock file that
// its holder took longer ago than the lease is stale (the holder is stopped:
// a takeover holds it for a moment): lockTakeover then returns -1 and no
// error, and the caller goes on without the lock. Close a descriptor it
// returns to release the lock.
func (s *Store) lockTakeover(ctx context.Context, wait *lockBudget, dir string) (int, error) {
	path := filepath.Join(dir, "lock")
	fd, _, err := s.openFd(path, unix.O_RDWR|unix.O_CREAT)
	if err != nil {
		return -1, err
	}
	err = s.waitFlock(ctx, wait, fd, path, unix.LOCK_EX)
	if held := (*lockHeldError)(nil); errors.As(err, &held) && held.err == nil {
		var st unix.Stat_t
		if ferr := unix.Fstat(fd, &st); ferr == nil && s.expired(time.Unix(st.Mtim.Unix())) {
			unix.Close(fd)
			return -1, nil
		}
	}
	if err == nil {
		if err = futimens(fd, s.now()); err != nil {
			err = &fs.PathError{Op: "utimes", Path: path, Err: err}
		}
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}
