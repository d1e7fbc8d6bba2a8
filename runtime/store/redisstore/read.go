package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/kvreshard/kvreshard/runtime/store"
)

// testHookBatchRead, when set, runs after each round trip of ReadRanges.
var testHookBatchRead func()

// item is the share of one range in one batch: commands [first,last) read
// its bytes from offset rel within the range.
type item struct {
	r           int // index of the range
	check       int // index of the state check of its page
	first, last int
	rel         int
	final       bool // the batch reads the range to its end
}

// ReadRanges implements store.Store. A batch holds at most maxBatchCmds
// commands and maxBatchBytes of GETRANGE replies; a longer range is split.
// Each batch checks the state of every page it reads (in the same round
// trip), so only complete objects are read.
func (s *Store) ReadRanges(ctx context.Context, rs []store.Range) (int, error) {
	var (
		calls    []call
		pieceLen []int // per call; 0 for checks
		items    []item
		checks   = map[string]int{}
		states   []*store.Object
		decoded  []bool
		next     int // next range to read
		progress int // bytes of rs[next] already read

		lastKey  string // the part key of the last range read
		lastPart = -1
		partKey  string
	)
	for next < len(rs) {
		if err := ctx.Err(); err != nil {
			return next, err
		}
		calls, pieceLen, items = calls[:0], pieceLen[:0], items[:0]
		clear(checks)
		budget := maxBatchBytes
		for i := next; i < len(rs) && budget > 0 && len(calls) < maxBatchCmds; i++ {
			r := &rs[i]
			ci, ok := checks[r.Key]
			if !ok {
				ci = len(calls)
				checks[r.Key] = ci
				calls = append(calls, stateCall(r.Key))
				pieceLen = append(pieceLen, 0)
			}
			it := item{r: i, check: ci, first: len(calls), rel: progress}
			n := r.Len()
			if r.Off >= 0 && r.Part >= 0 {
				if r.Key != lastKey || r.Part != lastPart {
					_, prefix := pageKeys(r.Key)
					lastKey, lastPart, partKey = r.Key, r.Part, prefix+strconv.Itoa(r.Part)
				}
				for progress < n && budget > 0 && len(calls) < maxBatchCmds {
					l := min(n-progress, budget)
					start := int64(r.Off + progress)
					calls = append(calls, call{cmd: s.c.B().Getrange().Key(partKey).Start(start).End(start + int64(l) - 1).Build()})
					pieceLen = append(pieceLen, l)
					progress += l
					budget -= l
				}
			} else {
				progress = n // nothing to read: the check decides the error
			}
			it.last = len(calls)
			it.final = progress == n
			items = append(items, it)
			if !it.final {
				break
			}
			progress = 0
			if r.Off < 0 || r.Part < 0 {
				break // it fails; read nothing after it
			}
		}

		res := pipeline(ctx, s.c, calls)
		if testHookBatchRead != nil {
			testHookBatchRead()
		}
		states = append(states[:0], make([]*store.Object, len(calls))...)
		decoded = append(decoded[:0], make([]bool, len(calls))...)
		for _, it := range items {
			r := &rs[it.r]
			if !decoded[it.check] {
				o, err := decodeState(res[it.check])
				if err != nil {
					return it.r, s.fail(ctx, "read ranges", err)
				}
				states[it.check], decoded[it.check] = o, true
			}
			o := states[it.check]
			if o == nil || r.Part < 0 || r.Part >= len(o.PartSizes) {
				return it.r, rangeError(r, store.ErrNotFound)
			}
			if r.Manifest != "" && r.Manifest != o.Manifest {
				return it.r, rangeError(r, store.ErrChanged)
			}
			if r.Off < 0 {
				return it.r, rangeError(r, errNegativeOffset)
			}
			size := o.PartSizes[r.Part]
			if r.Off > size || r.Len() > size-r.Off {
				return it.r, rangeError(r, fmt.Errorf("past the end of the part (%d bytes)", size))
			}
			rel := it.rel
			for c := it.first; c < it.last; c++ {
				v, err := res[c].ToString()
				if err != nil {
					return it.r, s.fail(ctx, "read ranges", err)
				}
				if len(v) != pieceLen[c] {
					// The part expired or was evicted after the check.
					return it.r, rangeError(r, store.ErrNotFound)
				}
				scatter(r.Dst, rel, v)
				rel += len(v)
			}
			if it.final {
				next = it.r + 1
			} else {
				progress = rel
			}
		}
	}
	return len(rs), nil
}

var errNegativeOffset = errors.New("negative offset")

func rangeError(r *store.Range, err error) error {
	return &store.RangeError{Key: r.Key, Part: r.Part, Off: r.Off, Len: r.Len(), Err: err}
}

// scatter copies src into the segments of dst, from offset off of their
// concatenation.
func scatter(dst [][]byte, off int, src string) {
	for _, d := range dst {
		if len(src) == 0 {
			return
		}
		if off >= len(d) {
			off -= len(d)
			continue
		}
		n := copy(d[off:], src)
		src = src[n:]
		off = 0
	}
}
