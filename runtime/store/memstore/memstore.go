// Package memstore is an in-process store, for tests and benchmarks. It
// registers the URL scheme mem:
//
//	mem://       a new, empty store on every Open
//	mem://name   the store called name: every Open of the same name in one
//	             process gives the same store, so that a writer and a reader
//	             opened separately see the same objects
//	mem://?lease=30s, mem://name?lease=30s
//	             the same with a lease other than store.DefaultLease (a
//	             named store keeps the lease it was first opened with; another
//	             lease for it is an error)
//
// A mem URL has nothing else: no user, port, path, other query parameter or
// fragment. Data is
// copied in on writes and out on reads, so callers may reuse their buffers;
// ViewPart (store.Viewer) lends a part's bytes without a copy.
// Close does nothing: a named store lives as long as the process, an unnamed
// one as long as it is reachable.
//
// A part once written is kept: a retry of a part that is already written
// writes nothing and succeeds, as in filestore. An incomplete object that no write has
// touched for longer than the lease is taken over by a writer of another
// layout, as if it were new (see store.DefaultLease); a write is atomic, so
// no takeover can happen in the middle of one.
package memstore

import (
	"bytes"
	"context"
	"fmt"
	"hash/maphash"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/kvreshard/kvreshard/runtime/store"
)

func init() { store.Register("mem", openURL) }

var (
	namedMu sync.Mutex
	named   = map[string]*Store{}
)

func openURL(_ context.Context, u *url.URL) (store.Store, error) {
	bad := func(reason string) (store.Store, error) {
		s := u.String()
		if rest, ok := strings.CutPrefix(s, "mem:"); ok && u.Opaque == "" && !strings.HasPrefix(rest, "//") {
			s = "mem://" + rest // mem://?x prints as mem:?x
		}
		return nil, &store.URLError{URL: s, Reason: reason}
	}
	if u.User != nil || u.Port() != "" || u.Path != "" || (u.ForceQuery && u.RawQuery == "") || u.Fragment != "" || u.Opaque != "" {
		return bad("a mem URL is mem:// or mem://name, with nothing else but ?lease=")
	}
	lease, err := store.LeaseQuery("mem", u.RawQuery)
	if err != nil {
		return bad(err.Error())
	}
	opts := Options{Lease: lease}
	if u.Host == "" {
		return NewOptions(opts), nil
	}
	namedMu.Lock()
	defer namedMu.Unlock()
	s := named[u.Host]
	switch {
	case s == nil:
		s = NewOptions(opts)
		named[u.Host] = s
	case opts.Lease != 0 && opts.Lease != s.lease:
		return bad(fmt.Sprintf("store %q is open with lease %v", u.Host, s.lease))
	}
	return s, nil
}

// Options tune a store.
type Options struct {
	// Lease is how long an incomplete object must have gone unwritten
	// before a writer of another layout may take it over; 0 means
	// store.DefaultLease.
	Lease time.Duration

	now func() time.Time // the clock; nil means time.Now (tests set it)
}

const nShards = 64

// Store is an in-process store. Its zero value is not usable; call New.
type Store struct {
	lease  time.Duration
	now    func() time.Time
	seed   maphash.Seed
	shards [nShards]shard

	metaMu sync.RWMutex
	meta   map[string][]byte
}

type shard struct {
	mu   sync.RWMutex
	objs map[string]*object
	_    [40]byte // keep shards on their own cache lines
}

// object is one multipart object. Once complete it never changes, so its
// parts may be read without a lock.
type object struct {
	manifest string
	parts    [][]byte // nil: not written yet
	missing  int      // parts not written yet
	touched  time.Time
}

// New returns a new, empty store with the default options.
func New() *Store { return NewOptions(Options{}) }

// NewOptions returns a new, empty store.
func NewOptions(opts Options) *Store {
	if opts.Lease <= 0 {
		opts.Lease = store.DefaultLease
	}
	if opts.now == nil {
		opts.now = time.Now
	}
	s := &Store{lease: opts.Lease, now: opts.now, seed: maphash.MakeSeed(), meta: map[string][]byte{}}
	for i := range s.shards {
		s.shards[i].objs = map[string]*object{}
	}
	return s
}

func (s *Store) shard(key string) *shard {
	return &s.shards[maphash.String(s.seed, key)%nShards]
}

// WriteParts implements store.Store.
func (s *Store) WriteParts(ctx context.Context, ws []store.PartWrite) []error {
	errs := make([]error, len(ws))
	for i := range ws {
		if err := ctx.Err(); err != nil {
			errs[i] = err
			continue
		}
		errs[i] = s.writePart(&ws[i])
	}
	return errs
}

func (s *Store) writePart(w *store.PartWrite) error {
	if err := w.Validate(); err != nil {
		return err
	}
	data := make([]byte, 0, w.Size())
	for _, f := range w.Data {
		data = append(data, f...)
	}
	sh := s.shard(w.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	o := sh.objs[w.Key]
	switch {
	case o == nil:
	case o.missing == 0:
		return store.ErrComplete
	case o.manifest == w.Manifest && len(o.parts) == w.Parts:
	case now.Sub(o.touched) <= s.lease:
		return store.ErrLayoutConflict
	default:
		o = nil // the lease has passed: take the object over
	}
	if o == nil {
		o = &object{manifest: w.Manifest, parts: make([][]byte, w.Parts), missing: w.Parts}
		sh.objs[w.Key] = o
	}
	o.touched = now
	if o.parts[w.Part] == nil {
		o.parts[w.Part] = data
		o.missing--
	}
	return nil
}

// complete returns the object under key if it is complete.
func (s *Store) complete(key string) *object {
	sh := s.shard(key)
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	if o := sh.objs[key]; o != nil && o.missing == 0 {
		return o
	}
	return nil
}

// Query implements store.Store.
func (s *Store) Query(ctx context.Context, keys []string) ([]store.Object, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	objs := make([]store.Object, len(keys))
	for i, k := range keys {
		o := s.complete(k)
		if o == nil {
			continue
		}
		sizes := make([]int, len(o.parts))
		for p, b := range o.parts {
			sizes[p] = len(b)
		}
		objs[i] = store.Object{Complete: true, Manifest: o.manifest, PartSizes: sizes}
	}
	return objs, nil
}

// PutMeta implements store.Store.
func (s *Store) PutMeta(ctx context.Context, key string, val []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := store.CheckMetaSize(key, int64(len(val))); err != nil {
		return err
	}
	s.metaMu.Lock()
	defer s.metaMu.Unlock()
	if old, ok := s.meta[key]; ok {
		if !bytes.Equal(old, val) {
			return store.ErrMetaConflict
		}
		return nil
	}
	s.meta[key] = append([]byte{}, val...)
	return nil
}

// GetMeta implements store.Store.
func (s *Store) GetMeta(ctx context.Context, key string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.metaMu.RLock()
	defer s.metaMu.RUnlock()
	v, ok := s.meta[key]
	if !ok {
		return nil, store.ErrNotFound
	}
	return append([]byte{}, v...), nil
}

// ReadRanges implements store.Store.
func (s *Store) ReadRanges(ctx context.Context, rs []store.Range) (int, error) {
	done := ctx.Done()
	var (
		lastKey string
		last    *object
	)
	for i := range rs {
		r := &rs[i]
		if done != nil {
			select {
			case <-done:
				return i, ctx.Err()
			default:
			}
		}
		o := last
		if o == nil || r.Key != lastKey {
			o = s.complete(r.Key)
			lastKey, last = r.Key, o
		}
		if o == nil || r.Part < 0 || r.Part >= len(o.parts) {
			return i, rangeError(r, store.ErrNotFound)
		}
		if r.Manifest != "" && r.Manifest != o.manifest {
			return i, rangeError(r, store.ErrChanged)
		}
		b := o.parts[r.Part]
		if err := r.CheckBounds(r.Len(), len(b)); err != nil {
			return i, err
		}
		b = b[r.Off:]
		for _, d := range r.Dst {
			b = b[copy(d, b):]
		}
	}
	return len(rs), nil
}

// ViewPart implements store.Viewer: the part's bytes, not a copy.
func (s *Store) ViewPart(ctx context.Context, key string, part int, manifest string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	o := s.complete(key)
	if o == nil || part < 0 || part >= len(o.parts) {
		return nil, &store.RangeError{Key: key, Part: part, Err: store.ErrNotFound}
	}
	if manifest != "" && manifest != o.manifest {
		return nil, &store.RangeError{Key: key, Part: part, Len: len(o.parts[part]), Err: store.ErrChanged}
	}
	return o.parts[part], nil
}

func rangeError(r *store.Range, err error) error {
	return &store.RangeError{Key: r.Key, Part: r.Part, Off: r.Off, Len: r.Len(), Err: err}
}

// Close implements store.Store; it does nothing.
func (s *Store) Close() error { return nil }
