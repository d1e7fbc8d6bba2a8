package reshard

import (
	"fmt"
	"sync"
	"weak"

	"github.com/kvreshard/kvreshard/runtime/partsum"
)

// checkJob is one check of the bytes of a page before any of them is
// copied into the pool (package partsum): the root of a part's trailer
// against the page's key and manifest, the checksum blocks a staged read
// holds against the part's sums, or a whole part lent by a store.Viewer.
type checkJob struct {
	page int
	part int
	kind checkKind
	n    int    // the part's data bytes
	read int    // checkBlocks: the read of the page's plan
	src  []byte // the trailer, the read's staged bytes, or the lent part (data and trailer)
	sums []byte // checkBlocks: the part's sums, from a trailer checked in the same batch
}

type checkKind uint8

const (
	checkRoot checkKind = iota
	checkBlocks
	checkLent
)

// check runs check job j.
func (x *exec) check(j *checkJob) error {
	key, mk := x.keys[j.page], x.tpls[j.page].Manifest.Key()
	switch j.kind {
	case checkRoot:
		return partsum.CheckTrailer(key, mk, j.part, j.n, j.src)
	case checkBlocks:
		t := x.tpls[j.page]
		src := t.Reads[j.read].Src
		for _, c := range t.ReadChecks(j.read) {
			lo := c.First*partsum.Block - src
			hi := min((c.First+c.N)*partsum.Block, j.n) - src
			if err := partsum.CheckBlocks(j.part, j.n, j.sums, c.First, j.src[lo:hi]); err != nil {
				return err
			}
		}
		return nil
	}
	if len(j.src) != partsum.Size(j.n) {
		return fmt.Errorf("part %d: %d bytes lent, not the %d of its data and checksums: %w", j.part, len(j.src), partsum.Size(j.n), partsum.ErrMismatch)
	}
	t := j.src[j.n:]
	if err := partsum.CheckTrailer(key, mk, j.part, j.n, t); err != nil {
		return err
	}
	return partsum.CheckBlocks(j.part, j.n, t[:len(t)-8], 0, j.src[:j.n])
}

// queueCheck queues a check of the batch.
func (x *exec) queueCheck(j checkJob) {
	x.q.checks = append(x.q.checks, j)
}

// runChecks runs the checks of b and drops them. When one fails, it drops
// the copies of its page and of every later page, lowers b.ready to that
// page, and returns its error; pages before it are still read in full.
func (x *exec) runChecks(b *batch) error {
	jobs := b.checks
	if len(jobs) == 0 {
		return nil
	}
	if cap(b.checkErrs) < len(jobs) {
		b.checkErrs = make([]error, len(jobs))
	}
	errs := b.checkErrs[:len(jobs)]
	total := 0
	for _, j := range jobs {
		total += len(j.src)
	}
	x.parallel(len(jobs), total, func(i int) int { return len(jobs[i].src) }, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			errs[i] = x.check(&jobs[i])
		}
	})
	// The first failed check, in page order; the parts counted are those
	// of the pages up to its page, the failed ones those of its page.
	bad := -1
	var err error
	checked, failed := 0, 0
	for i, j := range jobs {
		if bad >= 0 && j.page > bad {
			break
		}
		if j.kind != checkBlocks {
			checked++
		}
		if errs[i] != nil {
			if bad < 0 {
				bad, err = j.page, errs[i]
			}
			failed++
		}
	}
	x.r.checked.Add(int64(checked))
	x.r.badSums.Add(int64(min(failed, 1)))
	for i, j := range jobs {
		if errs[i] == nil && j.kind == checkLent {
			x.r.lent.add(j.src, x.keys[j.page])
		}
	}
	clear(errs)
	clear(b.checks)
	b.checks = b.checks[:0]
	if bad < 0 {
		return nil
	}
	b.dropFrom(bad)
	b.ready = min(b.ready, bad)
	return err
}

// lentChecked remembers the parts lent by a store.Viewer that passed their
// check, by the memory that holds them, their length and the page they
// were checked for: a lent part never changes (store.Viewer), so a reader
// hashes it the first time it sees it, not on every read. The weak
// pointers neither keep a part alive nor match another part allocated
// where a collected one was. It holds at most lentBound parts, and starts
// over when full.
type lentChecked struct {
	mu sync.Mutex
	m  map[lentPart]struct{}
}

type lentPart struct {
	at   weak.Pointer[byte]
	n    int
	page string
}

const lentBound = 1 << 14

func (l *lentChecked) has(b []byte, page string) bool {
	if len(b) == 0 {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.m[lentPart{weak.Make(&b[0]), len(b), page}]
	return ok
}

func (l *lentChecked) add(b []byte, page string) {
	if len(b) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil || len(l.m) >= lentBound {
		l.m = make(map[lentPart]struct{})
	}
	l.m[lentPart{weak.Make(&b[0]), len(b), page}] = struct{}{}
}
