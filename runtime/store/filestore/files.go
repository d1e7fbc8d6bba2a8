// Files: whole writes through temporary files, and opens that take only
// regular files.

package filestore

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// fileWrite says how writeFile writes a file.
type fileWrite struct {
	replace bool // rename over the path instead of linking to it
	stamp   bool // set the file's modification time to the store's clock
	// part >= 0 is the part the file is; its fragments run fragment and
	// Store.onFragment.
	part     int
	fragment func() // after each fragment but the last
}

// writeFile writes the concatenated data to a temporary file beside path
// and links it to path unless path exists (created is then false), or, with
// replace, renames it over path.
func (s *Store) writeFile(path string, data [][]byte, how fileWrite) (created bool, err error) {
	if !how.replace {
		if _, err := os.Lstat(path); err == nil {
			return false, nil
		}
	}
	dir := filepath.Dir(path)
	tmp, fd, err := createTemp(dir)
	if errors.Is(err, fs.ErrNotExist) {
		if err := s.mkdir(dir); err != nil {
			return false, err
		}
		tmp, fd, err = createTemp(dir)
	}
	if err != nil {
		return false, err
	}
	defer unix.Unlink(tmp)
	if err := s.writeTemp(fd, tmp, data, how); err != nil {
		unix.Close(fd)
		return false, err
	}
	if err := unix.Close(fd); err != nil {
		return false, &fs.PathError{Op: "close", Path: tmp, Err: err}
	}
	if how.stamp {
		now := s.now()
		if err := os.Chtimes(tmp, now, now); err != nil {
			return false, err
		}
	}
	if how.replace {
		err = os.Rename(tmp, path)
	} else {
		err = os.Link(tmp, path)
	}
	if err != nil {
		if !how.replace && errors.Is(err, fs.ErrExist) {
			return false, nil
		}
		return false, err
	}
	if s.sync {
		if err := syncDir(dir); err != nil {
			return false, err
		}
	}
	return true, nil
}

// writeTemp writes data to the temporary file fd, and syncs it if the
// store syncs.
func (s *Store) writeTemp(fd int, tmp string, data [][]byte, how fileWrite) error {
	for i, d := range data {
		for len(d) > 0 {
			n, err := unix.Write(fd, d)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return &fs.PathError{Op: "write", Path: tmp, Err: err}
			}
			d = d[n:]
		}
		if how.part >= 0 && i < len(data)-1 {
			if how.fragment != nil {
				how.fragment()
			}
			if s.onFragment != nil {
				s.onFragment(how.part, i)
			}
		}
	}
	if s.sync {
		if err := unix.Fsync(fd); err != nil {
			return &fs.PathError{Op: "sync", Path: tmp, Err: err}
		}
	}
	return nil
}

// createTemp creates a temporary file in dir.
func createTemp(dir string) (string, int, error) {
	var b [8]byte
	rand.Read(b[:])
	path := filepath.Join(dir, ".tmp-"+hex.EncodeToString(b[:]))
	for {
		fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o666)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return "", -1, &fs.PathError{Op: "open", Path: path, Err: err}
		}
		return path, fd, nil
	}
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// notRegularError is a path that is not a regular file.
type notRegularError struct {
	path string
	mode fs.FileMode
}

func (e *notRegularError) Error() string {
	kind := "not a regular file"
	switch t := e.mode.Type(); {
	case t&fs.ModeDir != 0:
		kind = "a directory"
	case t&fs.ModeNamedPipe != 0:
		kind = "a FIFO"
	case t&fs.ModeSymlink != 0:
		kind = "a symbolic link"
	case t&fs.ModeSocket != 0:
		kind = "a socket"
	case t&fs.ModeDevice != 0:
		kind = "a device"
	}
	return fmt.Sprintf("%s is %s, not a regular file", e.path, kind)
}

// openFd is open for a file that is read with system calls and closed with
// unix.Close: it returns the descriptor, left non-blocking (which does not
// change reads of a regular file), and the file's status. When the process
// is out of file descriptors it closes the cached part files and tries once
// more.
func (s *Store) openFd(path string, flag int) (int, *unix.Stat_t, error) {
	fd, st, err := openRegular(path, flag)
	if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
		s.dropFiles()
		fd, st, err = openRegular(path, flag)
	}
	return fd, st, err
}

func openRegular(path string, flag int) (int, *unix.Stat_t, error) {
	var fd int
	var err error
	for {
		fd, err = unix.Open(path, flag|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o666)
		if err != unix.EINTR {
			break
		}
	}
	switch {
	case err == unix.EISDIR: // opened for writing
		return -1, nil, &notRegularError{path, fs.ModeDir}
	case err == unix.ELOOP:
		if fi, lerr := os.Lstat(path); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return -1, nil, &notRegularError{path, fi.Mode()}
		}
		fallthrough
	case err != nil:
		return -1, nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	st := new(unix.Stat_t)
	if err := unix.Fstat(fd, st); err != nil {
		unix.Close(fd)
		return -1, nil, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		mode := fs.FileMode(0)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			mode = fs.ModeDir
		case unix.S_IFIFO:
			mode = fs.ModeNamedPipe
		case unix.S_IFSOCK:
			mode = fs.ModeSocket
		case unix.S_IFCHR, unix.S_IFBLK:
			mode = fs.ModeDevice
		default:
			mode = fs.ModeIrregular
		}
		return -1, nil, &notRegularError{path, mode}
	}
	return fd, st, nil
}

// readSmall reads a regular file of at most limit bytes, and returns it with
// its modification time. It never reads more than limit+1 bytes. A bigger
// file gives a *tooBigError, with the modification time.
func (s *Store) readSmall(path string, limit int64) ([]byte, time.Time, error) {
	fd, st, err := s.openFd(path, unix.O_RDONLY)
	if err != nil {
		return nil, time.Time{}, err
	}
	defer unix.Close(fd)
	mtime := time.Unix(st.Mtim.Unix())
	b, err := readFd(fd, path, st.Size, limit)
	if err != nil {
		var tooBig *tooBigError
		if !errors.As(err, &tooBig) {
			mtime = time.Time{}
		}
		return nil, mtime, err
	}
	return b, mtime, nil
}

// readFd reads the open regular file fd of size bytes, path, from its
// start, and gives a *tooBigError if it is more than limit bytes. It never
// reads more than limit+1 bytes.
func readFd(fd int, path string, size, limit int64) ([]byte, error) {
	if size > limit {
		return nil, &tooBigError{path, size, limit}
	}
	// The file may grow while it is read: read up to limit+1 bytes.
	b := make([]byte, 0, size+1)
	for int64(len(b)) <= limit {
		if len(b) == cap(b) {
			b = slices.Grow(b, int(min(int64(cap(b)), limit+1-int64(len(b)))))
		}
		m, err := unix.Pread(fd, b[len(b):min(int64(cap(b)), limit+1)], int64(len(b)))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &fs.PathError{Op: "read", Path: path, Err: err}
		}
		if m == 0 {
			return b, nil
		}
		b = b[:len(b)+m]
	}
	return nil, &tooBigError{path, -1, limit}
}

// tooBigError is a file past the size its kind may have.
type tooBigError struct {
	path        string
	size, limit int64 // size -1: more than the limit
}

func (e *tooBigError) Error() string {
	if e.size < 0 {
		return fmt.Sprintf("%s is more than %d bytes; the limit is %d", e.path, e.limit, e.limit)
	}
	return fmt.Sprintf("%s is %d bytes; the limit is %d", e.path, e.size, e.limit)
}
