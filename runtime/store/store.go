// Package store defines the multipart object store that kvreshard keeps KV
// pages in, and opens backends by URL.
//
// An object is one logical KV page. It has a fixed number of parts; each
// writer rank writes its own part, with a reference to the manifest that
// describes the layout of all parts. The first writer of an object fixes its
// manifest and part count, until the object has gone unwritten for longer
// than a lease (DefaultLease): an abandoned incomplete object may then be
// taken over by a writer of another layout, as if it were new. An object is
// visible (complete) only when every part is written; a complete object is
// immutable and wins over any later writer. Manifests are kept as
// immutable, pinned metadata objects.
//
// The interface stays close to what a Mooncake Store adapter needs: batched
// put-from fragments, batched existence and metadata queries, pinned metadata,
// and batched byte-range reads straight into caller buffers.
package store

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kvreshard/kvreshard/runtime/manifest"
)

// Errors that callers test with errors.Is.
var (
	// ErrComplete: the object is already complete; nothing was written.
	ErrComplete = errors.New("object already complete")
	// ErrLayoutConflict: the incomplete object was claimed with another
	// manifest or part count; nothing was written.
	ErrLayoutConflict = errors.New("object is being written with another layout")
	// ErrNotFound: no such object, part or metadata object.
	ErrNotFound = errors.New("not found")
	// ErrChanged: the object is stored under another manifest than the
	// range expected.
	ErrChanged = errors.New("object changed since it was queried")
	// ErrMetaConflict: a metadata object exists with other content.
	ErrMetaConflict = errors.New("metadata object exists with other content")
)

// PartWrite writes part Part of object Key. Data holds the part's bytes as
// fragments, concatenated in order.
type PartWrite struct {
	Key      string
	Part     int
	Parts    int    // part count of the object
	Manifest string // manifest key
	Data     [][]byte
}

// Size returns the part's length in bytes.
func (w *PartWrite) Size() int {
	n := 0
	for _, f := range w.Data {
		n += len(f)
	}
	return n
}

// Validate checks a part write's fields before anything is written: every
// backend refuses the same writes with the same words.
func (w *PartWrite) Validate() error {
	switch {
	case w.Key == "":
		return fmt.Errorf("write %q part %d: empty key", w.Key, w.Part)
	case w.Parts < 1:
		return fmt.Errorf("write %s part %d: part count %d is not positive", w.Key, w.Part, w.Parts)
	case w.Parts > MaxParts:
		return fmt.Errorf("write %s part %d: part count %d is more than %d", w.Key, w.Part, w.Parts, MaxParts)
	case w.Part < 0 || w.Part >= w.Parts:
		return fmt.Errorf("write %s part %d: part out of range [0,%d)", w.Key, w.Part, w.Parts)
	case w.Manifest == "":
		return fmt.Errorf("write %s part %d: empty manifest key", w.Key, w.Part)
	}
	return nil
}

// Object is what a query returns for one key.
type Object struct {
	Complete  bool   // all parts written; false also for a missing object
	Manifest  string // manifest key (set when Complete)
	PartSizes []int  // size of each part (set when Complete)
	// Err is set, with Complete false, when this object's stored state
	// cannot be read (a corrupt or unreadable claim, a key of the wrong
	// type): the object is not usable, but the other objects of the query
	// are. Query's own error is for the whole batch.
	Err error
}

// Limits every backend enforces on what it writes and checks on what it
// reads, before it allocates: a corrupt or hostile store cannot make a
// process allocate more than these.
const (
	// MaxParts bounds an object's part count. A stored part count past it
	// makes that object unreadable (Object.Err).
	MaxParts = 1 << 16
	// MaxMetaBytes bounds a metadata object: the manifest decoder's limit,
	// so that a store never keeps a manifest no reader accepts. PutMeta
	// refuses larger values; GetMeta reads at most MaxMetaBytes+1 bytes and
	// fails past the limit.
	MaxMetaBytes = manifest.MaxSize
)

// CheckMetaSize returns the error PutMeta and GetMeta give for a metadata
// object of n bytes under key, or nil if n is within MaxMetaBytes.
func CheckMetaSize(key string, n int64) error {
	if n > MaxMetaBytes {
		return fmt.Errorf("metadata %s is %d bytes; the limit is %d", key, n, MaxMetaBytes)
	}
	return nil
}

// DefaultLease is how long an incomplete object's claim must have gone
// unwritten before a writer of another layout may take the object over,
// when a store is not told otherwise. Every part write refreshes the claim.
// A takeover drops the old claim and every part written under it, as if the
// object were new; a complete object is never taken over.
const DefaultLease = 10 * time.Minute

// ParseLease parses the value of a store URL's lease parameter, a positive
// Go duration such as 30s. Its error is the reason of a *URLError.
func ParseLease(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("lease %q is not a positive duration such as 30s or 10m", v)
	}
	return d, nil
}

// LeaseQuery parses the raw query of a store URL of the given scheme that
// takes no parameter but lease: the lease it gives (ParseLease's), 0 when
// the query is empty. Its error is the reason of a *URLError.
func LeaseQuery(scheme, rawQuery string) (time.Duration, error) {
	if rawQuery == "" {
		return 0, nil
	}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return 0, errors.New("cannot parse the query: " + err.Error())
	}
	var lease time.Duration
	for k, v := range q {
		switch {
		case k != "lease":
			return 0, fmt.Errorf("unknown parameter %q; a %s URL takes only lease", k, scheme)
		case len(v) != 1:
			return 0, errors.New("lease is given more than once")
		}
		if lease, err = ParseLease(v[0]); err != nil {
			return 0, err
		}
	}
	return lease, nil
}

// Range reads len(Dst[0])+len(Dst[1])+... bytes at offset Off of part Part of
// object Key, delivering them to the segments of Dst in order (a scatter
// list; one segment for a plain read).
type Range struct {
	Key  string
	Part int
	Off  int
	Dst  [][]byte
	// Manifest, when set, is the manifest key the object had when it was
	// queried: if the object is now stored under another (it expired and
	// another layout wrote it since), the read fails with ErrChanged
	// instead of delivering bytes of a layout the reader did not plan for.
	Manifest string
}

// Len returns the number of bytes the range reads.
func (r *Range) Len() int {
	n := 0
	for _, d := range r.Dst {
		n += len(d)
	}
	return n
}

// CheckBounds returns the *RangeError that ReadRanges gives when the n
// bytes (r.Len()) that r reads at r.Off do not lie within a part of size
// bytes, or nil when they do.
func (r *Range) CheckBounds(n, size int) error {
	var err error
	switch {
	case r.Off < 0:
		err = errNegativeOffset
	case r.Off > size || n > size-r.Off:
		err = fmt.Errorf("past the end of the part (%d bytes)", size)
	default:
		return nil
	}
	return &RangeError{Key: r.Key, Part: r.Part, Off: r.Off, Len: n, Err: err}
}

var errNegativeOffset = errors.New("negative offset")

// RangeError is the error ReadRanges gives for a range it cannot read. Err
// is ErrNotFound when the object is missing or incomplete or has no such
// part, or a reason such as "negative offset" or "past the end of the part
// (128 bytes)". Its text reads like
//
//	read kv_x part 1 [100,164): past the end of the part (128 bytes)
type RangeError struct {
	Key      string
	Part     int
	Off, Len int
	Err      error
}

func (e *RangeError) Error() string {
	return fmt.Sprintf("read %s part %d [%d,%d): %v", e.Key, e.Part, e.Off, e.Off+e.Len, e.Err)
}

func (e *RangeError) Unwrap() error { return e.Err }

// Store is a multipart object store. Implementations are safe for
// concurrent use.
type Store interface {
	// WriteParts writes parts, in order, and returns one error per write:
	// nil, ErrComplete, ErrLayoutConflict, or another error. A failed write
	// leaves nothing that reads as written. Writing a part of an incomplete
	// object again with the same layout is a retry and succeeds; a retry
	// carries the same bytes, and a backend may keep either copy.
	WriteParts(ctx context.Context, ws []PartWrite) []error
	// Query returns the state of each key; only complete objects report
	// Complete.
	Query(ctx context.Context, keys []string) ([]Object, error)
	// PutMeta stores an immutable, pinned metadata object. Storing the same
	// bytes again is a no-op; other bytes give ErrMetaConflict.
	PutMeta(ctx context.Context, key string, val []byte) error
	// GetMeta returns a metadata object, or ErrNotFound.
	GetMeta(ctx context.Context, key string) ([]byte, error)
	// ReadRanges performs the reads in order and returns how many leading
	// ranges were read in full. When n < len(rs), err says why: ctx.Err(),
	// a *RangeError for range n, or another error. Only complete objects
	// are read.
	ReadRanges(ctx context.Context, rs []Range) (n int, err error)
	// Close releases the store's resources.
	Close() error
}

// Viewer is implemented by a store whose parts live in the reader's own
// memory (mem://). ViewPart lends the bytes of part Part of the complete
// object Key instead of copying them, so that a reader's copy kernel moves
// them straight into its pool: the staged read of a whole part costs
// nothing. The bytes never change (a complete object is immutable) and
// the caller must not modify them. Errors are those of ReadRanges for a
// range of the whole part: a *RangeError wrapping ErrNotFound, or
// ErrChanged when manifest is set and the object is stored under another.
type Viewer interface {
	ViewPart(ctx context.Context, key string, part int, manifest string) ([]byte, error)
}

// Allocator is implemented by a store whose transfers want memory
// registered with it (an object engine's, such as Mooncake's): Alloc
// returns n bytes of memory it mapped and registered, outside the Go heap,
// valid until Free or the store's Close. A reader takes its staging and
// checksum buffers from it, so that staged reads land in registered
// memory without a copy.
type Allocator interface {
	Alloc(n int) ([]byte, error)
	Free(b []byte)
}

// Registrar is implemented by a store whose transfers want memory
// registered with it: Register registers memory the caller keeps (a
// rank's host pool) until Unregister, so that reads into it and writes
// from it need no copy. The memory must stay valid until Unregister.
type Registrar interface {
	Register(b []byte) error
	Unregister(b []byte) error
}

// Opener opens a store from a parsed URL.
type Opener func(ctx context.Context, u *url.URL) (Store, error)

var (
	mu      sync.Mutex
	openers = map[string]Opener{}
)

// Register makes a backend available to Open under a URL scheme. Backends
// call it from init.
func Register(scheme string, open Opener) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := openers[scheme]; dup {
		panic("store: scheme registered twice: " + scheme)
	}
	openers[scheme] = open
}

// Schemes lists the registered URL schemes.
func Schemes() []string {
	mu.Lock()
	defer mu.Unlock()
	var s []string
	for k := range openers {
		s = append(s, k+"://")
	}
	sort.Strings(s)
	return s
}

// URLError is a malformed or unsupported store URL.
type URLError struct {
	URL    string
	Reason string
}

func (e *URLError) Error() string { return fmt.Sprintf("store URL %q: %s", e.URL, e.Reason) }

// Open opens the store named by a URL such as mem://, file:///var/kv or
// redis://127.0.0.1:6379. A malformed URL gives a *URLError.
func Open(ctx context.Context, rawURL string) (Store, error) {
	if !strings.Contains(rawURL, "://") {
		return nil, &URLError{rawURL, "missing scheme; use one of " + strings.Join(Schemes(), ", ")}
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, &URLError{rawURL, "cannot parse: " + unwrapURLError(err)}
	}
	mu.Lock()
	open := openers[u.Scheme]
	mu.Unlock()
	if open == nil {
		return nil, &URLError{rawURL, fmt.Sprintf("unknown scheme %q; use one of %s", u.Scheme, strings.Join(Schemes(), ", "))}
	}
	return open(ctx, u)
}

func unwrapURLError(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}
