package reshard

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/kvreshard/kvreshard/internal/lru"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/partsum"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/store"
)

// ReaderOptions configure a reader.
type ReaderOptions struct {
	Plan plan.Options
	// Manifests bounds the manifest cache; 0 means 64.
	Manifests int
	// MaxPages and MaxBytes are the prefetch budget of one Read: pages past
	// it are not read (0: no limit).
	MaxPages int
	MaxBytes int
	// CopyWorkers bounds the goroutines that run the copies of a Read's
	// staged pages, the calling one included: 0 means GOMAXPROCS, 1 runs
	// every copy on the calling goroutine. Each worker is given at least
	// 512 KiB to copy, so groups under 1 MiB run on the calling goroutine.
	// With 2 or more, the staged batches of a request that stages more
	// than 4 MiB and more than its largest staging round (of at most half
	// the staging bound) are pipelined: the checks and copies of a batch
	// run on up to CopyWorkers other goroutines while the calling one
	// reads the next batch into the other half of the staging buffer.
	CopyWorkers int
	// CheckParts checks every byte a read copies into the pool against
	// the checksums its part was written with (package partsum) before
	// it is copied (read --check-parts): the reader reads the whole
	// checksum blocks of the bytes it needs and each part's trailer, and
	// checks the trailer's root against the page, manifest and part, and
	// each block against its sum. A page that fails is not a hit, and
	// nothing of it is copied out of staging. Reads are then staged, on
	// the planner's staging bound and gap (plan.Planner.Checked). A part
	// lent by a store.Viewer is checked whole the first time the reader
	// sees it: lent bytes never change.
	CheckParts bool
}

// tuning is how a reader divides and overlaps its work. Every reader has
// defaultTuning; the package's tests change one reader's (export_test.go).
type tuning struct {
	// minCopyShare is the least a copy worker is given, in source bytes:
	// starting a goroutine costs about a microsecond, copying 512 KiB 25-50.
	minCopyShare int
	// pipeBatch is the staging bytes a pipelined batch fills when its
	// rounds are smaller: large enough that a batch's goroutines and store
	// call cost little against its bytes, small enough that a request of a
	// few batches has most of its reads overlap checks and copies. 0 takes
	// the transport's (plan.Transport.Batch), or 4 MiB.
	pipeBatch int
	// pipeline overlaps the reads of a staged batch with the checks and
	// copies of the one before.
	pipeline bool
	// onLaunch, when set, is called on the goroutine of each batch put in
	// flight before its checks and copies run; onCopyWorkers with the
	// goroutines that ran each group of copies.
	onLaunch      func()
	onCopyWorkers func(workers int)
}

var defaultTuning = tuning{minCopyShare: 512 << 10, pipeline: true}

// defaultPipeBatch is tuning.pipeBatch for a transport that says none.
const defaultPipeBatch = 4 << 20

// Stats are a reader's counters.
type Stats struct {
	Requests          int64 // Read calls
	Pages             int64 // pages requested
	Hits              int64 // pages read in full
	Misses            int64 // pages requested but not read
	Bytes             int64 // bytes read into the pool
	Ops               int64 // range reads issued
	ManifestsRejected int64 // manifests missing, corrupt or of another model
	Fallbacks         int64 // plans built on the interpreter
	// PartsChecked counts the parts whose checksums were checked (of the
	// pages read, and of the page that failed a check); ChecksumErrors the
	// pages that were damaged: bytes that did not match their checksums,
	// or parts whose sizes did not match the manifest.
	PartsChecked   int64
	ChecksumErrors int64
}

// Reader reads pages into one rank's pool.
type Reader struct {
	st      store.Store
	domain  string
	planner *plan.Planner
	opts    ReaderOptions
	tune    tuning

	manifests *lru.Cache[*manifest.Manifest] // validated, by manifest key

	requests, pages, hits, misses, bytes, ops, rejected atomic.Int64
	checked, badSums                                    atomic.Int64

	// checkPlans holds the checked plans of CheckParts, by manifest ID.
	checkPlans *lru.Cache[checkPlan]
	// lent holds the parts lent by a store.Viewer that passed their check.
	lent lentChecked

	// buffers holds staging and trailer buffers; bufs the ranges and
	// segments of a Read.
	buffers buffers
	bufs    sync.Pool
}

// NewReader returns a reader of pages of the model domain into a pool
// bound as b.
func NewReader(st store.Store, domain string, d *manifest.Descriptor, b plan.Binding, opts ReaderOptions) (*Reader, error) {
	p, err := plan.NewPlanner(d, b, opts.Plan)
	if err != nil {
		return nil, err
	}
	if opts.Manifests <= 0 {
		opts.Manifests = 64
	}
	if opts.CopyWorkers < 0 {
		return nil, fmt.Errorf("copy workers: %d; want 0 (GOMAXPROCS) or more", opts.CopyWorkers)
	}
	if opts.CopyWorkers == 0 {
		opts.CopyWorkers = runtime.GOMAXPROCS(0)
	}
	r := &Reader{st: st, domain: domain, planner: p, opts: opts, tune: defaultTuning, manifests: lru.New[*manifest.Manifest](opts.Manifests),
		checkPlans: lru.New[checkPlan](p.Options().Templates)}
	r.buffers.alloc, _ = st.(store.Allocator)
	r.bufs.New = func() any { return new(execBufs) }
	return r, nil
}

// Planner returns the reader's planner.
func (r *Reader) Planner() *plan.Planner { return r.planner }

// Geometry returns the reader's pool geometry.
func (r *Reader) Geometry() *plan.Geometry { return r.planner.Geometry() }

// Stats returns the reader's counters.
func (r *Reader) Stats() Stats {
	return Stats{
		Requests: r.requests.Load(), Pages: r.pages.Load(), Hits: r.hits.Load(), Misses: r.misses.Load(),
		Bytes: r.bytes.Load(), Ops: r.ops.Load(), ManifestsRejected: r.rejected.Load(), Fallbacks: r.planner.Fallbacks(),
		PartsChecked: r.checked.Load(), ChecksumErrors: r.badSums.Load(),
	}
}

// queryBatch is the number of keys a Read or Exists asks the store about
// at once: a request stops querying at the first batch with an incomplete
// page, so a long request past the cached prefix costs one batch.
const queryBatch = 256

// Read reads the pages keys[i] into slot slots[i] of the pool regions. It
// reads the leading run of complete pages and reports how many it read in
// full. An error is returned only for bad arguments; everything that makes
// a page a miss is in Result.Stop.
//
// With CheckParts, every byte is checked against its part's checksums
// before it is copied into the pool: a mismatch stops the read at that
// page with store.ErrChecksum. Without it, nothing is checked.
func (r *Reader) Read(ctx context.Context, keys []string, slots []int, regions [][]byte) (Result, error) {
	var res Result
	if len(slots) != len(keys) {
		return res, fmt.Errorf("%d keys but %d slots", len(keys), len(slots))
	}
	g := r.planner.Geometry()
	if err := g.CheckRegions(regions); err != nil {
		return res, err
	}
	if err := r.planner.CheckSlots(slots); err != nil {
		return res, err
	}
	r.requests.Add(1)
	r.pages.Add(int64(len(keys)))
	defer func() {
		r.hits.Add(int64(res.Hit))
		r.misses.Add(int64(len(keys) - res.Hit))
		r.bytes.Add(int64(res.Bytes))
		r.ops.Add(int64(res.Ops))
	}()

	n := len(keys)
	if r.opts.MaxPages > 0 && n > r.opts.MaxPages {
		n, res.Stop = r.opts.MaxPages, fmt.Errorf("%w: %d pages", ErrBudget, r.opts.MaxPages)
	}
	if r.opts.MaxBytes > 0 && n*g.PageBytes > r.opts.MaxBytes {
		n, res.Stop = r.opts.MaxBytes/g.PageBytes, fmt.Errorf("%w: %d bytes", ErrBudget, r.opts.MaxBytes)
	}
	if n == 0 {
		return res, nil
	}
	if err := ctx.Err(); err != nil {
		res.Stop = err
		return res, nil
	}
	pages, stop := r.lookup(ctx, keys[:n])
	if stop != nil {
		res.Stop = stop
	}
	if len(pages.tpls) == 0 {
		return res, nil
	}
	tpls := pages.tpls
	x := r.newExec(ctx, tpls, keys, slots, regions)
	defer x.release()
	for i := range tpls {
		if x.err != nil || !x.add(i) {
			break
		}
	}
	x.flush(true)
	res.Hit = x.hit
	for _, t := range tpls[:x.hit] {
		res.Bytes += t.Bytes
		res.Ops += t.OpCount()
	}
	if x.err != nil {
		key := keys[res.Hit]
		if errors.Is(x.err, store.ErrNotFound) || errors.Is(x.err, store.ErrChanged) {
			// Evicted or rewritten since the query: a miss, as if the
			// query had come a moment later.
			res.Stop = fmt.Errorf("%w: %s: %w", ErrMiss, key, x.err)
		} else {
			res.Stop = fmt.Errorf("page %s: %w", key, x.err)
		}
	}
	return res, nil
}

// Exists returns the number of leading pages of keys that are complete and
// whose manifests this reader accepts: the pages a Read would read, but
// for one that changes in between. Like Read, it queries the store in
// batches and stops at the first page that is not. The error says why
// that page is not readable when it is not a plain miss: a failed query,
// an unreadable object, a rejected manifest or layout (ErrManifest),
// cancellation; it is nil for a missing or incomplete page, and when every
// page exists.
func (r *Reader) Exists(ctx context.Context, keys []string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	pages, stop := r.lookup(ctx, keys)
	if errors.Is(stop, ErrMiss) {
		stop = nil
	}
	return len(pages.tpls), stop
}

// found is the leading run of readable pages of a request: each page's
// plan (its template, or with CheckParts the template's checked plan).
type found struct {
	tpls []*plan.Plan
}

// lookup queries keys in batches of queryBatch and returns the leading run
// of complete pages whose manifests validate and whose layouts plan, and
// why the run ends before the last key (nil when it does not).
func (r *Reader) lookup(ctx context.Context, keys []string) (found, error) {
	var f found
	for at := 0; at < len(keys); at += queryBatch {
		batch := keys[at:min(at+queryBatch, len(keys))]
		objs, err := query(ctx, r.st, batch)
		if err != nil {
			return f, err
		}
		if f.tpls == nil {
			f.tpls = make([]*plan.Plan, 0, min(len(keys), 4*queryBatch))
		}
		for i, o := range objs {
			key := batch[i]
			if o.Err != nil {
				return f, fmt.Errorf("page %s: %w", key, o.Err)
			}
			if !o.Complete {
				return f, fmt.Errorf("%w: %s", ErrMiss, key)
			}
			m, err := r.manifest(ctx, o.Manifest)
			if err != nil {
				return f, fmt.Errorf("page %s: %w", key, err)
			}
			if err := checkObject(m, o); err != nil {
				// The object is damaged, not its manifest.
				r.badSums.Add(1)
				return f, fmt.Errorf("page %s: %w", key, err)
			}
			tpl, err := r.planner.Template(m)
			if err == nil && r.opts.CheckParts {
				tpl, err = r.checkedPlan(tpl)
			}
			if err != nil {
				return f, fmt.Errorf("page %s: %w", key, rejected{err})
			}
			f.tpls = append(f.tpls, tpl)
		}
	}
	return f, nil
}

// query asks st about keys, and fails unless it answers one object a key.
func query(ctx context.Context, st store.Store, keys []string) ([]store.Object, error) {
	objs, err := st.Query(ctx, keys)
	if err == nil && len(objs) != len(keys) {
		err = fmt.Errorf("store returned %d objects for %d keys", len(objs), len(keys))
	}
	if err != nil {
		return nil, fmt.Errorf("query: %w", err)
	}
	return objs, nil
}

// checkPlan is the checked plan of a template (CheckParts).
type checkPlan struct {
	of, plan *plan.Plan
	err      error
}

// checkedPlan returns the checked plan of template tpl, from the cache when
// it has it.
func (r *Reader) checkedPlan(tpl *plan.Plan) (*plan.Plan, error) {
	if c, ok := r.checkPlans.Get(tpl.ManifestID); ok && c.of == tpl {
		return c.plan, c.err
	}
	pl, err := r.planner.Checked(tpl)
	r.checkPlans.Put(tpl.ManifestID, checkPlan{of: tpl, plan: pl, err: err})
	return pl, err
}

// checkObject checks a stored object against its manifest: as many parts,
// each of the size of its data and checksums (partsum.Size). An object
// that differs is damaged (a part cut short or grown): partsum.ErrMismatch,
// as for bytes that fail their checksums, whether or not the reader
// checks them.
func checkObject(m *manifest.Manifest, o store.Object) error {
	if len(o.PartSizes) != len(m.Parts) {
		return fmt.Errorf("object has %d parts; manifest %s has %d: %w", len(o.PartSizes), m.ID(), len(m.Parts), partsum.ErrMismatch)
	}
	for i, n := range o.PartSizes {
		if want := partsum.Size(m.PartBytes(i)); n != want {
			return fmt.Errorf("object part %d has %d bytes; manifest %s says %d, with its checksums: %w", i, n, m.ID(), want, partsum.ErrMismatch)
		}
	}
	return nil
}

// manifest returns the validated manifest stored under key, from the cache
// when it has it.
func (r *Reader) manifest(ctx context.Context, key string) (*manifest.Manifest, error) {
	if m, ok := r.manifests.Get(key); ok {
		return m, nil
	}
	data, err := r.st.GetMeta(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		// Evicted (or never stored): the page is a miss until a writer of
		// the layout publishes the manifest again (Writer.Write does).
		return nil, fmt.Errorf("%w: manifest %s is not in the store", ErrMiss, key)
	}
	if err != nil {
		r.rejected.Add(1)
		return nil, fmt.Errorf("%w: %s: %w", ErrManifest, key, err)
	}
	m, err := manifest.Decode(data, key, r.domain)
	if err != nil {
		r.rejected.Add(1)
		return nil, fmt.Errorf("%w: %s: %w", ErrManifest, key, err)
	}
	r.manifests.Put(key, m)
	return m, nil
}
