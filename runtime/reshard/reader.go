package reshard

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

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
}

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
}

// Reader reads pages into one rank's pool.
type Reader struct {
	st      store.Store
	domain  string
	planner *plan.Planner
	opts    ReaderOptions

	mu        sync.Mutex
	manifests map[string]*list.Element
	order     *list.List

	requests, pages, hits, misses, bytes, ops, rejected atomic.Int64
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
	return &Reader{st: st, domain: domain, planner: p, opts: opts, manifests: map[string]*list.Element{}, order: list.New()}, nil
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
	// miss, a rejected manifest, the budget, cancellation or a failed read.
	// It is nil when every page was read.
	Stop error
}

// Errors that say why a read stopped early.
var (
	ErrMiss   = errors.New("page missing or incomplete")
	ErrBudget = errors.New("prefetch budget reached")
)

// Read reads the pages keys[i] into slot slots[i] of the pool regions. It
// reads the leading run of complete pages and reports how many it read in
// full. An error is returned only for bad arguments; everything that makes
// a page a miss is in Result.Stop.
func (r *Reader) Read(ctx context.Context, keys []string, slots []int, regions [][]byte) (Result, error) {
	var res Result
	if len(slots) != len(keys) {
		return res, fmt.Errorf("%d keys but %d slots", len(keys), len(slots))
	}
	g := r.planner.Geometry()
	if len(regions) != len(g.Regions) {
		return res, fmt.Errorf("%d pool regions given; the binding has %d", len(regions), len(g.Regions))
	}
	for i, reg := range regions {
		if len(reg) < g.Regions[i] {
			return res, fmt.Errorf("pool region %s has %d bytes; the binding needs %d", g.RegionNames[i], len(reg), g.Regions[i])
		}
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
	objs, err := r.st.Query(ctx, keys[:n])
	if err != nil {
		res.Stop = fmt.Errorf("query: %w", err)
		return res, nil
	}
	// The leading run of complete pages whose manifests validate.
	tpls := make([]*plan.Plan, 0, n)
	for i, o := range objs {
		if !o.Complete {
			n, res.Stop = i, fmt.Errorf("%w: %s", ErrMiss, keys[i])
			break
		}
		m, err := r.manifest(ctx, o.Manifest)
		if err == nil {
			err = checkObject(m, o)
		}
		var tpl *plan.Plan
		if err == nil {
			tpl, err = r.planner.Template(m)
		}
		if err != nil {
			n, res.Stop = i, fmt.Errorf("page %s: %w", keys[i], err)
			break
		}
		tpls = append(tpls, tpl)
	}
	if n == 0 {
		return res, nil
	}
	// One batch of ranges for every page, in page order.
	total := 0
	for _, t := range tpls {
		total += len(t.Ops)
	}
	ranges := make([]store.Range, 0, total)
	segs := make([][]byte, total)
	ends := make([]int, n) // ranges of page i end at ends[i]
	var ops []plan.Op
	for i, t := range tpls {
		ops = r.planner.Instantiate(t, slots[i], ops[:0])
		for _, op := range ops {
			k := len(ranges)
			segs[k] = regions[op.Region][op.Dst : op.Dst+op.Len]
			ranges = append(ranges, store.Range{Key: keys[i], Part: int(op.Part), Off: op.Src, Dst: segs[k : k+1 : k+1]})
		}
		ends[i] = len(ranges)
	}
	done, err := r.st.ReadRanges(ctx, ranges)
	for i := 0; i < n && ends[i] <= done; i++ {
		res.Hit++
		res.Bytes += tpls[i].Bytes
		res.Ops += len(tpls[i].Ops)
	}
	if done < len(ranges) {
		if err == nil {
			err = fmt.Errorf("store read %d of %d ranges", done, len(ranges))
		}
		res.Stop = fmt.Errorf("page %s: %w", keys[res.Hit], err)
	}
	return res, nil
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

// ErrManifest marks a manifest that is missing, corrupt, or of another
// model domain.
var ErrManifest = errors.New("manifest rejected")

// manifest returns the validated manifest stored under key, from the cache
// when it has it.
func (r *Reader) manifest(ctx context.Context, key string) (*manifest.Manifest, error) {
	r.mu.Lock()
	if e, ok := r.manifests[key]; ok {
		r.order.MoveToFront(e)
		m := e.Value.(*manifest.Manifest)
		r.mu.Unlock()
		return m, nil
	}
	r.mu.Unlock()
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
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.manifests[key]; !ok {
		r.manifests[key] = r.order.PushFront(m)
		for r.order.Len() > r.opts.Manifests {
			e := r.order.Back()
			r.order.Remove(e)
			delete(r.manifests, e.Value.(*manifest.Manifest).Key())
		}
	}
	return m, nil
}
