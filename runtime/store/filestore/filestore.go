// Package filestore is the embedded default store: a directory that many
// processes may use at once, so that a page written by a process that has
// exited can be read by another. It registers the URL scheme file:
//
//	file:///abs/dir             the store in /abs/dir, created if missing
//	file://localhost/abs/dir    the same
//
// The path must be absolute; any other host, and any user, port, query or
// fragment, is a *store.URLError.
//
// # Files
//
// A key, arbitrary bytes, becomes a file name made of its escaped first bytes
// (letters, digits, '-' and '_' kept, every other byte as %XX) and a SHA-256
// prefix of the whole key, so that no key can name a path outside the store
// and names differ even on a case-insensitive file system:
//
//	objects/<h>/<name>/claim    part count, newline, manifest key
//	objects/<h>/<name>/part-<i> the bytes of part i
//	meta/<h>/<name>             a metadata object
//
// where <h> is the first two hex digits of the hash. Every file is written
// whole to a temporary file beside it and then hard-linked into place, which
// fails if the name exists: the first claim, the first copy of a part and the
// first metadata object win atomically across processes, and a process killed
// mid-write leaves at most a temporary file (".tmp-*"), never a part that
// reads as written. A retry of a part that is already written writes nothing
// and succeeds. An object is complete when its claim and all its parts exist;
// a complete object never changes, so each process caches what it learns of
// complete objects, and keeps a bounded set of open part files for positioned
// reads. Query reads claims and stats part files; it never reads part data.
//
// # Durability
//
// By default nothing is synced: the store survives any process crash, but
// after an operating-system crash or power loss recently written files may
// hold zeros or be cut short. The store is a cache; wipe its directory after
// such a crash, or open it with Options.Sync, which syncs every file before
// linking it and the directory after. Temporary files of killed writers are
// not removed; they are harmless and may be deleted while no process writes.
package filestore

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/kvreshard/kvreshard/runtime/store"
)

func init() { store.Register("file", openURL) }

func openURL(_ context.Context, u *url.URL) (store.Store, error) {
	bad := func(reason string) (store.Store, error) {
		s := u.String()
		if u.Opaque == "" && !strings.HasPrefix(s, "file://") {
			s = "file://" + strings.TrimPrefix(s, "file:") // file:// prints as file:
		}
		return nil, &store.URLError{URL: s, Reason: reason}
	}
	switch {
	case u.User != nil:
		return bad("a file URL takes no user")
	case u.Host != "" && u.Host != "localhost":
		return bad(fmt.Sprintf("host %q is not empty or localhost; write file:///abs/dir, with three slashes", u.Host))
	case u.RawQuery != "" || u.ForceQuery:
		return bad("a file URL takes no query string")
	case u.Fragment != "":
		return bad("a file URL takes no fragment")
	case u.Path == "":
		return bad("empty path; write file:///abs/dir")
	case !filepath.IsAbs(u.Path):
		return bad(fmt.Sprintf("path %q is not absolute; write file:///abs/dir", u.Path))
	}
	return Open(u.Path, Options{})
}

// Options tune a store.
type Options struct {
	// Sync makes every write durable before it returns (see the package
	// documentation), at the cost of a file and a directory sync each.
	Sync bool
	// MaxOpenFiles bounds the part files kept open for reads; 0 means 256.
	MaxOpenFiles int
}

const maxObjects = 1 << 16 // complete objects remembered per process

// Store is a store in a directory.
type Store struct {
	dir      string
	sync     bool
	maxFiles int
	closed   atomic.Bool

	mu    sync.Mutex
	objs  map[string]*object // complete objects
	files map[partID]*openFile
}

// object is what a process knows of a complete object.
type object struct {
	dir      string
	manifest string
	sizes    []int
}

type partID struct {
	key  string
	part int
}

type openFile struct {
	f      *os.File
	refs   int
	closed bool // dropped from the cache; close when refs drops to 0
}

var errClosed = errors.New("store is closed")

// Open opens the store in dir, creating the directory if it is missing.
func Open(dir string, opts Options) (*Store, error) {
	dir = filepath.Clean(dir)
	for _, d := range []string{dir, filepath.Join(dir, "objects"), filepath.Join(dir, "meta")} {
		if err := os.MkdirAll(d, 0o777); err != nil {
			return nil, fmt.Errorf("open file store: %w", err)
		}
	}
	if opts.MaxOpenFiles <= 0 {
		opts.MaxOpenFiles = 256
	}
	return &Store{
		dir:      dir,
		sync:     opts.Sync,
		maxFiles: opts.MaxOpenFiles,
		objs:     map[string]*object{},
		files:    map[partID]*openFile{},
	}, nil
}

// Dir returns the store's directory.
func (s *Store) Dir() string { return s.dir }

// fileName maps a key to a file name and its fan-out directory.
func fileName(key string) (fanout, name string) {
	sum := sha256.Sum256([]byte(key))
	h := hex.EncodeToString(sum[:16])
	var b strings.Builder
	const maxPrefix = 64
	for i := 0; i < len(key) && b.Len() < maxPrefix; i++ {
		c := key[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	b.WriteByte('.')
	b.WriteString(h)
	return h[:2], b.String()
}

func (s *Store) objectDir(key string) string {
	fanout, name := fileName(key)
	return filepath.Join(s.dir, "objects", fanout, name)
}

func (s *Store) metaPath(key string) string {
	fanout, name := fileName(key)
	return filepath.Join(s.dir, "meta", fanout, name)
}

func partPath(dir string, part int) string {
	return filepath.Join(dir, "part-"+strconv.Itoa(part))
}

// testHookFragment, when set, runs after each fragment of a part is written
// to its temporary file.
var testHookFragment func(part, fragment int)

// WriteParts implements store.Store.
func (s *Store) WriteParts(ctx context.Context, ws []store.PartWrite) []error {
	errs := make([]error, len(ws))
	for i := range ws {
		switch {
		case s.closed.Load():
			errs[i] = errClosed
		case ctx.Err() != nil:
			errs[i] = ctx.Err()
		default:
			errs[i] = s.writePart(&ws[i])
		}
	}
	return errs
}

func (s *Store) writePart(w *store.PartWrite) error {
	if err := w.Validate(); err != nil {
		return err
	}
	if s.cached(w.Key) != nil {
		return store.ErrComplete
	}
	dir := s.objectDir(w.Key)
	claim := []byte(strconv.Itoa(w.Parts) + "\n" + w.Manifest)
	old, err := s.create(filepath.Join(dir, "claim"), [][]byte{claim}, -1)
	if err != nil {
		return fmt.Errorf("write %s part %d: %w", w.Key, w.Part, err)
	}
	if old != nil {
		// Someone claimed the object first.
		o, err := s.load(w.Key, dir, old)
		switch {
		case err != nil:
			return fmt.Errorf("write %s part %d: %w", w.Key, w.Part, err)
		case o != nil:
			return store.ErrComplete
		case !bytes.Equal(old, claim):
			return store.ErrLayoutConflict
		}
	}
	// A part already written is kept; otherwise the first of racing writers
	// wins.
	if _, err := s.create(partPath(dir, w.Part), w.Data, w.Part); err != nil {
		return fmt.Errorf("write %s part %d: %w", w.Key, w.Part, err)
	}
	return nil
}

// create writes the concatenated data to path unless path exists. It returns
// nil if it created path, or else the existing file's content (read only for
// small files: parts, numbered part >= 0, are not read).
func (s *Store) create(path string, data [][]byte, part int) (old []byte, err error) {
	readOld := func() ([]byte, error) {
		if part >= 0 {
			return []byte{}, nil
		}
		b, err := os.ReadFile(path)
		if b == nil && err == nil {
			b = []byte{}
		}
		return b, err
	}
	if _, err := os.Lstat(path); err == nil {
		return readOld()
	}
	dir := filepath.Dir(path)
	tmp, err := createTemp(dir)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o777); err != nil {
			return nil, err
		}
		if s.sync {
			// The new directory and the fan-out one it may be in.
			for _, d := range []string{filepath.Dir(dir), filepath.Dir(filepath.Dir(dir))} {
				if err := syncDir(d); err != nil {
					return nil, err
				}
			}
		}
		tmp, err = createTemp(dir)
	}
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	for i, d := range data {
		if _, err := tmp.Write(d); err != nil {
			tmp.Close()
			return nil, err
		}
		if part >= 0 && testHookFragment != nil {
			testHookFragment(part, i)
		}
	}
	if s.sync {
		if err := tmp.Sync(); err != nil {
			tmp.Close()
			return nil, err
		}
	}
	if err := tmp.Close(); err != nil {
		return nil, err
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return readOld()
		}
		return nil, err
	}
	if s.sync {
		if err := syncDir(dir); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

func createTemp(dir string) (*os.File, error) {
	var b [8]byte
	rand.Read(b[:])
	return os.OpenFile(filepath.Join(dir, ".tmp-"+hex.EncodeToString(b[:])), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o666)
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
	claim, err := os.ReadFile(filepath.Join(dir, "claim"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return s.load(key, dir, claim)
}

// load returns the object under key, with the given claim, if it is
// complete, and remembers it.
func (s *Store) load(key, dir string, claim []byte) (*object, error) {
	parts, manifest, ok := strings.Cut(string(claim), "\n")
	n, err := strconv.Atoi(parts)
	if !ok || err != nil || n < 1 || manifest == "" {
		return nil, fmt.Errorf("corrupt claim file %s", filepath.Join(dir, "claim"))
	}
	o := &object{dir: dir, manifest: manifest, sizes: make([]int, n)}
	for p := range n {
		fi, err := os.Stat(partPath(dir, p))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		o.sizes[p] = int(fi.Size())
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

// Query implements store.Store.
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
		if err != nil {
			return nil, fmt.Errorf("query %s: %w", k, err)
		}
		if o != nil {
			objs[i] = store.Object{Complete: true, Manifest: o.manifest, PartSizes: append([]int(nil), o.sizes...)}
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
	old, err := s.create(s.metaPath(key), [][]byte{val}, -1)
	switch {
	case err != nil:
		return fmt.Errorf("put metadata %s: %w", key, err)
	case old != nil && !bytes.Equal(old, val):
		return store.ErrMetaConflict
	}
	return nil
}

// GetMeta implements store.Store.
func (s *Store) GetMeta(ctx context.Context, key string) ([]byte, error) {
	if s.closed.Load() {
		return nil, errClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(s.metaPath(key))
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
		size := o.sizes[r.Part]
		switch {
		case r.Off < 0:
			return i, rangeError(r, errNegativeOffset)
		case r.Off > size || r.Len() > size-r.Off:
			return i, rangeError(r, fmt.Errorf("past the end of the part (%d bytes)", size))
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
			m, err := f.f.ReadAt(d, off)
			if m < len(d) {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return i, rangeError(r, err)
			}
			off += int64(m)
		}
	}
	return len(rs), nil
}

var errNegativeOffset = errors.New("negative offset")

func rangeError(r *store.Range, err error) error {
	return &store.RangeError{Key: r.Key, Part: r.Part, Off: r.Off, Len: r.Len(), Err: err}
}

// acquire returns an open file of a part of a complete object; release it.
func (s *Store) acquire(o *object, key string, part int) (*openFile, error) {
	id := partID{key, part}
	s.mu.Lock()
	if f := s.files[id]; f != nil {
		f.refs++
		s.mu.Unlock()
		return f, nil
	}
	s.mu.Unlock()
	osf, err := os.Open(partPath(o.dir, part))
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.files[id]; f != nil {
		osf.Close()
		f.refs++
		return f, nil
	}
	for k, f := range s.files {
		if len(s.files) < s.maxFiles {
			break
		}
		if f.refs == 0 {
			f.f.Close()
			delete(s.files, k)
		}
	}
	f := &openFile{f: osf, refs: 1}
	if s.closed.Load() {
		f.closed = true
	} else {
		s.files[id] = f
	}
	return f, nil
}

func (s *Store) release(f *openFile) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f.refs--
	if f.refs == 0 && f.closed {
		f.f.Close()
	}
}

// Close closes the store's open files. Later calls fail.
func (s *Store) Close() error {
	s.closed.Store(true)
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, f := range s.files {
		f.closed = true
		if f.refs == 0 {
			f.f.Close()
		}
		delete(s.files, k)
	}
	return nil
}
