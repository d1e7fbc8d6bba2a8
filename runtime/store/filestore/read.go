// Reads: what a process knows of complete objects, queries, metadata,
// range reads and the bounded set of open part files.

package filestore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/kvreshard/kvreshard/runtime/store"
)

func (s *Store) cached(key string) *object {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.objs[key]
}

// lookup returns the object under key if it is complete.
func (s *Store) lookup(key string) (*object, error) {
	if o := s.cached(key); o != nil {
		return o, nil
	}
	dir := s.objectDir(key)
	path := filepath.Join(dir, "claim")
	b, _, err := s.readSmall(path, maxClaimBytes)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	c, err := parseClaim(path, b)
	if err != nil {
		return nil, err
	}
	o := &object{dir: dir, gen: c.gen, manifest: c.manifest, sizes: make([]int, 0, min(c.parts, 64))}
	for p := range c.parts {
		size, err := s.partSize(key, c.gen, partPath(dir, c.gen, p), p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		o.sizes = append(o.sizes, size)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.objs) >= maxObjects {
		for k := range s.objs {
			delete(s.objs, k)
			break
		}
	}
	s.objs[key] = o
	return o, nil
}

// partSize returns the size of a part. It leaves the file open in the
// cache of open part files if there is room, for the reads that follow a
// query.
func (s *Store) partSize(key, gen, path string, part int) (int, error) {
	fd, st, err := s.openFd(path, unix.O_RDONLY)
	if err != nil {
		return 0, err
	}
	s.offer(partID{key, gen, part}, fd, path)
	return int(st.Size), nil
}

// Query implements store.Store. An object whose files cannot be read is
// reported in its Object.Err.
func (s *Store) Query(ctx context.Context, keys []string) ([]store.Object, error) {
	if s.closed.Load() {
		return nil, errClosed
	}
	objs := make([]store.Object, len(keys))
	for i, k := range keys {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		o, err := s.lookup(k)
		switch {
		case err != nil:
			objs[i].Err = fmt.Errorf("query %s: %w", k, err)
		case o != nil:
			objs[i] = store.Object{Complete: true, Manifest: o.manifest,
				PartSizes: append([]int(nil), o.sizes...)}
		}
	}
	return objs, nil
}

// PutMeta implements store.Store.
func (s *Store) PutMeta(ctx context.Context, key string, val []byte) error {
	if s.closed.Load() {
		return errClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := store.CheckMetaSize(key, int64(len(val))); err != nil {
		return err
	}
	path := s.metaPath(key)
	created, err := s.writeFile(path, [][]byte{val}, fileWrite{part: -1})
	if err == nil && !created {
		var old []byte
		if old, _, err = s.readSmall(path, store.MaxMetaBytes); err == nil && !bytes.Equal(old, val) {
			return store.ErrMetaConflict
		}
	}
	if err != nil {
		return fmt.Errorf("put metadata %s: %w", key, err)
	}
	return nil
}

// GetMeta implements store.Store. It reads at most store.MaxMetaBytes+1
// bytes, and fails past the limit.
func (s *Store) GetMeta(ctx context.Context, key string) ([]byte, error) {
	if s.closed.Load() {
		return nil, errClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b, _, err := s.readSmall(s.metaPath(key), store.MaxMetaBytes)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, store.ErrNotFound
	case err != nil:
		return nil, fmt.Errorf("get metadata %s: %w", key, err)
	}
	return b, nil
}

// ReadRanges implements store.Store.
func (s *Store) ReadRanges(ctx context.Context, rs []store.Range) (n int, err error) {
	if s.closed.Load() {
		return 0, errClosed
	}
	done := ctx.Done()
	var (
		o    *object
		f    *openFile
		fkey string
		fp   int
	)
	defer func() {
		if f != nil {
			s.release(f)
		}
	}()
	for i := range rs {
		r := &rs[i]
		if done != nil {
			select {
			case <-done:
				return i, ctx.Err()
			default:
			}
		}
		if o == nil || r.Key != fkey {
			if f != nil {
				s.release(f)
				f = nil
			}
			var err error
			if o, err = s.lookup(r.Key); err != nil {
				return i, rangeError(r, err)
			}
			fkey, fp = r.Key, -1
		}
		if o == nil || r.Part < 0 || r.Part >= len(o.sizes) {
			return i, rangeError(r, store.ErrNotFound)
		}
		if r.Manifest != "" && r.Manifest != o.manifest {
			return i, rangeError(r, store.ErrChanged)
		}
		if err := r.CheckBounds(r.Len(), o.sizes[r.Part]); err != nil {
			return i, err
		}
		if f == nil || r.Part != fp {
			if f != nil {
				s.release(f)
				f = nil
			}
			var err error
			if f, err = s.acquire(o, r.Key, r.Part); err != nil {
				return i, rangeError(r, err)
			}
			fp = r.Part
		}
		off := int64(r.Off)
		for _, d := range r.Dst {
			for len(d) > 0 {
				m, err := unix.Pread(f.fd, d, off)
				switch {
				case err == unix.EINTR:
					continue
				case err != nil:
					return i, rangeError(r, &fs.PathError{Op: "read", Path: f.path, Err: err})
				case m == 0:
					return i, rangeError(r, fmt.Errorf("%s: %w", f.path, io.ErrUnexpectedEOF))
				}
				d = d[m:]
				off += int64(m)
			}
		}
	}
	return len(rs), nil
}

func rangeError(r *store.Range, err error) error {
	return &store.RangeError{Key: r.Key, Part: r.Part, Off: r.Off, Len: r.Len(), Err: err}
}

// acquire returns an open file of a part of a complete object; release it.
func (s *Store) acquire(o *object, key string, part int) (*openFile, error) {
	id := partID{key, o.gen, part}
	s.mu.Lock()
	if f := s.files[id]; f != nil {
		f.refs++
		s.mu.Unlock()
		return f, nil
	}
	s.mu.Unlock()
	path := partPath(o.dir, o.gen, part)
	fd, _, err := s.openFd(path, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.files[id]; f != nil {
		unix.Close(fd)
		f.refs++
		return f, nil
	}
	f := &openFile{fd: fd, path: path, refs: 1}
	if !s.cache(id, f) {
		f.closed = true // every cached file is in use: do not cache this one
	}
	return f, nil
}

// offer puts an open part file in the cache if there is room, and closes
// it if not.
func (s *Store) offer(id partID, fd int, path string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.files[id] != nil || !s.cache(id, &openFile{fd: fd, path: path}) {
		unix.Close(fd)
	}
}

// cache adds f to the cache of open files, making room by closing files
// that no read is using, and reports whether it did. The caller holds s.mu.
func (s *Store) cache(id partID, f *openFile) bool {
	for k, f := range s.files {
		if len(s.files) < s.maxFiles {
			break
		}
		if f.refs == 0 {
			unix.Close(f.fd)
			delete(s.files, k)
		}
	}
	if s.closed.Load() || len(s.files) >= s.maxFiles {
		return false
	}
	s.files[id] = f
	return true
}

func (s *Store) release(f *openFile) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f.refs--
	if f.refs == 0 && f.closed {
		unix.Close(f.fd)
	}
}

// dropFiles closes the cached part files that no read is using.
func (s *Store) dropFiles() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, f := range s.files {
		if f.refs == 0 {
			unix.Close(f.fd)
			delete(s.files, k)
		}
	}
}
