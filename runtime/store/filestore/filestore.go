// Package filestore is the embedded default store: a directory that many
// processes may use at once, so that a page written by a process that has
// exited can be read by another. It registers the URL scheme file:
//
//	file:///abs/dir               the store in /abs/dir, created if missing
//	file://localhost/abs/dir      the same
//	file:///abs/dir?lease=30s     the same with a lease of 30s (Options.Lease)
//	file:///abs/dir?lock-wait=1s  the same with a lock wait of 1s (Options.LockWait)
//
// The path must be absolute; any other host, and any user, port, query
// parameter but lease and lock-wait (each at most once), or fragment, is a
// *store.URLError.
//
// # Files
//
// A key, arbitrary bytes, becomes a file name made of its escaped first bytes
// (letters, digits, '-' and '_' kept, every other byte as %XX) and a SHA-256
// prefix of the whole key, so that no key can name a path outside the store
// and names differ even on a case-insensitive file system:
//
//	objects-v3/<h>/<name>/claim           part count, generation, newline, manifest key
//	objects-v3/<h>/<name>/part-<gen>-<i>  the bytes of part i
//	objects-v3/<h>/<name>/lock            locked by writers taking the object over (flock)
//	meta/<h>/<name>                       a metadata object
//
// where <h> is the first two hex digits of the hash and <gen> the claim's
// generation, 16 random hex digits. A part's size is its file's size. Every
// file is written whole to a temporary file
// beside it and then hard-linked into place, which fails if the name exists:
// the first claim, the first copy of a part and the first metadata object
// win atomically across processes, and a process killed mid-write leaves at
// most a temporary file (".tmp-*"), never a part that reads as written. A
// retry of a part that is already written writes nothing and succeeds. An
// object is complete when its claim and all the parts of the claim's
// generation exist; a complete object never changes, so each process caches
// what it learns of complete objects, and keeps a bounded set of open part
// files for positioned reads: at most a quarter of the process's open-file
// limit, and when an open fails for want of descriptors the cached files are
// closed and the open is tried again. Query reads claims and the sizes of
// part files, leaving the part files it opens in that set for the reads
// that follow; it never reads part data.
//
// Every file is opened without blocking and must be a regular file: a
// directory, FIFO, device or symbolic link where a claim, part, lock or
// metadata file should be is an error naming the path. Every size and count
// read from a file is bounded before it is used (store.MaxParts,
// store.MaxMetaBytes); a claim or part that does not parse makes its object
// unreadable, reported in that object's store.Object.Err, and no other.
//
// # Leases and takeover
//
// A writer writes a part holding the lock of the claim file (flock), shared
// with the other writers of the claim's generation, and sets the claim's
// modification time when it begins the part, while it writes it (at least
// every quarter of the lease) and when it has linked it: the claim's age is
// the time since a writer of the object was last seen working. An
// incomplete object whose claim is older than the lease (Options.Lease,
// store.DefaultLease by default) is abandoned, and may be taken over by a
// writer of another layout. It takes the claim's lock exclusively, which
// waits for writers finishing a part; takes the object's lock file
// exclusively, so that takeovers of an object go one at a time; checks
// again; replaces the claim, by rename, with its own of a new generation;
// and removes the parts of the old one. A claim that does not parse may be
// taken over the same way. A part of an old generation never counts
// towards a new one.
//
// A writer that holds a lock but is not writing (stopped by a signal or a
// debugger, swapped out) holds up no takeover: its claim ages like an
// abandoned one, so a writer that still cannot have the claim's lock after
// the lock wait (Options.LockWait, DefaultLockWait by default) takes the
// object over without it, and one that finds the lock file held since
// longer ago than the lease (its holder sets the file's modification time)
// goes on without that too. The new claim is a new file with a lock of its
// own: the new layout's writers never wait for the stopped one. When the
// stopped writer resumes, it finds that its claim is no longer the
// object's once it has linked its part (or failed to: its temporary file
// may be gone), removes the part and is refused (store.ErrLayoutConflict);
// it refreshed only the time of its own, replaced, claim file. A complete
// object is never taken over by a writer that got the claim's lock; one
// that went on without it may, if the stopped writer it passed over resumes
// at that very instant and completes the object, replace a complete object:
// a reader then finds it missing or fails to read it, and never reads bytes
// of one layout as another's. Locks are released when a process dies, so an
// object abandoned by a killed writer is free once the lease has passed.
//
// No writer waits for another without bound, and none blocks in flock: a
// lock that another writer holds is tried again, with a short backoff, for
// at most the lock wait and until the context's deadline, and cancelling
// the context ends the wait at once with the context's error. Only a
// writer that holds a claim's lock exclusively, which a live one does for
// a moment, makes writers of that claim wait; if it is stopped, their parts
// fail after the wait with an error that names the lock file and the wait,
// and the other writes of the batch go on.
//
// When a writer gets the claim's lock exclusively without waiting (no other
// writer of the generation is writing), it removes the object's temporary
// files older than the lease (a killed writer's) and the parts of
// generations other than the claim's (left by a takeover that was itself
// killed, or by a stopped writer of an old claim); so does a takeover. It
// lists the directory before it checks the claim, so that even a writer
// stopped between the two removes no part that a claim names. Temporary
// files in meta/, left by a writer killed in PutMeta, are not removed; they
// are harmless and may be deleted while no process writes.
//
// # Durability
//
// By default nothing is synced: the store survives any process crash, but
// after an operating-system crash or power loss recently written files may
// hold zeros or be cut short (a part's checksums then no longer match its
// bytes). The store is a cache; wipe its directory after such a crash, or
// open it with Options.Sync, which syncs every file before linking it and
// the directory after. A store written by an earlier version of this package
// (an objects or objects-v2 directory instead of objects-v3) reads as
// empty; delete the old directory.
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
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

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
	case u.ForceQuery && u.RawQuery == "":
		return bad("empty query string; a file URL takes only ?lease= and ?lock-wait=")
	case u.Fragment != "":
		return bad("a file URL takes no fragment")
	case u.Path == "":
		return bad("empty path; write file:///abs/dir")
	case !filepath.IsAbs(u.Path):
		return bad(fmt.Sprintf("path %q is not absolute; write file:///abs/dir", u.Path))
	}
	opts, err := parseQuery(u.RawQuery)
	if err != nil {
		return bad(err.Error())
	}
	return Open(u.Path, opts)
}

// parseQuery parses the raw query of a file URL: lease and lock-wait, each
// at most once, positive Go durations. Its error is the reason of a
// *store.URLError.
func parseQuery(rawQuery string) (Options, error) {
	var opts Options
	if rawQuery == "" {
		return opts, nil
	}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return Options{}, errors.New("cannot parse the query: " + err.Error())
	}
	for _, k := range slices.Sorted(maps.Keys(q)) {
		v := q[k]
		switch {
		case k != "lease" && k != "lock-wait":
			return Options{}, fmt.Errorf("unknown parameter %q; a file URL takes only lease and lock-wait", k)
		case len(v) != 1:
			return Options{}, fmt.Errorf("%s is given more than once", k)
		case k == "lease":
			opts.Lease, err = store.ParseLease(v[0])
		default:
			opts.LockWait, err = time.ParseDuration(v[0])
			if err != nil || opts.LockWait <= 0 {
				err = fmt.Errorf("lock-wait %q is not a positive duration such as 500ms or 5s", v[0])
			}
		}
		if err != nil {
			return Options{}, err
		}
	}
	return opts, nil
}

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
	// LockWait bounds how long a writer waits for a lock that another
	// writer holds on an object (see the package documentation) before
	// it gives up on that part, or, taking the object over, goes on
	// without the lock; 0 means DefaultLockWait. A context deadline that
	// comes sooner ends the wait then.
	LockWait time.Duration

	now func() time.Time // the clock; nil means time.Now (tests set it)
}

// DefaultLockWait is how long a writer waits for a lock that another writer
// holds when a store is not told otherwise (Options.LockWait).
const DefaultLockWait = 5 * time.Second

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
			errs[i] = s.writePart(ctx, &ws[i])
		}
	}
	return errs
}

// claim is the content of a claim file.
type claim struct {
	parts    int
	gen      string
	manifest string
}

func (c *claim) bytes() []byte {
	return []byte(strconv.Itoa(c.parts) + " " + c.gen + "\n" + c.manifest)
}

func newGen() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// corruptError is a claim or part file that is a regular file but does not
// parse.
type corruptError struct {
	path, reason string
}

func (e *corruptError) Error() string { return fmt.Sprintf("corrupt file %s: %s", e.path, e.reason) }

// parseClaim parses a claim file's content.
func parseClaim(path string, b []byte) (*claim, error) {
	head, manifest, ok := strings.Cut(string(b), "\n")
	if !ok {
		return nil, &corruptError{path, "no newline"}
	}
	parts, gen, ok := strings.Cut(head, " ")
	if !ok {
		return nil, &corruptError{path, fmt.Sprintf("first line %q is not a part count and a generation", head)}
	}
	n, err := strconv.ParseInt(parts, 10, 64)
	switch {
	case err != nil || strconv.FormatInt(n, 10) != parts:
		return nil, &corruptError{path, fmt.Sprintf("part count %q is not a number", parts)}
	case n < 1 || n > store.MaxParts:
		return nil, &corruptError{path, fmt.Sprintf("part count %d is out of range [1,%d]", n, store.MaxParts)}
	case len(gen) != 16 || strings.Trim(gen, "0123456789abcdef") != "":
		return nil, &corruptError{path, fmt.Sprintf("generation %q is not 16 hex digits", gen)}
	case manifest == "":
		return nil, &corruptError{path, "empty manifest key"}
	}
	return &claim{parts: int(n), gen: gen, manifest: manifest}, nil
}

func (s *Store) writePart(ctx context.Context, w *store.PartWrite) error {
	if err := w.Validate(); err != nil {
		return err
	}
	if len(w.Manifest) > maxManifestKey {
		return fmt.Errorf("write %s part %d: manifest key is %d bytes; the limit is %d", w.Key, w.Part, len(w.Manifest), maxManifestKey)
	}
	if s.cached(w.Key) != nil {
		return store.ErrComplete
	}
	err := s.writeClaimed(ctx, w, s.objectDir(w.Key))
	if err != nil && err != store.ErrComplete && err != store.ErrLayoutConflict && err != ctx.Err() {
		return fmt.Errorf("write %s part %d: %w", w.Key, w.Part, err)
	}
	return err
}

// writeClaimed writes a part under the object's claim: it makes the first
// claim if there is none, takes an abandoned object over, and writes the
// part under the claim of its layout.
func (s *Store) writeClaimed(ctx context.Context, w *store.PartWrite, dir string) error {
	claimPath := filepath.Join(dir, "claim")
	cleaned := false
	for attempt := 0; ; attempt++ {
		if attempt == maxAttempts {
			// Other writers took the object over every time this one
			// looked (only a lease of next to nothing allows that).
			return store.ErrLayoutConflict
		}
		cl, err := s.openClaim(claimPath)
		if errors.Is(err, fs.ErrNotExist) {
			// A new object: the first claim wins.
			mine := claim{w.Parts, newGen(), w.Manifest}
			if _, err := s.writeFile(claimPath, [][]byte{mine.bytes()}, fileWrite{part: -1, stamp: true}); err != nil {
				// Another claim won, and a writer under it removed
				// this one's temporary file, or the error stands.
				if _, serr := os.Lstat(claimPath); serr != nil {
					return err
				}
			}
			continue // read the claim that won
		}
		if err != nil {
			return err
		}
		if !cleaned {
			// With the claim's lock exclusive, no other writer of its
			// generation is writing: what dead writers left may go.
			excl, err := tryFlock(cl.fd, cl.path, unix.LOCK_EX)
			if err != nil {
				cl.close()
				return err
			}
			if excl {
				cleaned = true
				gen := ""
				if cl.c != nil {
					gen = cl.c.gen
				}
				s.removeStale(dir, gen)
			}
		}
		var again bool
		if c := cl.c; c != nil && c.parts == w.Parts && c.manifest == w.Manifest {
			again, err = s.writeUnder(ctx, w, dir, cl)
		} else {
			again, err = s.takeOver(ctx, w, dir, cl)
			cleaned = false // the new claim's turn
		}
		cl.close()
		if !again {
			return err
		}
	}
}

// writeUnder writes w's part under cl, a claim of w's layout, holding the
// claim's lock shared. It reports again when cl was replaced before the
// part was begun.
func (s *Store) writeUnder(ctx context.Context, w *store.PartWrite, dir string, cl *claimFile) (again bool, err error) {
	c := cl.c
	if complete, err := partsExist(dir, c); err != nil {
		return false, err
	} else if complete {
		return false, store.ErrComplete
	}
	if err := s.waitFlock(ctx, cl.fd, cl.path, unix.LOCK_SH); err != nil {
		return false, err
	}
	if ok, err := cl.current(); err != nil || !ok {
		return err == nil, err
	}
	// The claim's time is refreshed when the part is begun, as it is
	// written (heartbeat) and when it is linked: a writer that is writing
	// keeps its claim younger than the lease.
	last := s.now()
	if err := cl.stamp(last); err != nil {
		return false, err
	}
	heartbeat := func() {
		if now := s.now(); now.Sub(last) >= s.lease/4 && cl.stamp(now) == nil {
			last = now
		}
	}
	path := partPath(dir, c.gen, w.Part)
	created, werr := s.writeFile(path, w.Data, fileWrite{part: w.Part, fragment: heartbeat})
	ok, err := cl.current()
	switch {
	case err != nil:
		return false, err
	case !ok:
		// Taken over while this writer wrote (it was stopped for longer
		// than the lease): its part, of a generation no claim names any
		// more, never counts.
		if created {
			os.Remove(path)
		}
		return false, store.ErrLayoutConflict
	case werr != nil:
		return false, werr
	}
	return false, cl.stamp(s.now())
}

// takeOver replaces cl, the claim of another layout or one that does not
// parse, with a claim of w's layout and a new generation if the object is
// incomplete and the claim older than the lease. It reports again when the
// object should be looked at again: taken over, by this writer or another.
func (s *Store) takeOver(ctx context.Context, w *store.PartWrite, dir string, cl *claimFile) (again bool, err error) {
	refuse := store.ErrLayoutConflict
	if cl.c == nil {
		refuse = cl.bad
	} else if complete, err := partsExist(dir, cl.c); err != nil {
		return false, err
	} else if complete {
		return false, store.ErrComplete
	}
	if !s.expired(cl.mtime) {
		return false, refuse
	}
	// Wait for the writers of the claim's generation to finish the parts
	// they are writing. A writer that is writing keeps its claim younger
	// than the lease, so one that still holds the lock after the wait is
	// stopped, and the object is taken over without the lock.
	err = s.waitFlock(ctx, cl.fd, cl.path, unix.LOCK_EX)
	if held := (*lockHeldError)(nil); err != nil && !(errors.As(err, &held) && held.err == nil) {
		return false, err
	}
	// Writers that replace a claim do it one at a time, under the object's
	// lock file, and look again under it.
	lk, err := s.lockTakeover(ctx, dir)
	if err != nil {
		return false, err
	}
	defer func() {
		if lk >= 0 {
			unix.Close(lk)
		}
	}()
	if ok, err := cl.current(); err != nil || !ok {
		return err == nil, err
	}
	mtime, err := cl.modTime()
	if err != nil {
		return false, err
	}
	if !s.expired(mtime) {
		return false, refuse // a stopped writer came back
	}
	if cl.c != nil {
		if complete, err := partsExist(dir, cl.c); err != nil {
			return false, err
		} else if complete {
			return false, store.ErrComplete
		}
	}
	mine := claim{w.Parts, newGen(), w.Manifest}
	if _, err := s.writeFile(cl.path, [][]byte{mine.bytes()}, fileWrite{part: -1, replace: true, stamp: true}); err != nil {
		return false, err
	}
	if cl.c != nil {
		// No claim names the old generation again. Temporary files wait
		// for a writer with the new claim's lock exclusive.
		removeParts(dir, cl.c.gen)
	}
	return true, nil
}

// mkdir creates an object's directory and the fan-out one it is in.
func (s *Store) mkdir(dir string) error {
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return err
	}
	if s.sync {
		for _, d := range []string{filepath.Dir(dir), filepath.Dir(filepath.Dir(dir))} {
			if err := syncDir(d); err != nil {
				return err
			}
		}
	}
	return nil
}

// partsExist reports whether every part of c's generation exists in dir.
func partsExist(dir string, c *claim) (bool, error) {
	for p := range c.parts {
		if _, err := os.Lstat(partPath(dir, c.gen, p)); errors.Is(err, fs.ErrNotExist) {
			return false, nil
		} else if err != nil {
			return false, err
		}
	}
	return true, nil
}

// removeStale removes from an object's directory the temporary files older
// than the lease and, unless gen is empty, the parts of generations other
// than gen. The caller holds the lock of the object's claim exclusively, so
// no writer of that claim is writing a temporary file; a writer of an older
// claim whose file goes fails to link its part, finds its claim replaced
// and is refused. Parts need no lock: removeStale lists the directory
// before it checks that the object's claim is gen's, so a part of another
// generation that it lists existed while gen's claim was the object's; that
// generation's claim had been replaced, and no claim names it again (a
// takeover writes a new generation). That holds however long a stopped
// caller waits between its steps. Failures are ignored: the files are
// harmless, and a later write tries again.
func (s *Store) removeStale(dir, gen string) {
	names := readDirNames(dir)
	if gen != "" {
		path := filepath.Join(dir, "claim")
		b, _, err := s.readSmall(path, maxClaimBytes)
		if err != nil {
			gen = ""
		} else if c, err := parseClaim(path, b); err != nil || c.gen != gen {
			gen = ""
		}
	}
	now := s.now()
	for _, name := range names {
		path := filepath.Join(dir, name)
		switch {
		case strings.HasPrefix(name, ".tmp-"):
			if fi, err := os.Lstat(path); err == nil && now.Sub(fi.ModTime()) > s.lease {
				os.Remove(path)
			}
		case gen != "" && strings.HasPrefix(name, "part-") && !strings.HasPrefix(name, "part-"+gen+"-"):
			os.Remove(path)
		}
	}
}

// removeParts removes the parts of generation gen from an object's
// directory, ignoring failures.
func removeParts(dir, gen string) {
	for _, name := range readDirNames(dir) {
		if strings.HasPrefix(name, "part-"+gen+"-") {
			os.Remove(filepath.Join(dir, name))
		}
	}
}

func readDirNames(dir string) []string {
	d, err := os.Open(dir)
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	return names
}

// fileWrite says how writeFile writes a file.
type fileWrite struct {
	replace bool // rename over the path instead of linking to it
	stamp   bool // set the file's modification time to the store's clock
	// part >= 0 is the part the file is; its fragments run fragment and
	// testHookFragment.
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
			if testHookFragment != nil {
				testHookFragment(how.part, i)
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
