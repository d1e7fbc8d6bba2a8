package redisstore

import (
	"bufio"
	"bytes"
	"io"

	"github.com/redis/rueidis"

	"github.com/kvreshard/kvreshard/runtime/store"
)

// stream is the replies of a batch sent with DoMultiStream: rueidis hands
// each reply's bytes to an io.Writer as they are read from the connection.
// Every reply must be taken (discard) before the connection goes back to
// the client's pool.
type stream struct {
	st  rueidis.MultiRedisResultStream
	buf bytes.Buffer // the reply of a state check
	w   rangeWriter
}

func (s *stream) state() (*store.Object, error) {
	s.buf.Reset()
	_, err := s.st.WriteTo(&s.buf)
	return decodeState(s.buf.String(), err)
}

func (s *stream) read(dst [][]byte, off int) (int, error) {
	s.w.reset(dst, off)
	n, err := s.st.WriteTo(&s.w)
	if rueidis.IsRedisNil(err) {
		return 0, nil
	}
	return int(n), err
}

func (s *stream) discard() {
	for s.st.HasNext() {
		s.st.WriteTo(io.Discard)
	}
}

// rangeWriter writes into the Dst segments of a range, from an offset of
// their concatenation. Bytes past the last segment are dropped (and
// counted by the caller, which checks the length).
type rangeWriter struct {
	dst [][]byte
	seg int // the segment written
	off int // the offset in it
}

func (w *rangeWriter) reset(dst [][]byte, off int) {
	w.dst, w.seg = dst, 0
	for w.seg < len(dst) && off >= len(dst[w.seg]) {
		off -= len(dst[w.seg])
		w.seg++
	}
	w.off = off
}

// space returns the room left in the segment written, past full ones; nil
// when every segment is full.
func (w *rangeWriter) space() []byte {
	for w.seg < len(w.dst) {
		if b := w.dst[w.seg][w.off:]; len(b) > 0 {
			return b
		}
		w.seg, w.off = w.seg+1, 0
	}
	return nil
}

func writeInto[S []byte | string](w *rangeWriter, p S) {
	for len(p) > 0 {
		b := w.space()
		if b == nil {
			return
		}
		n := copy(b, p)
		p, w.off = p[n:], w.off+n
	}
}

func (w *rangeWriter) Write(p []byte) (int, error) {
	writeInto(w, p)
	return len(p), nil
}

// ReadFrom reads r (a reply's bytes, io.Copy's source) straight into the
// segments.
func (w *rangeWriter) ReadFrom(r io.Reader) (int64, error) {
	if lr, ok := r.(*io.LimitedReader); ok {
		if br, ok := lr.R.(*bufio.Reader); ok {
			return w.readBuffered(lr, br)
		}
	}
	var total int64
	for {
		b := w.space()
		if b == nil {
			n, err := io.Copy(io.Discard, r)
			return total + n, err
		}
		n, err := r.Read(b)
		total, w.off = total+int64(n), w.off+n
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// readBuffered is ReadFrom from a connection's buffered reader limited to
// one reply, as rueidis streams one: it copies what the buffer holds into
// as many segments as that fills, without a Read call per segment (a
// scatter read of the 70B case has 40 segments of 256 bytes a reply), and
// reads a segment at least as long as the buffer straight from the
// connection, as bufio.Reader.Read does.
func (w *rangeWriter) readBuffered(lr *io.LimitedReader, br *bufio.Reader) (int64, error) {
	var total int64
	for lr.N > 0 {
		b := w.space()
		if b == nil {
			break
		}
		if br.Buffered() == 0 {
			if len(b) >= br.Size() {
				n, err := lr.Read(b)
				total, w.off = total+int64(n), w.off+n
				if err != nil {
					return total, err
				}
				continue
			}
			if _, err := br.Peek(1); err != nil {
				return total, err
			}
		}
		p, _ := br.Peek(int(min(int64(br.Buffered()), lr.N)))
		n := 0
		for n < len(p) {
			b := w.space()
			if b == nil {
				break
			}
			c := copy(b, p[n:])
			n, w.off = n+c, w.off+c
		}
		br.Discard(n)
		lr.N -= int64(n)
		total += int64(n)
	}
	n, err := io.Copy(io.Discard, lr) // past the segments
	return total + n, err
}
