package redisstore

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"regexp"
	"strconv"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/redistest"
	"github.com/kvreshard/kvreshard/runtime/store"
)

// TestRangeWriter writes replies into random scatter lists from random
// offsets, through Write and through ReadFrom from a plain reader and from
// a buffered reader limited to the reply (rueidis's, whose fast path
// copies from the buffer and reads long segments straight from the
// connection): the segments hold the reply's bytes at the offset, the
// bytes past the last segment are counted and dropped, and what follows
// the reply is left.
func TestRangeWriter(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 500 {
		var segs [][]byte
		total := 0
		for range r.IntN(6) {
			n := []int{0, 1, 7, 64, 300}[r.IntN(5)]
			segs = append(segs, make([]byte, n))
			total += n
		}
		off := r.IntN(total + 2)
		reply := pattern(byte(i), r.IntN(total+8))
		want := make([]byte, total)
		if off < total {
			copy(want[off:], reply)
		}
		for _, how := range []string{"write", "plain", "one byte", "buffered"} {
			for _, s := range segs {
				clear(s)
			}
			var w rangeWriter
			w.reset(segs, off)
			var n int64
			var err error
			switch how {
			case "write":
				var m int
				m, err = w.Write(reply)
				n = int64(m)
			case "plain":
				n, err = w.ReadFrom(bytes.NewReader(reply))
			case "one byte":
				n, err = w.ReadFrom(iotest.OneByteReader(bytes.NewReader(reply)))
			case "buffered":
				// A 16-byte buffer, behind a header that leaves part of
				// the reply in it, and before the next reply.
				wire := append(append([]byte("$hdr"), reply...), "\r\n$next"...)
				br := bufio.NewReaderSize(iotest.HalfReader(bytes.NewReader(wire)), 16)
				_, err = br.Discard(4)
				require.NoError(t, err)
				n, err = w.ReadFrom(&io.LimitedReader{R: br, N: int64(len(reply))})
				rest, _ := io.ReadAll(br)
				require.Equal(t, "\r\n$next", string(rest), "what follows the reply")
			}
			require.NoError(t, err, how)
			require.Equal(t, int64(len(reply)), n, how)
			require.True(t, bytes.Equal(want, bytes.Join(segs, nil)), "%s: case %d, segments %d, offset %d, reply %d", how, i, len(segs), off, len(reply))
		}
	}
}

// TestFailedReadsReturnConnections reads batches that fail at a range in
// their middle (another manifest), with GETRANGEs after it whose replies
// are left: each read takes the rest of its replies and gives its
// connection back, so that the next read uses it (the server accepts no
// connection per read), and good reads after them read the right bytes.
func TestFailedReadsReturnConnections(t *testing.T) {
	srv := redistest.StartServer(t)
	s := openSingle(t, srv)
	ctx := context.Background()
	data := pattern(4, 64<<10)
	require.Equal(t, []error{nil}, s.WriteParts(ctx, []store.PartWrite{{Key: "page", Part: 0, Parts: 1, Manifest: "m", Data: [][]byte{data}}}))
	// Connections the server accepted, this one (srv.Do dials) excluded.
	accepted := func() int {
		v, err := srv.Do("INFO", "stats")
		require.NoError(t, err)
		m := regexp.MustCompile(`total_connections_received:(\d+)`).FindStringSubmatch(v.(string))
		require.NotNil(t, m)
		n, _ := strconv.Atoi(m[1])
		return n - 1
	}
	rs := make([]store.Range, 64)
	for i := range rs {
		rs[i] = store.Range{Key: "page", Part: 0, Off: i << 10, Dst: [][]byte{make([]byte, 1<<10)}, Manifest: "m"}
	}
	_, err := s.ReadRanges(ctx, rs)
	require.NoError(t, err)
	before := accepted()
	for k := range 50 {
		bad := k % len(rs)
		rs[bad].Manifest = "other"
		n, err := s.ReadRanges(ctx, rs)
		require.Equal(t, bad, n)
		require.EqualError(t, err, fmt.Sprintf("read page part 0 [%d,%d): object changed since it was queried", bad<<10, bad<<10+1<<10))
		rs[bad].Manifest = "m"
		for i := range rs {
			clear(rs[i].Dst[0])
		}
		n, err = s.ReadRanges(ctx, rs)
		require.NoError(t, err)
		require.Equal(t, len(rs), n)
		for i, r := range rs {
			require.Equal(t, data[i<<10:(i+1)<<10], r.Dst[0], "range %d", i)
		}
	}
	require.Equal(t, before+1, accepted()) // the INFO of before
}
