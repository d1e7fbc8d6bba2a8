package redisstore

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/kvreshard/kvreshard/runtime/store"
)

// tripLimits bound one round trip (batch) of ReadRanges: its commands,
// the bytes of its replies, and the bytes of its replies shorter than
// largeReply.
//
// The server builds the replies of a round trip before the client has
// read them. Replies of a few KiB each make a list of reply buffers of 16
// to 20 KiB on redis-server 7.0, whose memory its allocator gives back and
// faults in again: in BenchmarkReadSpans, 10 MiB of replies of 10 KiB in
// one round trip cost the server 900-1,700 page faults a call and took
// 1.0-1.7 times (mostly 1.4) as long as in round trips of 2 MiB, which
// fault next to never. A long reply (a GETRANGE of a whole part, as a
// staged read does) is one buffer and does not fault: 20 MiB of parts
// took 0.7-0.85 times as long in one round trip as in round trips of 2
// MiB. Every store has defaultTrip; tests change one store's.
type tripLimits struct {
	cmds, bytes, small int
}

var defaultTrip = tripLimits{cmds: maxBatchCmds, bytes: 16 << 20, small: 2 << 20}

// largeReply is the length from which a reply does not count as small.
const largeReply = 64 << 10

// item is the share of one range in one batch: calls [first,last) read its
// bytes from offset rel within the range; check is the call that checks
// its page's state.
type item struct {
	r           int // index of the range
	n           int // its length
	check       int
	first, last int
	rel         int
	final       bool // the batch reads the range to its end
}

// batch is one round trip of ReadRanges: state checks and GETRANGEs, in
// the order the replies are taken. Each item's check precedes its
// GETRANGEs: it is the call just before them, or an earlier item's.
type batch struct {
	calls  []call
	want   []int // reply length of each GETRANGE (0 for checks)
	items  []item
	checks map[string]int  // call of each page's check
	states []*store.Object // by call, of the checks taken
}

// build fills b with the ranges from rs[next], of which progress bytes
// are read.
func (b *batch) build(s *Store, rs []store.Range, next, progress int) {
	b.calls, b.want, b.items = b.calls[:0], b.want[:0], b.items[:0]
	if b.checks == nil {
		b.checks = map[string]int{}
	}
	clear(b.checks)
	var (
		lastKey  string
		lastPart = -1
		partKey  string
	)
	left, small := s.trip.bytes, s.trip.small
	for i := next; i < len(rs) && left > 0 && small > 0 && len(b.calls) < s.trip.cmds; i++ {
		r := &rs[i]
		ci, ok := b.checks[r.Key]
		if !ok {
			ci = len(b.calls)
			b.checks[r.Key] = ci
			b.calls = append(b.calls, stateCall(r.Key))
			b.want = append(b.want, 0)
		}
		n := r.Len()
		it := item{r: i, n: n, check: ci, first: len(b.calls), rel: progress}
		if r.Off >= 0 && r.Part >= 0 {
			if r.Key != lastKey || r.Part != lastPart {
				_, prefix := pageKeys(r.Key)
				lastKey, lastPart, partKey = r.Key, r.Part, prefix+strconv.Itoa(r.Part)
			}
			for progress < n && left > 0 && small > 0 && len(b.calls) < s.trip.cmds {
				l := min(n-progress, left)
				if l < largeReply {
					l = min(l, small)
					small -= l
				}
				start := int64(r.Off + progress)
				b.calls = append(b.calls, call{cmd: s.getrange(partKey, start, start+int64(l)-1)})
				b.want = append(b.want, l)
				progress += l
				left -= l
			}
		} else {
			progress = n // nothing to read: the check decides the error
		}
		it.last = len(b.calls)
		it.final = progress == n
		b.items = append(b.items, it)
		if !it.final {
			break
		}
		progress = 0
		if r.Off < 0 || r.Part < 0 {
			break // it fails; read nothing after it
		}
	}
}

// getrange returns GETRANGE key start end. On one server it is built
// without the key's hash slot, which only a cluster needs: hashing a page
// key (CRC16) took a third of the time of building a batch.
func (s *Store) getrange(key string, start, end int64) rueidis.Completed {
	if s.stream {
		return s.c.B().Arbitrary("GETRANGE").Args(key, strconv.FormatInt(start, 10), strconv.FormatInt(end, 10)).Build()
	}
	return s.c.B().Getrange().Key(key).Start(start).End(end).Build()
}

// replies are the replies of a batch, taken in order.
type replies interface {
	// state takes the next reply, of a state check.
	state() (*store.Object, error)
	// read takes the next reply, of a GETRANGE, into dst from offset off
	// of the segments' concatenation, and returns its length. Bytes past
	// the segments are counted but not written.
	read(dst [][]byte, off int) (int, error)
	// discard drops the replies not taken.
	discard()
}

// replyError is an error of a reply (the transport, or the server), as
// opposed to a *store.RangeError of a range.
type replyError struct{ err error }

func (e *replyError) Error() string { return e.err.Error() }

// deliver takes the replies of b and delivers the bytes of its items. It
// advances next and progress past what it delivered in full.
func (b *batch) deliver(rs []store.Range, rep replies, next, progress *int) error {
	b.states = append(b.states[:0], make([]*store.Object, len(b.calls))...)
	taken := 0 // replies taken
	for _, it := range b.items {
		r := &rs[it.r]
		if it.check == taken { // the item's page is new in the batch
			o, err := rep.state()
			taken++
			if err != nil {
				return &replyError{err}
			}
			b.states[it.check] = o
		}
		o := b.states[it.check]
		if o != nil && o.Err != nil {
			return rangeError(r, o.Err)
		}
		if o == nil || r.Part < 0 || r.Part >= len(o.PartSizes) {
			return rangeError(r, store.ErrNotFound)
		}
		if r.Manifest != "" && r.Manifest != o.Manifest {
			return rangeError(r, store.ErrChanged)
		}
		if err := r.CheckBounds(it.n, o.PartSizes[r.Part]); err != nil {
			return err
		}
		rel := it.rel
		for c := it.first; c < it.last; c++ {
			n, err := rep.read(r.Dst, rel)
			taken++
			if err != nil {
				return &replyError{err}
			}
			if n != b.want[c] {
				// The part expired or was evicted after the check.
				return rangeError(r, store.ErrNotFound)
			}
			rel += n
		}
		if it.final {
			*next, *progress = it.r+1, 0
		} else {
			*progress = rel
		}
	}
	return nil
}

// ReadRanges implements store.Store. A round trip (batch) reads at most
// what s.trip allows; a longer range is split. Each batch checks the
// state of every page it reads (in the same round trip, before its
// GETRANGEs), so only complete objects are read.
//
// On one server the replies are streamed: each GETRANGE's bytes go from
// the connection's buffer (or the socket, for long ones) straight into the
// range's Dst segments, without a reply value in between. A batch that
// fails on the connection is sent again (twice at most, 20 ms apart, as
// the client retries other reads), from the first range not yet read. On
// a cluster the batch is one pipeline per node (rueidis.Client.DoMulti),
// whose replies are copied.
func (s *Store) ReadRanges(ctx context.Context, rs []store.Range) (int, error) {
	var (
		b        batch
		next     int   // next range to read
		progress int   // bytes of rs[next] already read
		tried    tries // of the batch
	)
	for next < len(rs) {
		if err := ctx.Err(); err != nil {
			return next, err
		}
		b.build(s, rs, next, progress)
		var err error
		if s.stream {
			err = s.streamBatch(ctx, rs, &b, tried.script > 0, &next, &progress)
		} else {
			res := results{res: pipeline(ctx, s.c, b.calls)}
			err = b.deliver(rs, &res, &next, &progress)
		}
		if s.onBatchRead != nil {
			s.onBatchRead()
		}
		var re *replyError
		switch {
		case err == nil:
			tried = tries{}
			continue
		case !errors.As(err, &re):
			return next, err
		case s.stream && s.retry(ctx, re.err, &tried):
			continue
		}
		return next, s.fail(ctx, "read ranges", re.err)
	}
	return len(rs), nil
}

// streamBatch sends b on a connection of its own and delivers the replies
// as they arrive. With eval, its state checks are sent with EVAL.
func (s *Store) streamBatch(ctx context.Context, rs []store.Range, b *batch, eval bool, next, progress *int) error {
	cmds := make(rueidis.Commands, len(b.calls))
	for i := range b.calls {
		cmds[i] = b.calls[i].build(s.c.B(), eval)
	}
	st := stream{st: s.c.DoMultiStream(ctx, cmds...)}
	defer st.discard()
	return b.deliver(rs, &st, next, progress)
}

// tries counts the times a batch was sent again.
type tries struct{ conn, script int }

// retry reports whether a batch that failed with err (a reply's error) is
// worth sending again: when the server did not know the state script (its
// script cache was flushed, or it restarted), with EVAL (see streamBatch);
// when the connection failed, after 20 ms. Each is tried twice at most;
// other errors of the server are final.
func (s *Store) retry(ctx context.Context, err error, t *tries) bool {
	if e, ok := rueidis.IsRedisErr(err); ok {
		if !e.IsNoScript() || t.script == 2 {
			return false
		}
		t.script++
		return true
	}
	if t.conn == 2 {
		return false
	}
	t.conn++
	select {
	case <-ctx.Done():
		return false
	case <-time.After(20 * time.Millisecond):
		return true
	}
}

func rangeError(r *store.Range, err error) error {
	return &store.RangeError{Key: r.Key, Part: r.Part, Off: r.Off, Len: r.Len(), Err: err}
}

// results are the replies of a pipeline (DoMulti).
type results struct {
	res []rueidis.RedisResult
	i   int
	w   rangeWriter
}

func (r *results) state() (*store.Object, error) {
	r.i++
	return decodeState(r.res[r.i-1].ToString())
}

func (r *results) read(dst [][]byte, off int) (int, error) {
	r.i++
	v, err := r.res[r.i-1].ToString()
	if err != nil {
		return 0, err
	}
	r.w.reset(dst, off)
	writeInto(&r.w, v)
	return len(v), nil
}

func (r *results) discard() {}
