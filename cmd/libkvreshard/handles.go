package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/cgo"
	"sync"
	"sync/atomic"

	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/reshard"
	"github.com/kvreshard/kvreshard/runtime/store"
)

// A handle is a runtime/cgo.Handle of a *storeHandle, *writerHandle or
// *readerHandle: C holds it as the value of a kvr_store, kvr_writer or
// kvr_reader pointer (kvreshard.c converts), which is never dereferenced.
// cgo handles are never 0 and never reused, so a closed handle cannot
// name a newer object: its Value panics, which lookup turns into
// KVR_ECLOSED.

// storeHandle is an open store. Writers and readers opened on it count as
// its users: closing the handle closes the store once the last user closes.
type storeHandle struct {
	url string
	st  store.Store

	mu     sync.Mutex
	closed bool // the handle is closed
	users  int  // open writers and readers
}

// use registers a writer or reader of the store.
func (s *storeHandle) use(h uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errorf(kvrEClosed, "store handle %d is closed", h)
	}
	s.users++
	return nil
}

// release unregisters a writer or reader, closing the store when it was
// the last user of a closed handle.
func (s *storeHandle) release() error {
	s.mu.Lock()
	s.users--
	last := s.closed && s.users == 0
	s.mu.Unlock()
	if last {
		return s.closeStore()
	}
	return nil
}

func (s *storeHandle) closeStore() error {
	if err := s.st.Close(); err != nil {
		return errorf(kvrEStore, "close store %s: %v", s.url, err)
	}
	return nil
}

// poolUser is what writers and readers share: the caller's pool and the
// lock that makes close wait for the calls in progress.
type poolUser struct {
	store *storeHandle

	mu      sync.RWMutex // read-held by each call, held by close
	closed  bool
	regions [][]byte // the caller's pool memory, valid until close
}

// enter starts a call on the handle: the caller must call leave when it
// returns nil.
func (p *poolUser) enter(h uint64, kind string) error {
	p.mu.RLock()
	if p.closed {
		p.mu.RUnlock()
		return errorf(kvrEClosed, "%s handle %d is closed", kind, h)
	}
	return nil
}

// leave ends a call that enter started.
func (p *poolUser) leave() { p.mu.RUnlock() }

// caller is a handle that calls enter and leave: *writerHandle or
// *readerHandle.
type caller interface {
	enter(h uint64, kind string) error
	leave()
	// keyDomain is the model domain of the store keys of its pages.
	keyDomain() string
}

// enterHandle returns the object of handle h, a T called kind, with a
// call started on it: the caller must call leave when it returns nil.
func enterHandle[T caller](h uint64, kind string) (T, error) {
	obj, err := lookup[T](h, kind)
	if err == nil {
		err = obj.enter(h, kind)
	}
	return obj, err
}

// close marks the handle closed once the calls in progress return,
// forgets the pool, and releases the store.
func (p *poolUser) close(h uint64, kind string) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return errorf(kvrEClosed, "%s handle %d is closed", kind, h)
	}
	p.closed = true
	regs := p.regions
	p.regions = nil
	p.mu.Unlock()
	cgo.Handle(h).Delete()
	if r, ok := p.store.st.(store.Registrar); ok {
		for _, reg := range regs {
			r.Unregister(reg)
		}
	}
	return p.store.release()
}

// writerHandle is an open writer.
type writerHandle struct {
	poolUser
	w   *reshard.Writer
	man *manifest.Manifest

	pubMu     sync.Mutex
	published atomic.Bool
}

func (wh *writerHandle) keyDomain() string { return wh.man.Domain }

// readerHandle is an open reader.
type readerHandle struct {
	poolUser
	domain string

	// What kvr_reader_set_options builds a new reader from.
	st    store.Store
	desc  *manifest.Descriptor
	bind  plan.Binding
	popts plan.Options

	// r and opts change only with mu held, in setOptions; base holds the
	// counters of the readers it replaced.
	r    *reshard.Reader
	opts reshard.ReaderOptions // CopyWorkers resolved (never 0)
	base reshard.Stats
}

func (rh *readerHandle) keyDomain() string { return rh.domain }

func kindName(v any) string {
	switch v.(type) {
	case *storeHandle:
		return "store"
	case *writerHandle:
		return "writer"
	case *readerHandle:
		return "reader"
	}
	return fmt.Sprintf("%T", v)
}

// lookup returns the object of handle h, which must be a T called kind.
func lookup[T any](h uint64, kind string) (obj T, err error) {
	if h == 0 {
		return obj, invalidf("%s is NULL", kind)
	}
	v, ok := value(h)
	if !ok {
		return obj, errorf(kvrEClosed, "%s handle %d is closed or was never opened", kind, h)
	}
	if obj, ok = v.(T); !ok {
		return obj, invalidf("handle %d is a %s, not a %s", h, kindName(v), kind)
	}
	return obj, nil
}

// value returns the value of cgo handle h, and false when it is not one
// (Value panics on a deleted or unknown handle).
func value(h uint64) (v any, ok bool) {
	defer func() {
		if recover() != nil {
			v, ok = nil, false
		}
	}()
	return cgo.Handle(h).Value(), true
}

// openStore opens the store a URL names.
func openStore(url string) (uint64, error) {
	st, err := store.Open(context.Background(), url)
	if err != nil {
		var ue *store.URLError
		if errors.As(err, &ue) {
			return 0, invalidf("%v", err)
		}
		return 0, errorf(kvrEStore, "open store %s: %v", url, err)
	}
	return uint64(cgo.NewHandle(&storeHandle{url: url, st: st})), nil
}

// closeStore closes a store handle, and the store unless writers or
// readers still use it.
func closeStore(h uint64) error {
	s, err := lookup[*storeHandle](h, "store")
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errorf(kvrEClosed, "store handle %d is closed", h)
	}
	s.closed = true
	last := s.users == 0
	s.mu.Unlock()
	cgo.Handle(h).Delete()
	if last {
		return s.closeStore()
	}
	return nil
}

// rankSpec is what a writer or reader opens from: the store, the model,
// and the rank's topology and binding to its pool.
type rankSpec struct {
	store *storeHandle
	model manifest.Model
	t     placement.Topology
	r     placement.Rank
	b     plan.Binding
}

// buildRank builds the rankSpec of rank pa of model ma with pool a on store
// handle sh.
func buildRank(sh uint64, ma modelArgs, pa placementArgs, a *poolArgs) (*rankSpec, error) {
	s, err := lookup[*storeHandle](sh, "store")
	if err != nil {
		return nil, err
	}
	rs := &rankSpec{store: s}
	if rs.model, err = buildModel(ma); err != nil {
		return nil, err
	}
	d := &rs.model.Descriptor
	if rs.t, rs.r, err = buildPlacement(d, pa); err != nil {
		return nil, err
	}
	if rs.b, err = binding(d, rs.t, rs.r, a); err != nil {
		return nil, err
	}
	return rs, nil
}

// attach gives p the regions of pool a, of geometry g, and registers it
// as a user of store handle sh (s).
func (p *poolUser) attach(s *storeHandle, sh uint64, g *plan.Geometry, a *poolArgs) error {
	regs, err := regions(g, a)
	if err != nil {
		return err
	}
	if err := s.use(sh); err != nil {
		return err
	}
	// A store whose transfers want registered memory (an object engine)
	// registers the pool's regions, for as long as the handle is open.
	if r, ok := s.st.(store.Registrar); ok {
		for i, reg := range regs {
			if err := r.Register(reg); err != nil {
				for _, done := range regs[:i] {
					r.Unregister(done)
				}
				s.release()
				return errorf(kvrEStore, "pool region %d: %v", i, err)
			}
		}
	}
	p.store, p.regions = s, regs
	return nil
}

// openWriter opens the writer of rank pa of model ma from pool a, storing
// pages in part layout part ("" for the pool's default).
func openWriter(sh uint64, ma modelArgs, pa placementArgs, a *poolArgs, part string) (uint64, error) {
	rs, err := buildRank(sh, ma, pa, a)
	if err != nil {
		return 0, err
	}
	d := &rs.model.Descriptor
	pl, err := partLayout(part, rs.b.Layout)
	if err != nil {
		return 0, err
	}
	m, err := plan.ManifestFor(rs.model.Domain(), d, rs.t, pl)
	if err != nil {
		return 0, invalidf("writer: %v", err)
	}
	idx, writes, err := rs.t.Writer(d, rs.r)
	if err != nil {
		return 0, invalidf("placement: %v", err)
	}
	w, err := reshard.NewWriter(rs.store.st, m, idx, writes, rs.b)
	if err != nil {
		return 0, invalidf("writer: %v", err)
	}
	wh := &writerHandle{w: w, man: m}
	if err := wh.attach(rs.store, sh, w.Geometry(), a); err != nil {
		return 0, err
	}
	return uint64(cgo.NewHandle(wh)), nil
}

// publish stores the writer's manifest and checks that it reads back
// unchanged (reshard.Publish, with its failures told apart: the store's
// are KVR_ESTORE, a manifest stored with other bytes KVR_EMANIFEST).
func (wh *writerHandle) publish(ctx context.Context) error {
	wh.pubMu.Lock()
	defer wh.pubMu.Unlock()
	st, m := wh.store.st, wh.man
	enc := m.Encode()
	if err := st.PutMeta(ctx, m.Key(), enc); err != nil {
		if errors.Is(err, store.ErrMetaConflict) {
			return errorf(kvrEManifest, "publish manifest %s: %v", m.Key(), err)
		}
		return errorf(kvrEStore, "publish manifest %s: %v", m.Key(), err)
	}
	back, err := st.GetMeta(ctx, m.Key())
	if err != nil {
		return errorf(kvrEStore, "read back manifest %s: %v", m.Key(), err)
	}
	if !bytes.Equal(back, enc) {
		return errorf(kvrEManifest, "manifest %s reads back as other bytes", m.Key())
	}
	wh.published.Store(true)
	return nil
}

// write writes the pages keys from slots, one status each into statuses.
// The error is for the batch; the message names the first page refused
// or failed.
func (wh *writerHandle) write(keys []string, slots []int, statuses []uint8) (string, error) {
	ctx := context.Background()
	if len(keys) == 0 {
		return "", nil
	}
	if msg, bad := badSlot(slots, wh.w.Geometry()); bad {
		return "", invalidf("%s", msg)
	}
	if !wh.published.Load() {
		if err := wh.publish(ctx); err != nil {
			return "", err
		}
	}
	// The arguments are checked: what fails now is the batch query.
	res, err := wh.w.Write(ctx, keys, slots, wh.regions)
	if err != nil {
		for i := range statuses {
			statuses[i] = kvrFailed
		}
		return "", errorf(kvrEStore, "%v", err)
	}
	msg := ""
	for i, pr := range res {
		statuses[i] = statusCode(pr.Status)
		if msg == "" && (pr.Status == reshard.Refused || pr.Status == reshard.Failed) {
			msg = fmt.Sprintf("%s %s: %v", describe(i, pr.Key), pr.Status, pr.Err)
		}
	}
	return msg, nil
}

// badSlot returns the message of the first slot outside the pool.
func badSlot(slots []int, g *plan.Geometry) (string, bool) {
	for i, s := range slots {
		if s < 0 || s >= g.Slots {
			return fmt.Sprintf("slot %d of page %d is outside the pool's %d slots", s, i, g.Slots), true
		}
	}
	return "", false
}

// openReader opens the reader of rank pa of model ma into pool a.
func openReader(sh uint64, ma modelArgs, pa placementArgs, a *poolArgs) (uint64, error) {
	rs, err := buildRank(sh, ma, pa, a)
	if err != nil {
		return 0, err
	}
	s := rs.store
	tr := plan.StoreTransport(s.url)
	rh := &readerHandle{domain: rs.model.Domain(), st: s.st, desc: &rs.model.Descriptor, bind: rs.b,
		popts: plan.Options{Strategy: plan.Auto, Transport: &tr}}
	if rh.r, rh.opts, err = rh.newReader(readerOptions{}); err != nil {
		return 0, err
	}
	if err := rh.attach(s, sh, rh.r.Geometry(), a); err != nil {
		return 0, err
	}
	return uint64(cgo.NewHandle(rh)), nil
}

// maxCopyWorkers bounds kvr_reader_set_options' copy_workers.
const maxCopyWorkers = 1024

// readerOptions are those of a kvr_reader_options.
type readerOptions struct {
	copyWorkers, maxPages, maxBytes int64
	checkParts                      bool
}

// newReader returns a reader of rh's model and pool with options o (0:
// GOMAXPROCS copy workers; no page or byte budget), and its options, copy
// workers resolved.
func (rh *readerHandle) newReader(o readerOptions) (*reshard.Reader, reshard.ReaderOptions, error) {
	switch {
	case o.copyWorkers < 0 || o.copyWorkers > maxCopyWorkers:
		return nil, reshard.ReaderOptions{}, invalidf("copy_workers is %d; want 0 (GOMAXPROCS) to %d", o.copyWorkers, maxCopyWorkers)
	case o.maxPages < 0:
		return nil, reshard.ReaderOptions{}, invalidf("max_pages is %d; want 0 (no limit) or more", o.maxPages)
	case o.maxBytes < 0:
		return nil, reshard.ReaderOptions{}, invalidf("max_bytes is %d; want 0 (no limit) or more", o.maxBytes)
	}
	if o.copyWorkers == 0 {
		o.copyWorkers = int64(runtime.GOMAXPROCS(0))
	}
	opts := reshard.ReaderOptions{Plan: rh.popts, CopyWorkers: int(o.copyWorkers), MaxPages: int(o.maxPages), MaxBytes: int(o.maxBytes),
		CheckParts: o.checkParts}
	rd, err := reshard.NewReader(rh.st, rh.domain, rh.desc, rh.bind, opts)
	if err != nil {
		return nil, opts, invalidf("reader: %v", err)
	}
	return rd, opts, nil
}

// setOptions replaces the reader by one with these options (newReader's),
// once the calls in progress return. Its counters go on; its caches of
// manifests and plans start empty.
func (rh *readerHandle) setOptions(h uint64, o readerOptions) error {
	rd, opts, err := rh.newReader(o)
	if err != nil {
		return err
	}
	rh.mu.Lock()
	defer rh.mu.Unlock()
	if rh.closed {
		return errorf(kvrEClosed, "reader handle %d is closed", h)
	}
	rh.base = addStats(rh.base, rh.r.Stats())
	rh.r, rh.opts = rd, opts
	return nil
}

// stats returns the reader's counters since its open.
func (rh *readerHandle) stats() reshard.Stats {
	rh.mu.RLock()
	defer rh.mu.RUnlock()
	return addStats(rh.base, rh.r.Stats())
}

func addStats(a, b reshard.Stats) reshard.Stats {
	return reshard.Stats{
		Requests: a.Requests + b.Requests, Pages: a.Pages + b.Pages, Hits: a.Hits + b.Hits, Misses: a.Misses + b.Misses,
		Bytes: a.Bytes + b.Bytes, Ops: a.Ops + b.Ops, ManifestsRejected: a.ManifestsRejected + b.ManifestsRejected,
		Fallbacks: a.Fallbacks + b.Fallbacks, PartsChecked: a.PartsChecked + b.PartsChecked,
		ChecksumErrors: a.ChecksumErrors + b.ChecksumErrors,
	}
}

// exists returns how many leading pages of keys the reader would read,
// and why the run ends when it is not a plain miss: a rejected manifest is
// a message with KVR_OK (a miss to the cache, as in a read), anything else
// (a failed query, an unreadable object) KVR_ESTORE.
func (rh *readerHandle) exists(keys []string) (int, string, error) {
	if len(keys) == 0 {
		return 0, "", nil
	}
	n, err := rh.r.Exists(context.Background(), keys)
	switch reshard.Classify(err) {
	case reshard.StopNone:
		return n, "", nil
	case reshard.StopRejected:
		return n, err.Error(), nil
	}
	return n, "", errorf(kvrEStore, "%v", err)
}

// read reads the leading complete pages of keys into slots: on a
// goroutine of its own when offload says so, else on the caller's.
func (rh *readerHandle) read(keys []string, slots []int) (reshard.Result, error) {
	var (
		res reshard.Result
		err error
	)
	if rh.offload(len(keys)) {
		res, err = onGoroutine(func() (reshard.Result, error) {
			return rh.r.Read(context.Background(), keys, slots, rh.regions)
		})
	} else {
		res, err = rh.r.Read(context.Background(), keys, slots, rh.regions)
	}
	if err != nil {
		return res, invalidf("%v", err)
	}
	return res, nil
}

// offload reports whether a read of n pages runs on a goroutine of the
// library rather than on the calling one: when its copies may run on more
// than one goroutine. A Go function called from C runs on a goroutine
// locked to the C thread. The reader starts and joins its copy workers
// once per group of copies (11 times in a read of the 64 pages of python
// -m kvreshard.bench), and each time the locked goroutine waits for them,
// its thread gives the Go runtime's P away and must be woken to take it
// back: two thread wakeups a join, about 10 µs on an idle machine and up
// to a millisecond on a loaded one (BenchmarkForkJoin). On a goroutine
// of the library the read pays those two wakeups once. Reads that cannot start a worker stay on the
// calling goroutine: an empty call, one copy worker, or fewer bytes than
// two workers' shares (reshard gives each at least 512 KiB).
func (rh *readerHandle) offload(n int) bool {
	return n > 0 && rh.opts.CopyWorkers > 1 && n*rh.r.Geometry().PageBytes >= offloadBytes
}

// offloadBytes is the least read that offload runs on a goroutine of the
// library: two copy workers' shares.
const offloadBytes = 2 * 512 << 10

// onGoroutine runs f on a new goroutine and returns its results once it
// returns; a panic in f is raised again on the caller's goroutine (where
// the export turns it into KVR_EINTERNAL).
func onGoroutine(f func() (reshard.Result, error)) (reshard.Result, error) {
	var (
		res   reshard.Result
		err   error
		fault any
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() { fault = recover() }()
		res, err = f()
	}()
	<-done
	if fault != nil {
		panic(fault)
	}
	return res, err
}
