package reshard

import (
	"cmp"
	"context"
	"fmt"
	"sync"

	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/store"
)

// exec issues the ranges of a request's plans in page order, in batches:
// direct and scatter ranges read straight into the pool; the reads of a
// staged round take room in the staging buffer, and when a round does not
// fit, the batch so far is read and its rounds are copied out first. A
// store that lends its parts (store.Viewer) has no staged reads: the copies
// run from its bytes. The copies wait in a queue until the batch is read
// or a read fails, and then run together, on up to CopyWorkers goroutines,
// after the checks of the bytes read or lent (check.go), which run the
// same way: a checked plan (plan.Planner.Checked) also reads the trailer
// of each part, into sums, in the batch of the page's first round. A page counts once every range of it is read, every check of it
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
	sums   []byte   // the trailers of the parts of checked plans, page after page
	sumAt  []int    // where each page's trailers start in sums
	sumBuf []byte   // the buffer of sums, to give back

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
	copies    []copyJob  // in page order
	copyBytes int        // their source bytes
	checks    []checkJob // to run before the copies, in page order
	checkErrs []error    // the result of each check
	ready     int
}

// copyJob is the copy of staged read k of page, whose bytes are src.
type copyJob struct {
	page, k int
	src     []byte
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

func (r *Reader) newExec(ctx context.Context, tpls []*plan.Plan, keys []string, slots []int, regions [][]byte) *exec {
	nr, ns, nsum := 0, 0, 0
	for _, t := range tpls {
		nr += t.OpCount()
		if t.Strategy == plan.Staged {
			ns += len(t.Reads) + len(t.Trailers)
		} else {
			ns += len(t.Ops)
		}
		for _, tr := range t.Trailers {
			nsum += tr.Len
		}
	}
	b := r.bufs.Get().(*execBufs)
	if cap(b.ranges) < nr {
		b.ranges = make([]store.Range, 0, nr)
	}
	if cap(b.segs) < ns {
		b.segs = make([][]byte, 0, ns)
	}
	x := &exec{r: r, ctx: ctx, tpls: tpls, keys: keys, slots: slots, regions: regions,
		bufs: b, ranges: b.ranges[:0], segs: b.segs[:0], q: b.q, fly: b.fly, delta: make([]int, len(regions))}
	if nsum > 0 {
		sums, err := r.buffers.get(nsum)
		if err != nil {
			x.err = err
			return x
		}
		x.sums, x.sumAt = sums[:nsum], make([]int, len(tpls))
		x.sumBuf = sums
		at := 0
		for i, t := range tpls {
			x.sumAt[i] = at
			for _, tr := range t.Trailers {
				at += tr.Len
			}
		}
	}
	return x
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
			need, half := x.stageNeed()
			stage, err := x.r.buffers.get(need)
			if err != nil {
				x.err = err
				return false
			}
			x.stage = &stage
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
			if a == 0 && t.Checked {
				x.addTrailers(i, key, mk)
			}
			at := base
			for k := a; k < b; k++ {
				rd := &t.Reads[k]
				s := stageAt(at)
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

// addTrailers adds the ranges of the trailers of checked page i, read into
// sums.
func (x *exec) addTrailers(i int, key, mk string) {
	sums := x.sums[x.sumAt[i]:]
	for _, tr := range x.tpls[i].Trailers {
		x.segs = append(x.segs, sums[tr.Stage:tr.Stage+tr.Len])
		n := len(x.segs)
		x.ranges = append(x.ranges, store.Range{Key: key, Part: int(tr.Part), Off: tr.Src, Dst: x.segs[n-1 : n : n], Manifest: mk})
	}
}

// queueRoots queues the checks of the roots of the trailers of checked
// page i.
func (x *exec) queueRoots(i int) {
	sums := x.sums[x.sumAt[i]:]
	for _, tr := range x.tpls[i].Trailers {
		x.queueCheck(checkJob{page: i, part: int(tr.Part), kind: checkRoot, n: tr.Src, src: sums[tr.Stage : tr.Stage+tr.Len]})
	}
}

// queueBlocks queues the check of the checksum blocks that staged read k
// of checked page i holds, in staged, against the sums of its part: one
// job a read, however many runs of blocks it checks.
func (x *exec) queueBlocks(i, k int, staged []byte) {
	t := x.tpls[i]
	rd := &t.Reads[k]
	tr := &t.Trailers[t.Trailer(rd.Part)]
	sums := x.sums[x.sumAt[i]+tr.Stage:][:tr.Len-8]
	x.queueCheck(checkJob{page: i, part: int(rd.Part), kind: checkBlocks, n: tr.Src, read: k, src: staged, sums: sums})
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
	// A part's reads are neighbours: it is lent, and checked, once a page.
	viewed := -1
	var b []byte
	for k := range t.Reads {
		rd := &t.Reads[k]
		var err error
		if int(rd.Part) != viewed {
			b, err = v.ViewPart(x.ctx, key, int(rd.Part), mk)
			if err == nil && t.Checked && !x.r.lent.has(b, key) {
				// A lent part is a whole part, data and trailer: check it
				// whole, and not again once it passed.
				x.queueCheck(checkJob{page: i, part: int(rd.Part), kind: checkLent, n: t.Manifest.PartBytes(int(rd.Part)), src: b})
			}
			viewed = int(rd.Part)
		}
		if err == nil && rd.Src+rd.Len > len(b) {
			err = &store.RangeError{Key: key, Part: int(rd.Part), Off: rd.Src, Len: rd.Len,
				Err: fmt.Errorf("past the end of the part (%d bytes)", len(b))}
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
	if f := x.r.tune.onCopyWorkers; f != nil && len(jobs) > 0 {
		f(w)
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
		if f := x.r.tune.onLaunch; f != nil {
			f()
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

// parallel runs run over jobs [0,n), whose sizes sum to total bytes, split
// in order into shares of about equal bytes, one a worker, on up to
// CopyWorkers goroutines, with at least tuning.minCopyShare bytes a share. It
// returns the goroutines it used, the calling one included.
func (x *exec) parallel(n, total int, size func(i int) int, run func(lo, hi int)) int {
	w := min(x.r.opts.CopyWorkers, n, max(1, total/max(x.r.tune.minCopyShare, 1)))
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

// stageNeed is the staging buffer the request needs: every staging round
// of its pages, up to the planner's bound (each round of a plan fits the
// bound), or its largest round when that is larger (a round of reads of
// about the bound placed at multiples of 64, stageAt). When batches can be
// pipelined (two
// copy workers or more, two rounds or more, two of the largest within the
// bound, more than one half), half is the size of each half of it: the
// largest round, or more up to tuning.pipeBatch and half the bound.
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
	if x.r.tune.pipeline && x.r.opts.CopyWorkers > 1 && rounds > 1 && 2*round <= bound {
		batch := x.r.tune.pipeBatch
		if batch == 0 {
			batch = cmp.Or(x.r.planner.Options().Transport.Batch, defaultPipeBatch)
		}
		if half = (max(round, min(bound/2, batch)) + 63) &^ 63; need > half {
			return 2 * half, half
		}
	}
	return max(min(need, bound), round), 0
}

// stageAt returns where in the staging buffer a staged read goes when the
// reads of its round before it end at at: the next multiple of 64. A
// round's reads are placed one after the other, in order, from a multiple
// of 64.
func stageAt(at int) int { return (at + 63) &^ 63 }

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
// from the start of the round, placed by stageAt.
func roundFoot(t *plan.Plan, a, b int) int {
	at := 0
	for k := a; k < b; k++ {
		at = stageAt(at) + t.Reads[k].Len
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
		if t.Checked && u.reads[0] == 0 {
			// The page's trailers were read with its first round.
			x.queueRoots(u.page)
		}
		at := u.base
		for k := u.reads[0]; k < u.reads[1]; k++ {
			s := stageAt(at)
			at = s + t.Reads[k].Len
			staged := (*x.stage)[s:at]
			if t.Checked {
				x.queueBlocks(u.page, k, staged)
			}
			x.queue(u.page, k, staged)
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

// release returns the staging and trailer buffers (to the store, when the
// read failed and they are the store's) and the range, segment and copy
// buffers, which drop their references to the pool first (run clears the
// copies), once no batch is in flight (the last flush settled it).
func (x *exec) release() {
	_ = x.settle()
	failed := x.err != nil
	if x.stage != nil {
		x.r.buffers.put(*x.stage, failed)
		x.stage = nil
	}
	x.r.buffers.put(x.sumBuf, failed)
	x.sumBuf = nil
	clear(x.ranges)
	clear(x.segs)
	x.q.dropFrom(0)
	x.bufs.ranges, x.bufs.segs, x.bufs.q, x.bufs.fly = x.ranges[:0], x.segs[:0], x.q, x.fly
	x.r.bufs.Put(x.bufs)
	x.bufs = nil
}
