package filestore

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvreshard/kvreshard/runtime/store"
)

// Options tune a store.
type Options struct {
	// Sync makes every write durable before it returns (see the package
	// documentation), at the cost of a file and a directory sync each.
	Sync bool
	// MaxOpenFiles bounds the part files kept open for reads; 0 means 256
	// or a quarter of the process's open-file limit (RLIMIT_NOFILE) when
	// that is less, and at least 1.
	MaxOpenFiles int
	// Lease is how long an incomplete object's claim must have gone
	// unwritten before a writer of another layout may take the object over;
	// 0 means store.DefaultLease.
	Lease time.Duration
	// LockWait bounds how long a batch of writes (one WriteParts) waits in
	// all for locks that other writers hold on its objects (see the
	// package documentation): a part whose lock it cannot get fails, or,
	// taking the object over, goes on without the lock; 0 means
	// DefaultLockWait, and it is at most MaxLockWait. A context deadline
	// that comes sooner ends the wait then.
	LockWait time.Duration

	now func() time.Time // the clock; nil means time.Now (tests set it)
}

// DefaultLockWait is how long a writer waits for a lock that another writer
// holds when a store is not told otherwise (Options.LockWait).
const DefaultLockWait = 5 * time.Second

// MaxLockWait bounds Options.LockWait: a writer never waits for others
// longer than that.
const MaxLockWait = 10 * time.Minute

const (
	maxObjects       = 1 << 16 // complete objects remembered per process
	maxManifestKey   = 4096    // bytes of a manifest key, so that claims stay small
	maxClaimBytes    = maxManifestKey + 64
	objectsDir       = "objects-v3"
	defaultOpenFiles = 256
	maxAttempts      = 16 // times a write reads the claim again
)

// Store is a store in a directory.
type Store struct {
	dir      string
	sync     bool
	maxFiles int
	lease    time.Duration
	lockWait time.Duration
	now      func() time.Time
	closed   atomic.Bool

	mu    sync.Mutex
	objs  map[string]*object // complete objects
	files map[partID]*openFile

	// onFragment, when set, runs after each fragment of a part but the
	// last is written (tests stop or block a writer there).
	onFragment func(part, fragment int)
}

// object is what a process knows of a complete object.
type object struct {
	dir      string
	gen      string
	manifest string
	sizes    []int
}

// partID names a part file: a part of the generation of a claim, whose
// content never changes.
type partID struct {
	key  string
	gen  string
	part int
}

// openFile is an open part file, read with pread.
type openFile struct {
	fd     int
	path   string
	refs   int
	closed bool // dropped from the cache; close when refs drops to 0
}

var errClosed = errors.New("store is closed")

// Open opens the store in dir, creating the directory if it is missing.
func Open(dir string, opts Options) (*Store, error) {
	dir = filepath.Clean(dir)
	for _, d := range []string{dir, filepath.Join(dir, objectsDir), filepath.Join(dir, "meta")} {
		if err := os.MkdirAll(d, 0o777); err != nil {
			return nil, fmt.Errorf("open file store: %w", err)
		}
	}
	if opts.MaxOpenFiles <= 0 {
		opts.MaxOpenFiles = defaultMaxOpenFiles()
	}
	if opts.Lease <= 0 {
		opts.Lease = store.DefaultLease
	}
	if opts.LockWait <= 0 {
		opts.LockWait = DefaultLockWait
	}
	opts.LockWait = min(opts.LockWait, MaxLockWait)
	if opts.now == nil {
		opts.now = time.Now
	}
	return &Store{
		dir:      dir,
		sync:     opts.Sync,
		maxFiles: opts.MaxOpenFiles,
		lease:    opts.Lease,
		lockWait: opts.LockWait,
		now:      opts.now,
		objs:     map[string]*object{},
		files:    map[partID]*openFile{},
	}, nil
}

// defaultMaxOpenFiles is 256, or a quarter of the soft open-file limit when
// that is less, and at least 1.
func defaultMaxOpenFiles() int {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil || rl.Cur/4 >= defaultOpenFiles {
		return defaultOpenFiles
	}
	return max(int(rl.Cur/4), 1)
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
	return filepath.Join(s.dir, objectsDir, fanout, name)
}

func (s *Store) metaPath(key string) string {
	fanout, name := fileName(key)
	return filepath.Join(s.dir, "meta", fanout, name)
}

func partPath(dir, gen string, part int) string {
	return filepath.Join(dir, "part-"+gen+"-"+strconv.Itoa(part))
}

// Close closes the store's open files. Later calls fail.
func (s *Store) Close() error {
	s.closed.Store(true)
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, f := range s.files {
		f.closed = true
		if f.refs == 0 {
			unix.Close(f.fd)
		}
		delete(s.files, k)
	}
	return nil
}
