package reshard

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/kvreshard/kvreshard/internal/lru"
	"github.com/kvreshard/kvreshard/runtime/manifest"
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
	// CheckParts reads every part the rank needs whole, in part order,
	// and checks each against the checksum it was written with before any
	// byte of its page is copied into the pool (read --check-parts): a
	// page's parts share one staging round, whatever the plan's strategy
	// and staging bound. Without it, only reads that fetch a whole part
	// anyway (staged reads of a whole part, parts a store.Viewer lends)
	// are checked. A part lent by a store.Viewer is hashed the first time
	// the reader sees it: lent bytes never change.
	CheckParts bool
	// SkipPartChecks checks no checksum at all, not even of whole parts
	// (with CheckParts, parts are still read whole): the baseline of the
	// checksum_cost benchmark figure, not for serving.
	SkipPartChecks bool
}

// minCopyShare is the least a copy worker is given, in source bytes:
// starting a goroutine costs about a microsecond, copying 512 KiB 25-50.
// A variable only for the tests.
var minCopyShare = 512 << 10

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
	// PartsChecked counts the whole parts hashed and checked against their
	// checksums (of the pages read, and of the page that failed a check);
	// ChecksumErrors the parts that did not match.
	PartsChecked   int64
	ChecksumErrors int64
}

// Reader reads pages into one rank's pool.
type Reader struct {
	st      store.Store
	domain  string
	planner *plan.Planner
	opts    ReaderOptions

	manifests *lru.Cache[*manifest.Manifest] // validated, by manifest key

	requests, pages, hits, misses, bytes, ops, rejected atomic.Int64
	checked, badSums                                    atomic.Int64

	// checkPlans holds the whole-part plans of CheckParts, by layout id.
	checkPlans *lru.Cache[checkPlan]
	// lent holds the parts lent by a store.Viewer that passed their check.
	lent lentChecked

	// stages holds staging buffers, at most the planner's staging bound,
	// one per Read in progress that has staged plans; bufs the ranges and
	// segments of a Read.
	stages, bufs sync.Pool
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
	r := &Reader{st: st, domain: domain, planner: p, opts: opts, manifests: lru.New[*manifest.Manifest](opts.Manifests),
		checkPlans: lru.New[checkPlan](p.Options().Templates)}
	r.stages.New = func() any { return new([]byte) }
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

// Result is what one Read did.
type Result struct {
	// Hit is the number of leading pages read in full; only they may be
	// used.
	Hit   int
	Bytes int
	Ops   int
	// Stop says why the read stopped before the last requested page: a
	// miss, a rejected manifest, the budget, cancellation, a part that
	// failed its checksum, or a failed query or read (Classify sorts them).
	// It is nil when every page was read.
	Stop error
}

// Errors that say why a read stopped early.
var (
	// ErrMiss: the page is missing or incomplete, or its part vanished
	// (evicted or rewritten in another layout) between the query and the
	// read; then the store's error is wrapped too.
	ErrMiss = errors.New("page missing or incomplete")
	// ErrBudget: the page is past the reader's prefetch budget.
	ErrBudget = errors.New("prefetch budget reached")
	// ErrManifest: the page's manifest is missing, corrupt or of another
	// model domain, does not match the stored object, or describes a layout
	// this reader cannot plan (no compiled kernel when they are required,
	// over the plan limits, another page geometry).
	ErrManifest = errors.New("manifest rejected")
)

// StopReason is the kind of a Result.Stop, for callers that map it to a
// code (the C binding) or an exit status (kvreshard read).
type StopReason uint8

// The kinds of Result.Stop.
const (
	StopNone     StopReason = iota // nil: every page was read
	StopMiss                       // ErrMiss: a cache miss, not a failure
	StopBudget                     // ErrBudget: the prefetch budget, not a failure
	StopCanceled                   // the context was canceled or its deadline passed
	StopRejected                   // ErrManifest: the page's layout was refused
	StopChecksum                   // store.ErrChecksum: a part's bytes are corrupt
	StopFailed                     // a failed query or read, an unreadable object
)

var stopNames = [...]string{"none", "miss", "budget", "canceled", "rejected", "checksum", "failed"}

func (s StopReason) String() string {
	if int(s) < len(stopNames) {
		return stopNames[s]
	}
	return fmt.Sprintf("stop(%d)", s)
}

// Classify returns the kind of a Result.Stop.
func Classify(stop error) StopReason {
	switch {
	case stop == nil:
		return StopNone
	case errors.Is(stop, ErrMiss):
		return StopMiss
	case errors.Is(stop, ErrBudget):
		return StopBudget
	case errors.Is(stop, context.Canceled), errors.Is(stop, context.DeadlineExceeded):
		return StopCanceled
	case errors.Is(stop, store.ErrChecksum):
		return StopChecksum
	case errors.Is(stop, ErrManifest):
		return StopRejected
	}
	return StopFailed
}

// rejected marks an error that refuses a page's layout as ErrManifest,
// keeping its text.
type rejected struct{ err error }

func (e rejected) Error() string        { return e.err.Error() }
func (e rejected) Unwrap() error        { return e.err }
func (e rejected) Is(target error) bool { return target == ErrManifest }

// queryBatch is the number of keys a Read or Exists asks the store about
// at once: a request stops querying at the first batch with an incomplete
// page, so a long request past the cached prefix costs one batch.
const queryBatch = 256

// Read reads the pages keys[i] into slot slots[i] of the pool regions. It
// reads the leading run of complete pages and reports how many it read in
// full. An error is returned only for bad arguments; everything that makes
// a page a miss is in Result.Stop.
//
// Every read that fetches a whole part (a staged read of the whole part, a
// part lent by a store.Viewer; every part with CheckParts) is checked
// against the part's checksum before its bytes are copied into the pool,
// unless SkipPartChecks: a mismatch stops the read at that page with
// store.ErrChecksum.
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
	if r.opts.CheckParts {
		var last, whole *plan.Plan // runs of pages of one layout are common
		for i, t := range tpls {
			if t != last {
				last, whole = t, r.wholeParts(t)
			}
			tpls[i] = whole
		}
	}
	x := r.newExec(ctx, tpls, pages.sums, keys, slots, regions)
	defer x.release()
	for i := range tpls {
		if !x.add(i) {
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
// template and the checksums of its parts (nil when the store has none).
type found struct {
	tpls []*plan.Plan
	sums [][]uint64
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
			f.sums = make([][]uint64, 0, cap(f.tpls))
		}
		for i, o := range objs {
			key := batch[i]
			if o.Err != nil {
				return f, fmt.Errorf("page %s: %w", key, o.Err)
			}
			if !o.Complete {
				return f, fmt.Errorf("%w: %s", ErrMiss, key)
			}
			if o.Checksums != nil && len(o.Checksums) != len(o.PartSizes) {
				return f, fmt.Errorf("page %s: object has %d part checksums for %d parts", key, len(o.Checksums), len(o.PartSizes))
			}
			m, err := r.manifest(ctx, o.Manifest)
			if err != nil {
				return f, fmt.Errorf("page %s: %w", key, err)
			}
			var tpl *plan.Plan
			if err = checkObject(m, o); err == nil {
				tpl, err = r.planner.Template(m)
			}
			if err != nil {
				return f, fmt.Errorf("page %s: %w", key, rejected{err})
			}
			f.tpls = append(f.tpls, tpl)
			f.sums = append(f.sums, o.Checksums)
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

// checkPlan is the whole-part plan of a template (CheckParts).
type checkPlan struct {
	of, plan *plan.Plan
}

// wholeParts returns the plan of tpl's page that reads each part it needs
// whole, in part order, into staging, and copies its runs from there: with
// the pair's copy kernel where tpl has a kernel read of that part, run by
// run otherwise. The reads of a page share one staging round, so that
// every part of it is checked before any byte of it reaches the pool (the
// staging buffer grows past the planner's bound when they need more).
func (r *Reader) wholeParts(tpl *plan.Plan) *plan.Plan {
	if c, ok := r.checkPlans.Get(tpl.LayoutID); ok && c.of == tpl {
		return c.plan
	}
	m := tpl.Manifest
	pl := *tpl // keeps the template's copy kernels
	pl.Strategy, pl.Reads, pl.ReadBytes, pl.StageBytes, pl.Rounds = plan.Staged, nil, 0, 0, 1
	pl.Estimate, pl.Estimates = 0, [plan.Auto]time.Duration{}
	ops := tpl.Ops
	bySource := func(a, b plan.Op) int {
		if a.Part != b.Part {
			return int(a.Part) - int(b.Part)
		}
		return a.Src - b.Src
	}
	if !slices.IsSortedFunc(ops, bySource) {
		ops = slices.Clone(ops)
		slices.SortFunc(ops, bySource)
	}
	pl.Ops = ops
	for a := 0; a < len(ops); {
		part := ops[a].Part
		b := a
		for b < len(ops) && ops[b].Part == part {
			b++
		}
		rd := plan.Read{Part: part, Len: m.PartBytes(int(part)), First: a, N: b - a, Stage: (pl.StageBytes + 63) &^ 63}
		if tpl.Strategy == plan.Staged {
			// A kernel read of this part is already whole, over the same
			// ops (the template's staged ops are in source order).
			for _, k := range tpl.Reads {
				if k.Part == part && k.Kernel && k.First == a && k.N == b-a {
					rd.Kernel = true
				}
			}
		}
		pl.StageBytes = rd.Stage + rd.Len
		pl.ReadBytes += rd.Len
		pl.Reads = append(pl.Reads, rd)
		a = b
	}
	r.checkPlans.Put(tpl.LayoutID, checkPlan{of: tpl, plan: &pl})
	return &pl
}

// exec issues the ranges of a request's plans in page order, in batches:
// direct and scatter ranges read straight into the pool; the reads of a
// staged round take room in the staging buffer, and when a round does not
// fit, the batch so far is read and its rounds are copied out first. A
// store that lends its parts (store.Viewer) has no staged reads: the copies
// run from its bytes. The copies wait in a queue until the batch is read
// or a read fails, and then run together, on up to CopyWorkers goroutines,
// after the checks of the whole parts read or lent, which run the same
// way. A page counts once every range of it is read, every check of it
// passed and every copy of it done; nothing of a staged page that failed
// is copied out of staging, unless its staging took more than one batch
// (direct and scatter ranges land in the pool as they are read).
//
// With two copy workers or more, staged batches are pipelined when the
// staging bound holds two rounds or more: the staging buffer is split in
// two halves, and while the checks and copies of the batch read into one
// run on other goroutines (in flight), the calling goroutine reads the
// next batch into the other. The checks and copies of a batch start only
// once those of the batch before are done, and not at all when they
// failed; a batch with direct or scatter ranges is read only then too. So
// pages still complete in order, and nothing of a page after one that
// failed reaches the pool.
type exec struct {
	r       *Reader
	ctx     context.Context
	tpls    []*plan.Plan
	sums    [][]uint64 // the checksums of each page's parts (nil: none)
	keys    []string
	slots   []int
	regions [][]byte

	bufs   *execBufs
	ranges []store.Range
	segs   [][]byte
	delta  []int // what the page's slot adds to an offset, per region
	units  []unit
	start  int // first range of the batch
	stage  *[]byte
	half   int      // bytes of a half of the staging buffer when batches are pipelined, 0 when not
	lo, hi int      // the staging bytes the batch may use
	used   int      // the end of the staging bytes the batch uses
	direct bool     // the batch has ranges that read into the pool
	views  [][]byte // the reads of a page a store lends (view)

	q     batch      // the checks and copies queued
	fly   batch      // those in flight, when flying
	done  chan error // the error of the batch in flight
	ready int        // pages read in full once the queued checks pass and copies run

	flying bool
	hit    int   // pages read in full
	err    error // why the reads stopped
}

// batch is the checks and copies of a batch of reads, and the pages read in
// full once they pass and run.
type batch struct {
	copies    []copyJob // in page order
	copyBytes int       // their source bytes
	checks    []copyJob // whole parts to check before the copies, in page order (k: the part)
	checkOK   []bool    // the result of each check
	ready     int
}

// copyJob is the copy of staged read k of page, whose bytes are src; or
// the check of part k of page, whose bytes are src, lent by the store when
// lent is set. A check of staged bytes has room: src preceded by the
// staging bytes reserved for the checksum's prefix (store.PartChecksumInPlace).
type copyJob struct {
	page, k int
	src     []byte
	room    []byte
	lent    bool
}

// lentChecked remembers the parts lent by a store.Viewer that passed their
// check, by the memory that holds them, their length and checksum (which
// binds the manifest and part number): a lent part never changes
// (store.Viewer), so a reader hashes it the first time it sees it, not on
// every read. The weak pointers neither keep a part alive nor match
// another part allocated where a collected one was. It holds at most
// lentBound parts, and starts over when full.
type lentChecked struct {
	mu sync.Mutex
	m  map[lentPart]struct{}
}

type lentPart struct {
	at  weak.Pointer[byte]
	n   int
	sum uint64
}

const lentBound = 1 << 14

func (l *lentChecked) has(b []byte, sum uint64) bool {
	if len(b) == 0 {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.m[lentPart{weak.Make(&b[0]), len(b), sum}]
	return ok
}

func (l *lentChecked) add(b []byte, sum uint64) {
	if len(b) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil || len(l.m) >= lentBound {
		l.m = make(map[lentPart]struct{})
	}
	l.m[lentPart{weak.Make(&b[0]), len(b), sum}] = struct{}{}
}

// unit is a run of ranges of one page that ends at end: the whole page, or
// one staging round of reads [reads[0], reads[1]) placed at base.
type unit struct {
	page  int
	end   int
	last  bool // the page's last unit
	reads [2]int
	base  int
}

func (r *Reader) newExec(ctx context.Context, tpls []*plan.Plan, sums [][]uint64, keys []string, slots []int, regions [][]byte) *exec {
	nr, ns := 0, 0
	for _, t := range tpls {
		nr += t.OpCount()
		if t.Strategy == plan.Staged {
			ns += len(t.Reads)
		} else {
			ns += len(t.Ops)
		}
	}
	b := r.bufs.Get().(*execBufs)
	if cap(b.ranges) < nr {
		b.ranges = make([]store.Range, 0, nr)
	}
	if cap(b.segs) < ns {
		b.segs = make([][]byte, 0, ns)
	}
	return &exec{r: r, ctx: ctx, tpls: tpls, sums: sums, keys: keys, slots: slots, regions: regions,
		bufs: b, ranges: b.ranges[:0], segs: b.segs[:0], q: b.q, fly: b.fly, delta: make([]int, len(regions))}
}

// execBufs are the ranges, segments and copies of a request, reused by
// the next (a large request has a range or segment per run of every page).
type execBufs struct {
	ranges []store.Range
	segs   [][]byte
	q, fly batch
}

// add adds the ranges of page i, reading the batch first when the page's
// staging does not fit. It returns false when a read failed.
func (x *exec) add(i int) bool {
	t, key := x.tpls[i], x.keys[i]
	// Every range names the manifest the page was planned for, so that a
	// page rewritten in another layout since the query fails to read.
	mk := t.Manifest.Key()
	// Placing the template at the slot: one add per op, as Instantiate
	// does, without a copy of the ops.
	for r, s := range x.r.planner.Geometry().SlotStride {
		x.delta[r] = x.slots[i] * s
	}
	switch t.Strategy {
	case plan.Staged:
		if v, ok := x.r.st.(store.Viewer); ok {
			return x.view(v, i, mk)
		}
		if x.stage == nil {
			x.stage = x.r.stages.Get().(*[]byte)
			need, half := x.stageNeed()
			if len(*x.stage) < need {
				*x.stage = make([]byte, need)
			}
			x.half, x.lo, x.hi = half, 0, len(*x.stage)
			if half > 0 {
				x.hi = half
			}
			x.used = x.lo
		}
		for a := 0; a < len(t.Reads); {
			b := roundEnd(t, a)
			foot := roundFoot(t, a, b)
			base := (x.used + 63) &^ 63
			if base+foot > x.hi {
				if !x.flush(false) {
					return false
				}
				base = x.lo
			}
			at := base
			for k := a; k < b; k++ {
				rd := &t.Reads[k]
				s := stageAt(t, k, at)
				at = s + rd.Len
				x.segs = append(x.segs, (*x.stage)[s:s+rd.Len])
				n := len(x.segs)
				x.ranges = append(x.ranges, store.Range{Key: key, Part: int(rd.Part), Off: rd.Src, Dst: x.segs[n-1 : n : n], Manifest: mk})
			}
			x.used = base + foot
			x.units = append(x.units, unit{page: i, end: len(x.ranges), last: b == len(t.Reads), reads: [2]int{a, b}, base: base})
			a = b
		}
		return true
	case plan.Scatter:
		for _, rd := range t.Reads {
			n := len(x.segs)
			for _, op := range t.Ops[rd.First : rd.First+rd.N] {
				d := op.Dst + x.delta[op.Region]
				x.segs = append(x.segs, x.regions[op.Region][d:d+op.Len])
			}
			x.ranges = append(x.ranges, store.Range{Key: key, Part: int(rd.Part), Off: rd.Src, Dst: x.segs[n:len(x.segs):len(x.segs)], Manifest: mk})
		}
	default:
		for _, op := range t.Ops {
			d := op.Dst + x.delta[op.Region]
			x.segs = append(x.segs, x.regions[op.Region][d:d+op.Len])
			n := len(x.segs)
			x.ranges = append(x.ranges, store.Range{Key: key, Part: int(op.Part), Off: op.Src, Dst: x.segs[n-1 : n : n], Manifest: mk})
		}
	}
	x.units = append(x.units, unit{page: i, end: len(x.ranges), last: true})
	x.direct = true
	return true
}

// view queues the copies of staged page i straight from the parts the
// store lends, and the checks of those parts, after the batch before it is
// read, so that pages still complete in order. Every read is viewed before
// any copy runs, so a page that fails leaves its slot untouched. It returns
// false when a part could not be viewed.
func (x *exec) view(v store.Viewer, i int, mk string) bool {
	if x.start < len(x.ranges) && !x.flush(false) {
		return false
	}
	t, key := x.tpls[i], x.keys[i]
	x.views = x.views[:0]
	checked := -1 // the part last checked: a part's reads are neighbours
	for k := range t.Reads {
		rd := &t.Reads[k]
		b, err := v.ViewPart(x.ctx, key, int(rd.Part), mk)
		if err == nil && rd.Src+rd.Len > len(b) {
			err = &store.RangeError{Key: key, Part: int(rd.Part), Off: rd.Src, Len: rd.Len,
				Err: fmt.Errorf("past the end of the part (%d bytes)", len(b))}
		}
		if err == nil && int(rd.Part) != checked && len(b) == t.Manifest.PartBytes(int(rd.Part)) {
			// A lent part is a whole part: check it, once a page, and
			// not again once it passed.
			x.queueCheck(i, int(rd.Part), b, nil, true)
			checked = int(rd.Part)
		}
		if err != nil {
			x.q.dropFrom(i)
			x.err = err
			return false
		}
		x.views = append(x.views, b[rd.Src:rd.Src+rd.Len])
	}
	for k, b := range x.views {
		x.queue(i, k, b)
	}
	clear(x.views)
	x.ready = i + 1
	return true
}

// queue queues the copy of staged read k of page i from src.
func (x *exec) queue(i, k int, src []byte) {
	x.q.copies = append(x.q.copies, copyJob{page: i, k: k, src: src})
	x.q.copyBytes += len(src)
}

// queueCheck queues the check of the bytes src of part p of page i, read
// whole (lent by the store when lent is set; staged, with room before them
// for the checksum's prefix, otherwise), against the checksum the part was
// written with, unless the reader skips checks, the store has no checksum
// for it, or the reader checked these lent bytes before.
func (x *exec) queueCheck(i, p int, src, room []byte, lent bool) {
	if x.r.opts.SkipPartChecks || p >= len(x.sums[i]) || x.sums[i][p] == 0 {
		return
	}
	if lent && x.r.lent.has(src, x.sums[i][p]) {
		return
	}
	x.q.checks = append(x.q.checks, copyJob{page: i, k: p, src: src, room: room, lent: lent})
}

// runChecks runs the checks of b and drops them. When one fails, it drops
// the copies of its page and of every later page, lowers b.ready to that
// page, and returns its error; pages before it are still read in full.
func (x *exec) runChecks(b *batch) error {
	jobs := b.checks
	if len(jobs) == 0 {
		return nil
	}
	if cap(b.checkOK) < len(jobs) {
		b.checkOK = make([]bool, len(jobs))
	}
	ok := b.checkOK[:len(jobs)]
	total := 0
	for _, j := range jobs {
		total += len(j.src)
	}
	x.parallel(len(jobs), total, func(i int) int { return len(jobs[i].src) }, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			j := &jobs[i]
			ok[i] = checkSum(x.tpls[j.page].Manifest.Key(), j, x.sums[j.page][j.k])
		}
	})
	// The first page with a part that does not match; the checks counted
	// are those of the pages up to it.
	bad, part := -1, 0
	checked, mismatched := 0, 0
	for i, j := range jobs {
		if bad >= 0 && j.page > bad {
			break
		}
		checked++
		if !ok[i] {
			if bad < 0 {
				bad, part = j.page, j.k
			}
			mismatched++
		}
	}
	x.r.checked.Add(int64(checked))
	x.r.badSums.Add(int64(mismatched))
	for i, j := range jobs {
		if ok[i] && j.lent {
			x.r.lent.add(j.src, x.sums[j.page][j.k])
		}
	}
	clear(b.checks)
	b.checks = b.checks[:0]
	if bad < 0 {
		return nil
	}
	b.dropFrom(bad)
	b.ready = min(b.ready, bad)
	return fmt.Errorf("part %d: %w", part, store.ErrChecksum)
}

// run runs the checks of b, then the copies of the pages before the first
// that failed its check, and drops them. It returns the error of the
// failed check; b.ready is then the pages read in full. It splits the
// copies, in order, into shares of about equal bytes, one a worker: the
// copies of a request write disjoint bytes of the pool (its pages have
// distinct slots, and the plans are proven to write no byte twice).
func (x *exec) run(b *batch) error {
	err := x.runChecks(b)
	jobs := b.copies
	w := x.parallel(len(jobs), b.copyBytes, func(i int) int { return len(jobs[i].src) }, func(lo, hi int) {
		for _, j := range jobs[lo:hi] {
			x.r.planner.CopyStaged(x.tpls[j.page], j.k, j.src, x.regions, x.slots[j.page])
		}
	})
	if testHookCopyWorkers != nil && len(jobs) > 0 {
		testHookCopyWorkers(w)
	}
	clear(b.copies)
	b.copies, b.copyBytes = b.copies[:0], 0
	return err
}

// launch starts the checks and copies queued on another goroutine, in
// flight until settle, with the pages read in full once they ran.
func (x *exec) launch() {
	x.q.ready = x.ready
	x.q, x.fly = x.fly, x.q
	if x.done == nil {
		x.done = make(chan error, 1)
	}
	x.flying = true
	go func() {
		if testHookLaunch != nil {
			testHookLaunch()
		}
		x.done <- x.run(&x.fly)
	}()
}

// settle waits for the batch in flight, if any, counts the pages it
// completed, and returns its error.
func (x *exec) settle() error {
	if !x.flying {
		return nil
	}
	x.flying = false
	err := <-x.done
	x.hit = x.fly.ready
	if err != nil {
		x.ready = x.fly.ready
	}
	return err
}

// runQueued runs the checks and copies queued on the calling goroutine
// (and up to CopyWorkers-1 others), and counts the pages they complete.
func (x *exec) runQueued() error {
	x.q.ready = x.ready
	err := x.run(&x.q)
	x.hit, x.ready = x.q.ready, x.q.ready
	return err
}

// testHookLaunch, when set, is called on the goroutine of each batch put in
// flight before its checks and copies run.
var testHookLaunch func()

// parallel runs run over jobs [0,n), whose sizes sum to total bytes, split
// in order into shares of about equal bytes, one a worker, on up to
// CopyWorkers goroutines, with at least minCopyShare bytes a share. It
// returns the goroutines it used, the calling one included.
func (x *exec) parallel(n, total int, size func(i int) int, run func(lo, hi int)) int {
	w := min(x.r.opts.CopyWorkers, n, max(1, total/max(minCopyShare, 1)))
	// Share s starts at the first job with s/w of the bytes before it;
	// the calling goroutine runs the last.
	var wg sync.WaitGroup
	first, s, before := 0, 1, 0
	for i := range n {
		if s < w && before*w >= s*total {
			lo, hi := first, i
			wg.Go(func() { run(lo, hi) })
			first, s = i, s+1
		}
		before += size(i)
	}
	run(first, n)
	wg.Wait()
	return s
}

// testHookCopyWorkers, when set, is called with the goroutines that ran
// each group of copies.
var testHookCopyWorkers func(workers int)

// stageNeed is the staging buffer the request needs: every staging round
// of its pages, up to the planner's bound (each round of a plan fits the
// bound), or its largest round when that is larger (a part read whole for
// CheckParts; a round of whole parts of about the bound, with the room of
// their checksums' prefixes, stageAt). When batches can be pipelined (two
// copy workers or more, two rounds or more, two of the largest within the
// bound, more than one half), half is the size of each half of it: the
// largest round, or more up to pipeBatch and half the bound.
func (x *exec) stageNeed() (need, half int) {
	round, rounds := 0, 0
	for _, t := range x.tpls {
		if t.Strategy != plan.Staged {
			continue
		}
		for a := 0; a < len(t.Reads); {
			b := roundEnd(t, a)
			foot := roundFoot(t, a, b)
			need += (foot + 63) &^ 63
			round = max(round, foot)
			rounds++
			a = b
		}
	}
	bound := x.r.planner.StageBound()
	if pipeline && x.r.opts.CopyWorkers > 1 && rounds > 1 && 2*round <= bound {
		if half = (max(round, min(bound/2, pipeBatch)) + 63) &^ 63; need > half {
			return 2 * half, half
		}
	}
	return max(min(need, bound), round), 0
}

// pipeBatch is the staging bytes a pipelined batch fills when its rounds
// are smaller: large enough that a batch's goroutines and store call cost
// little against its bytes, small enough that a request of a few batches
// has most of its reads overlap checks and copies. A variable only for the
// tests.
var pipeBatch = 4 << 20

// pipeline turns the pipelining of staged batches on: a variable only for
// the tests and benchmarks that compare it with batches one after the
// other.
var pipeline = true

// wholeRead reports whether staged read k of t holds its whole part.
func wholeRead(t *plan.Plan, k int) bool {
	rd := &t.Reads[k]
	return rd.Src == 0 && rd.Len == t.Manifest.PartBytes(int(rd.Part))
}

// stageAt returns where in the staging buffer staged read k of t goes when
// the reads of its round before it end at at: the next multiple of 64
// that leaves room before it for the prefix of its checksum when it reads
// a whole part (store.PartChecksumInPlace), so that a check hashes it in place. A round's
// reads are placed one after the other, in order, from a multiple of 64.
func stageAt(t *plan.Plan, k, at int) int {
	if wholeRead(t, k) {
		at += store.ChecksumPrefix(t.Manifest.Key())
	}
	return (at + 63) &^ 63
}

// roundEnd returns the end of the staging round of t whose reads start at
// read a.
func roundEnd(t *plan.Plan, a int) int {
	b := a
	for b < len(t.Reads) && t.Reads[b].Round == t.Reads[a].Round {
		b++
	}
	return b
}

// roundFoot returns the staging bytes the reads [a,b) of a round of t take
// from the start of the round, placed by stageAt: the plan's footprint of
// the round and a little more, the room of its whole reads' prefixes.
func roundFoot(t *plan.Plan, a, b int) int {
	at := 0
	for k := a; k < b; k++ {
		at = stageAt(t, k, at) + t.Reads[k].Len
	}
	return at
}

// flush reads the batch and queues the checks and copies of the staged
// rounds read in full. Once the batch in flight is done, it runs them: on
// the calling goroutine when last is set, when the read failed or when
// batches are not pipelined; in flight otherwise, and the next batch then
// fills the other half of the staging buffer. It returns false when a read
// or a check failed (in this batch or the one in flight).
func (x *exec) flush(last bool) bool {
	var err error
	if x.direct {
		// Its direct and scatter ranges land in the pool as they are read:
		// not before every page before them passed its checks.
		err = x.settle()
	}
	if err == nil {
		err = x.read()
		if ferr := x.settle(); ferr != nil {
			// A page before those of this batch failed: its queued checks
			// and copies are dropped below.
			err = ferr
		} else if err != nil || last || x.half == 0 {
			if cerr := x.runQueued(); cerr != nil {
				// A page before the one whose read failed, if any.
				err = cerr
			}
		} else {
			x.launch()
			if x.lo == 0 {
				x.lo, x.hi = x.half, 2*x.half
			} else {
				x.lo, x.hi = 0, x.half
			}
		}
	}
	x.units, x.start, x.used, x.direct = x.units[:0], len(x.ranges), x.lo, false
	if err != nil {
		x.q.dropFrom(0)
		x.err = err
		return false
	}
	return true
}

// read reads the batch, queues the checks and copies of the staged rounds
// read in full, and returns the error of a read that failed.
func (x *exec) read() error {
	batch := x.ranges[x.start:]
	done, err := 0, error(nil)
	if len(batch) > 0 {
		done, err = x.r.st.ReadRanges(x.ctx, batch)
	}
	if done < len(batch) && err == nil {
		err = fmt.Errorf("store read %d of %d ranges", done, len(batch))
	}
	if done >= len(batch) {
		err = nil
	}
	for _, u := range x.units {
		if u.end-x.start > done {
			// Nothing of the page that failed reaches the pool.
			x.q.dropFrom(x.ready)
			break
		}
		t := x.tpls[u.page]
		at := u.base
		for k := u.reads[0]; k < u.reads[1]; k++ {
			rd := &t.Reads[k]
			s := stageAt(t, k, at)
			at = s + rd.Len
			if wholeRead(t, k) {
				x.queueCheck(u.page, int(rd.Part), (*x.stage)[s:at], (*x.stage)[s-store.ChecksumPrefix(t.Manifest.Key()):at], false)
			}
			x.queue(u.page, k, (*x.stage)[s:at])
		}
		if u.last {
			x.ready = u.page + 1
		}
	}
	return err
}

// dropFrom drops the copies and checks of b of page p and the pages after
// it (they are queued in page order), so that nothing of a page that
// failed reaches the pool.
func (b *batch) dropFrom(p int) {
	n := len(b.copies)
	for n > 0 && b.copies[n-1].page >= p {
		n--
		b.copyBytes -= len(b.copies[n].src)
	}
	clear(b.copies[n:])
	b.copies = b.copies[:n]
	n = len(b.checks)
	for n > 0 && b.checks[n-1].page >= p {
		n--
	}
	clear(b.checks[n:])
	b.checks = b.checks[:n]
}

// release returns the staging buffer and the range, segment and copy
// buffers, which drop their references to the pool first (run clears the
// copies), once no batch is in flight (the last flush settled it).
func (x *exec) release() {
	_ = x.settle()
	if x.stage != nil {
		x.r.stages.Put(x.stage)
		x.stage = nil
	}
	clear(x.ranges)
	clear(x.segs)
	x.q.dropFrom(0)
	x.bufs.ranges, x.bufs.segs, x.bufs.q, x.bufs.fly = x.ranges[:0], x.segs[:0], x.q, x.fly
	x.r.bufs.Put(x.bufs)
	x.bufs = nil
}

// checkObject checks a stored object against its manifest.
func checkObject(m *manifest.Manifest, o store.Object) error {
	if len(o.PartSizes) != len(m.Parts) {
		return fmt.Errorf("object has %d parts; manifest %s has %d", len(o.PartSizes), m.LayoutID(), len(m.Parts))
	}
	for i, n := range o.PartSizes {
		if n != m.PartBytes(i) {
			return fmt.Errorf("object part %d has %d bytes; manifest %s says %d", i, n, m.LayoutID(), m.PartBytes(i))
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
