// Writes: claims, leases and takeovers, and the cleanup of what killed
// and stopped writers leave.

package filestore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kvreshard/kvreshard/runtime/store"
)

// WriteParts implements store.Store. The batch waits for locks that other
// writers hold for at most the store's lock wait in all: once that is
// spent, a part whose lock is held fails at once, and the rest of the
// batch goes on.
func (s *Store) WriteParts(ctx context.Context, ws []store.PartWrite) []error {
	errs := make([]error, len(ws))
	wait := &lockBudget{left: s.lockWait}
	for i := range ws {
		switch {
		case s.closed.Load():
			errs[i] = errClosed
		case ctx.Err() != nil:
			errs[i] = ctx.Err()
		default:
			errs[i] = s.writePart(ctx, wait, &ws[i])
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

func (s *Store) writePart(ctx context.Context, wait *lockBudget, w *store.PartWrite) error {
	if err := w.Validate(); err != nil {
		return err
	}
	if len(w.Manifest) > maxManifestKey {
		return fmt.Errorf("write %s part %d: manifest key is %d bytes; the limit is %d", w.Key, w.Part, len(w.Manifest), maxManifestKey)
	}
	if s.cached(w.Key) != nil {
		return store.ErrComplete
	}
	err := s.writeClaimed(ctx, wait, w, s.objectDir(w.Key))
	if err != nil && err != store.ErrComplete && err != store.ErrLayoutConflict && err != ctx.Err() {
		return fmt.Errorf("write %s part %d: %w", w.Key, w.Part, err)
	}
	return err
}

// writeClaimed writes a part under the object's claim: it makes the first
// claim if there is none, takes an abandoned object over, and writes the
// part under the claim of its layout.
func (s *Store) writeClaimed(ctx context.Context, wait *lockBudget, w *store.PartWrite, dir string) error {
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
				s.removeStale(dir, cl)
			}
		}
		var again bool
		if c := cl.c; c != nil && c.parts == w.Parts && c.manifest == w.Manifest {
			again, err = s.writeUnder(ctx, wait, w, dir, cl)
		} else {
			again, err = s.takeOver(ctx, wait, w, dir, cl)
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
func (s *Store) writeUnder(ctx context.Context, wait *lockBudget, w *store.PartWrite, dir string, cl *claimFile) (again bool, err error) {
	c := cl.c
	if complete, err := partsExist(dir, c); err != nil {
		return false, err
	} else if complete {
		return false, store.ErrComplete
	}
	if err := s.waitFlock(ctx, wait, cl.fd, cl.path, unix.LOCK_SH); err != nil {
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
func (s *Store) takeOver(ctx context.Context, wait *lockBudget, w *store.PartWrite, dir string, cl *claimFile) (again bool, err error) {
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
	err = s.waitFlock(ctx, wait, cl.fd, cl.path, unix.LOCK_EX)
	if held := (*lockHeldError)(nil); err != nil && !(errors.As(err, &held) && held.err == nil) {
		return false, err
	}
	// Writers that replace a claim do it one at a time, under the object's
	// lock file, and look again under it.
	lk, err := s.lockTakeover(ctx, wait, dir)
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
// than the lease and, when cl parses, the parts of generations other than
// cl's. The caller holds cl's lock exclusively, and it removes nothing
// unless cl is still the object's claim: then no writer of the object's
// claim is writing a temporary file (a cleaner holding an older, replaced
// claim's lock would remove those of the current claim's writers); a
// writer of an older claim whose file goes fails to link its part, finds
// its claim replaced and is refused. removeStale lists the directory
// before it checks that cl is the object's claim, so a part of another
// generation that it lists existed while cl was the object's claim; that
// generation's claim had been replaced, and no claim names it again (a
// takeover writes a new generation). That holds however long a stopped
// caller waits between its steps. Failures are ignored: the files are
// harmless, and a later write tries again.
func (s *Store) removeStale(dir string, cl *claimFile) {
	names := readDirNames(dir)
	if ok, err := cl.current(); err != nil || !ok {
		return
	}
	gen := ""
	if cl.c != nil {
		gen = cl.c.gen
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
