package enginestore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kvreshard/kvreshard/internal/lru"
	"github.com/kvreshard/kvreshard/runtime/store"
)

// Options tune a store.
type Options struct {
	// Lease is how long after its claim an incomplete page may be taken
	// over by a writer of another layout; 0 means store.DefaultLease.
	Lease time.Duration
	// Name names the store in errors, e.g. "mooncake 127.0.0.1:50051".
	Name string
	// ReadTimeout bounds how long a read waits for the engine (0: as long
	// as it takes). An engine whose reads may not return when a peer dies
	// (Mooncake's range reads) needs one: a read that did not return in
	// time fails, and the store then reads only into memory of its own
	// (Alloc, bounce buffers), never into a caller's, since the engine may
	// still write into it later; such memory is unmapped only once the
	// engine's call returned.
	ReadTimeout time.Duration

	now func() time.Time // the clock; nil means time.Now (tests set it)
}

// Store is a store.Store on an Engine. It also implements store.Allocator
// and store.Registrar.
type Store struct {
	e      Engine
	name   string
	lease  time.Duration
	now    func() time.Time
	closed atomic.Bool

	done *lru.Cache[*commit] // what K/done said, by page key
	mem  memory
}

var (
	_ store.Store     = (*Store)(nil)
	_ store.Allocator = (*Store)(nil)
	_ store.Registrar = (*Store)(nil)
)

// New returns a store on e. The store owns e: its Close closes e.
func New(e Engine, opts Options) *Store {
	if opts.Lease <= 0 {
		opts.Lease = store.DefaultLease
	}
	if opts.now == nil {
		opts.now = time.Now
	}
	if opts.Name == "" {
		opts.Name = "engine"
	}
	s := &Store{e: e, name: opts.Name, lease: opts.Lease, now: opts.now, done: lru.New[*commit](maxCommits)}
	s.mem.e, s.mem.timeout = e, opts.ReadTimeout
	return s
}

// maxCommits bounds the commits a store remembers.
const maxCommits = 1 << 16

// commit is what a page's K/done object says.
type commit struct {
	manifest string
	digest   string
	sizes    []int
}

var errClosed = errors.New("store is closed")

func claimKey(key string) string { return key + "/claim" }
func doneKey(key string) string  { return key + "/done" }
func metaKey(key string) string  { return "meta/" + key }

// manifestDigest is what a part's key says of its manifest: 32 hex digits
// of the SHA-256 of the manifest key.
func manifestDigest(manifest string) string {
	sum := sha256.Sum256([]byte(manifest))
	return hex.EncodeToString(sum[:16])
}

func partKey(key, digest string, part int) string {
	return key + "/p/" + digest + "/" + strconv.Itoa(part)
}

// fail names the store in an engine's error; ctx.Err() when the context
// is done.
func (s *Store) fail(ctx context.Context, op string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	return fmt.Errorf("%s: %s: %w", s.name, op, err)
}

// Query implements store.Store: a page is complete when its K/done object
// exists. It asks the engine which exist, and reads those it does not
// remember.
func (s *Store) Query(ctx context.Context, keys []string) ([]store.Object, error) {
	if s.closed.Load() {
		return nil, errClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	objs := make([]store.Object, len(keys))
	if len(keys) == 0 {
		return objs, nil
	}
	dk := make([]string, len(keys))
	for i, k := range keys {
		dk[i] = doneKey(k)
	}
	exists, err := s.e.Exists(ctx, dk)
	if err == nil && len(exists) != len(keys) {
		err = fmt.Errorf("engine answered %d of %d keys", len(exists), len(keys))
	}
	if err != nil {
		return nil, s.fail(ctx, "query", err)
	}
	var fetch []int
	for i, ok := range exists {
		if !ok {
			s.done.Remove(keys[i])
			continue
		}
		if c, ok := s.done.Get(keys[i]); ok {
			objs[i] = c.object()
			continue
		}
		fetch = append(fetch, i)
	}
	if len(fetch) == 0 {
		return objs, nil
	}
	fk := make([]string, len(fetch))
	for j, i := range fetch {
		fk[j] = dk[i]
	}
	vals, err := s.e.Get(ctx, fk, maxCommitBytes)
	if err == nil && len(vals) != len(fk) {
		err = fmt.Errorf("engine answered %d of %d keys", len(vals), len(fk))
	}
	if err != nil {
		return nil, s.fail(ctx, "query", err)
	}
	for j, i := range fetch {
		if vals[j] == nil {
			continue // gone since Exists: a miss
		}
		c, err := parseCommit(vals[j])
		if err != nil {
			objs[i].Err = fmt.Errorf("%s: query %s: %w", s.name, keys[i], err)
			continue
		}
		s.done.Put(keys[i], c)
		objs[i] = c.object()
	}
	return objs, nil
}

func (c *commit) object() store.Object {
	return store.Object{Complete: true, Manifest: c.manifest, PartSizes: append([]int(nil), c.sizes...)}
}

// maxCommitBytes bounds a K/done object: a manifest key and a decimal size
// a part.
const maxCommitBytes = maxManifestKey + 1 + store.MaxParts*14

// maxManifestKey bounds a manifest key, as the other stores do.
const maxManifestKey = 4096

// encodeCommit returns the bytes of K/done: the manifest key, a newline,
// and each part's size in decimal, separated by spaces.
func encodeCommit(manifest string, sizes []int) []byte {
	var b strings.Builder
	b.WriteString(manifest)
	b.WriteByte('\n')
	for i, n := range sizes {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.Itoa(n))
	}
	return []byte(b.String())
}

// parseCommit parses a K/done object, bounding every count and size.
func parseCommit(b []byte) (*commit, error) {
	manifest, sizes, ok := strings.Cut(string(b), "\n")
	if !ok || manifest == "" || len(manifest) > maxManifestKey {
		return nil, fmt.Errorf("corrupt commit %.60q", b)
	}
	n := strings.Count(sizes, " ") + 1
	if sizes == "" || n > store.MaxParts {
		return nil, fmt.Errorf("corrupt commit %.60q", b)
	}
	c := &commit{manifest: manifest, digest: manifestDigest(manifest), sizes: make([]int, 0, n)}
	for f := range strings.SplitSeq(sizes, " ") {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil || v < 0 || v > maxPartSize || strconv.FormatInt(v, 10) != f {
			return nil, fmt.Errorf("corrupt commit %.60q: part size %.20q", b, f)
		}
		c.sizes = append(c.sizes, int(v))
	}
	return c, nil
}

// maxPartSize bounds a part's size as a commit gives it.
const maxPartSize = 1 << 40

// claim is what a page's K/claim object says.
type claim struct {
	parts    int
	at       time.Time
	manifest string
}

func (c *claim) bytes() []byte {
	return []byte(strconv.Itoa(c.parts) + " " + strconv.FormatInt(c.at.UnixMilli(), 10) + "\n" + c.manifest)
}

func parseClaim(b []byte) (*claim, error) {
	head, manifest, ok := strings.Cut(string(b), "\n")
	parts, at, ok2 := strings.Cut(head, " ")
	if !ok || !ok2 || manifest == "" || len(manifest) > maxManifestKey {
		return nil, fmt.Errorf("corrupt claim %.60q", b)
	}
	n, err := strconv.Atoi(parts)
	if err != nil || n < 1 || n > store.MaxParts || strconv.Itoa(n) != parts {
		return nil, fmt.Errorf("corrupt claim %.60q: part count %.20q", b, parts)
	}
	ms, err := strconv.ParseInt(at, 10, 64)
	if err != nil || strconv.FormatInt(ms, 10) != at {
		return nil, fmt.Errorf("corrupt claim %.60q: time %.20q", b, at)
	}
	return &claim{parts: n, at: time.UnixMilli(ms), manifest: manifest}, nil
}

// maxClaimBytes bounds a K/claim object.
const maxClaimBytes = maxManifestKey + 64

// WriteParts implements store.Store. It writes the batch in steps, each
// one engine call for every page of the batch: which are complete, their
// claims, the parts, which pages are now complete, their commits. Writes
// of one page take effect in order: a batch that writes a page twice is
// written in runs in which no page repeats, one after the other.
func (s *Store) WriteParts(ctx context.Context, ws []store.PartWrite) []error {
	errs := make([]error, len(ws))
	seen := map[string]bool{}
	for start := 0; start < len(ws); {
		end := start
		for ; end < len(ws) && !seen[ws[end].Key]; end++ {
			seen[ws[end].Key] = true
		}
		copy(errs[start:end], s.writeRun(ctx, ws[start:end]))
		clear(seen)
		start = end
	}
	return errs
}

// writeRun writes a run of writes of distinct pages.
func (s *Store) writeRun(ctx context.Context, ws []store.PartWrite) []error {
	errs := make([]error, len(ws))
	var todo []int
	for i := range ws {
		w := &ws[i]
		switch {
		case s.closed.Load():
			errs[i] = errClosed
		case ctx.Err() != nil:
			errs[i] = ctx.Err()
		default:
			errs[i] = w.Validate()
			if errs[i] == nil && len(w.Key) > MaxPageKey {
				errs[i] = fmt.Errorf("write %.40s... part %d: key of %d bytes is longer than %d", w.Key, w.Part, len(w.Key), MaxPageKey)
			}
			if errs[i] == nil && len(w.Manifest) > maxManifestKey {
				errs[i] = fmt.Errorf("write %s part %d: manifest key of %d bytes is longer than %d", w.Key, w.Part, len(w.Manifest), maxManifestKey)
			}
		}
		if errs[i] == nil {
			todo = append(todo, i)
		}
	}
	if len(todo) == 0 {
		return errs
	}
	failAll := func(op string, err error) []error {
		err = s.fail(ctx, op, err)
		for _, i := range todo {
			errs[i] = err
		}
		return errs
	}
	// Complete pages are kept as they are.
	keys := make([]string, len(todo))
	for j, i := range todo {
		keys[j] = ws[i].Key
	}
	objs, err := s.Query(ctx, keys)
	if err != nil {
		return failAll("write", err)
	}
	keep := todo[:0]
	for j, i := range todo {
		switch {
		case objs[j].Err != nil:
			errs[i] = objs[j].Err
		case objs[j].Complete:
			errs[i] = store.ErrComplete
		default:
			keep = append(keep, i)
		}
	}
	todo = keep
	if err := s.claim(ctx, ws, todo, errs); err != nil {
		return failAll("claim", err)
	}
	keep = todo[:0]
	for _, i := range todo {
		if errs[i] == nil {
			keep = append(keep, i)
		}
	}
	todo = keep
	if len(todo) == 0 {
		return errs
	}
	pk := make([]string, len(todo))
	data := make([][][]byte, len(todo))
	for j, i := range todo {
		w := &ws[i]
		pk[j] = partKey(w.Key, manifestDigest(w.Manifest), w.Part)
		data[j] = w.Data
	}
	for j, err := range s.e.Put(ctx, pk, data) {
		if err != nil {
			errs[todo[j]] = s.fail(ctx, fmt.Sprintf("write %s part %d", ws[todo[j]].Key, ws[todo[j]].Part), err)
		}
	}
	s.commit(ctx, ws, todo, errs)
	return errs
}

// claim settles the claims of the pages of writes todo: a page without
// one is claimed for its write; a claim of another layout refuses the
// write, or when it is older than the lease is replaced. It sets the error
// of each write it refuses; its own error is for the batch.
func (s *Store) claim(ctx context.Context, ws []store.PartWrite, todo []int, errs []error) error {
	pages := map[string]int{} // page key -> a write of it
	var keys []string
	for _, i := range todo {
		if _, ok := pages[ws[i].Key]; !ok {
			pages[ws[i].Key] = i
			keys = append(keys, ws[i].Key)
		}
	}
	claims := map[string]*claim{}
	for attempt := 0; attempt < 3 && len(keys) > 0; attempt++ {
		ck := make([]string, len(keys))
		for j, k := range keys {
			ck[j] = claimKey(k)
		}
		vals, err := s.e.Get(ctx, ck, maxClaimBytes)
		if err == nil && len(vals) != len(ck) {
			err = fmt.Errorf("engine answered %d of %d keys", len(vals), len(ck))
		}
		if err != nil {
			return err
		}
		var put []string
		var putData [][][]byte
		var stale []string
		for j, k := range keys {
			w := &ws[pages[k]]
			if vals[j] == nil {
				put = append(put, ck[j])
				putData = append(putData, [][]byte{(&claim{parts: w.Parts, at: s.now(), manifest: w.Manifest}).bytes()})
				continue
			}
			c, err := parseClaim(vals[j])
			if err == nil {
				claims[k] = c
				if c.manifest == w.Manifest && c.parts == w.Parts || s.now().Sub(c.at) <= s.lease {
					continue
				}
			}
			// Another layout's claim older than the lease, or one that
			// does not parse: replace it, and drop the parts it names.
			delete(claims, k)
			stale = append(stale, ck[j])
			if c != nil {
				d := manifestDigest(c.manifest)
				for p := range c.parts {
					stale = append(stale, partKey(k, d, p))
				}
			}
		}
		if len(stale) > 0 {
			if err := s.e.Remove(ctx, stale); err != nil {
				return err
			}
			continue // read the claims again, and put the missing ones
		}
		if len(put) == 0 {
			break
		}
		for _, err := range s.e.Put(ctx, put, putData) {
			if err != nil {
				return err
			}
		}
		// Read them back: the first writer won.
	}
	for _, i := range todo {
		w := &ws[i]
		c := claims[w.Key]
		switch {
		case c == nil:
			errs[i] = fmt.Errorf("%s: write %s part %d: the page's claim keeps changing", s.name, w.Key, w.Part)
		case c.manifest != w.Manifest || c.parts != w.Parts:
			errs[i] = store.ErrLayoutConflict
		}
	}
	return nil
}

// commit puts K/done for each page of writes todo that the writes
// completed: every part of its manifest exists. A failure to commit is
// not the write's: the part is written, and the next write of the page (a
// retry, another rank) commits it.
func (s *Store) commit(ctx context.Context, ws []store.PartWrite, todo []int, errs []error) {
	type page struct {
		key, manifest string
		parts         int
		first         int // its first part key in pk
	}
	var pages []page
	var pk []string
	seen := map[string]bool{}
	for _, i := range todo {
		w := &ws[i]
		if errs[i] != nil || seen[w.Key] {
			continue
		}
		seen[w.Key] = true
		d := manifestDigest(w.Manifest)
		pages = append(pages, page{w.Key, w.Manifest, w.Parts, len(pk)})
		for p := range w.Parts {
			pk = append(pk, partKey(w.Key, d, p))
		}
	}
	if len(pk) == 0 {
		return
	}
	sizes, err := s.e.Sizes(ctx, pk)
	if err != nil || len(sizes) != len(pk) {
		return
	}
	var dk []string
	var data [][][]byte
	for _, p := range pages {
		ps := make([]int, p.parts)
		complete := true
		for q := range ps {
			if n := sizes[p.first+q]; n < 0 {
				complete = false
				break
			} else {
				ps[q] = int(n)
			}
		}
		if complete {
			dk = append(dk, doneKey(p.key))
			data = append(data, [][]byte{encodeCommit(p.manifest, ps)})
		}
	}
	if len(dk) > 0 {
		s.e.Put(ctx, dk, data)
	}
}

// PutMeta implements store.Store.
func (s *Store) PutMeta(ctx context.Context, key string, val []byte) error {
	if s.closed.Load() {
		return errClosed
	}
	if err := store.CheckMetaSize(key, int64(len(val))); err != nil {
		return err
	}
	// A manifest the engine listed but lost (a holder that died) is kept
	// by the first put and not found when read back; the engine then
	// drops it, and the second put stores it anew.
	var got []byte
	var err error
	for range 2 {
		if err := s.e.Put(ctx, []string{metaKey(key)}, [][][]byte{{val}})[0]; err != nil {
			return s.fail(ctx, "put meta "+key, err)
		}
		if got, err = s.GetMeta(ctx, key); !errors.Is(err, store.ErrNotFound) {
			break
		}
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		return s.fail(ctx, "put meta "+key, errors.New("stored but not found when read back"))
	case err != nil:
		return err
	case !bytes.Equal(got, val):
		return store.ErrMetaConflict
	}
	return nil
}

// GetMeta implements store.Store.
func (s *Store) GetMeta(ctx context.Context, key string) ([]byte, error) {
	if s.closed.Load() {
		return nil, errClosed
	}
	vals, err := s.e.Get(ctx, []string{metaKey(key)}, store.MaxMetaBytes)
	if err == nil && len(vals) != 1 {
		err = fmt.Errorf("engine answered %d of 1 keys", len(vals))
	}
	if err != nil {
		return nil, s.fail(ctx, "get meta "+key, err)
	}
	if vals[0] == nil {
		return nil, store.ErrNotFound
	}
	return vals[0], nil
}

// ReadRanges implements store.Store. The ranges of a batch go to the
// engine in one Read, a segment of a scatter list a range. A part found
// missing under a page's commit makes that page a miss and drops the
// commit (see the package documentation).
func (s *Store) ReadRanges(ctx context.Context, rs []store.Range) (int, error) {
	if s.closed.Load() {
		return 0, errClosed
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	// The commit of each page, as a query finds it.
	var ask []string
	asked := map[string]bool{}
	for i := range rs {
		k := rs[i].Key
		if _, ok := s.done.Get(k); !ok && !asked[k] {
			asked[k] = true
			ask = append(ask, k)
		}
	}
	if len(ask) > 0 {
		if _, err := s.Query(ctx, ask); err != nil {
			return 0, err
		}
	}
	var er []Range
	ends := make([]int, len(rs)) // the end of each store range in er
	valid := len(rs)
	var rangeErr error
	for i := range rs {
		r := &rs[i]
		c, ok := s.done.Get(r.Key)
		var err error
		switch {
		case !ok || r.Part < 0 || r.Part >= len(c.sizes):
			err = &store.RangeError{Key: r.Key, Part: r.Part, Off: r.Off, Len: r.Len(), Err: store.ErrNotFound}
		case r.Manifest != "" && r.Manifest != c.manifest:
			err = &store.RangeError{Key: r.Key, Part: r.Part, Off: r.Off, Len: r.Len(), Err: store.ErrChanged}
		default:
			err = r.CheckBounds(r.Len(), c.sizes[r.Part])
		}
		if err != nil {
			valid, rangeErr = i, err
			break
		}
		key, off := partKey(r.Key, c.digest, r.Part), int64(r.Off)
		whole := r.Off == 0 && r.Len() == c.sizes[r.Part] && len(r.Dst) == 1
		for _, d := range r.Dst {
			if len(d) > 0 {
				er = append(er, Range{Key: key, Off: off, Dst: d, Whole: whole})
				off += int64(len(d))
			}
		}
		ends[i] = len(er)
	}
	n, err := s.mem.read(ctx, s.e, er[:ends0(ends, valid)])
	done := 0
	for done < valid && ends[done] <= n {
		done++
	}
	if done < valid {
		r := &rs[done]
		if errors.Is(err, ErrNotFound) {
			if c, ok := s.done.Get(r.Key); ok {
				s.lost(ctx, r.Key, c)
			}
			err = store.ErrNotFound
		}
		return done, &store.RangeError{Key: r.Key, Part: r.Part, Off: r.Off, Len: r.Len(), Err: s.fail(ctx, "read", err)}
	}
	return done, rangeErr
}

// ends0 is the end in the engine's ranges of the first n store ranges.
func ends0(ends []int, n int) int {
	if n == 0 {
		return 0
	}
	return ends[n-1]
}

// lost handles a part of page key found missing under its commit c: the
// page can no longer be read, and writers would skip it as complete. It
// removes the parts c names, and, if the page's commit is c still (or
// cannot be read), the commit and the claim: the page is removed whole,
// and written again as a new page (a part that an engine lists but cannot
// read any more, as Mooncake's of a holder that died, would otherwise be
// kept by the next put of its key). Best effort.
func (s *Store) lost(ctx context.Context, key string, c *commit) {
	s.done.Remove(key)
	gone := make([]string, 0, len(c.sizes)+2)
	for p := range c.sizes {
		gone = append(gone, partKey(key, c.digest, p))
	}
	vals, err := s.e.Get(ctx, []string{doneKey(key)}, maxCommitBytes)
	if err == nil && len(vals) == 1 {
		now, perr := parseCommit(vals[0])
		if vals[0] == nil || perr == nil && now.manifest == c.manifest {
			gone = append(gone, doneKey(key), claimKey(key))
		}
	}
	s.e.Remove(ctx, gone)
}

// Close implements store.Store: it frees the memory the store allocated
// and closes the engine.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.mem.close()
	return s.e.Close()
}
