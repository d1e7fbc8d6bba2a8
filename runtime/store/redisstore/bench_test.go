package redisstore

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/redistest"
	"github.com/kvreshard/kvreshard/runtime/store"
	"github.com/kvreshard/kvreshard/testkit/storetest"
)

// BenchmarkReadRanges runs the suite's benchmark (storetest.BenchReadRanges),
// then reads 1000 ranges of 256 bytes: pipelined GETRANGE
// through ReadRanges, against one GET of the whole part that holds them
// and local copies. "dense" ranges tile a 256000-byte part; "sparse" ones
// take every fourth 256-byte block of a part four times as long, so GET
// moves four times the bytes.
func BenchmarkReadRanges(b *testing.B) {
	srv := redistest.StartServer(b)
	c, err := ParseURL(srv.URL())
	require.NoError(b, err)
	s, err := New(context.Background(), c)
	require.NoError(b, err)
	defer s.Close()
	ctx := context.Background()
	b.Run("suite", func(b *testing.B) { storetest.BenchReadRanges(b, s) })
	const nr, size = 1000, 256
	for _, bc := range []struct {
		name   string
		stride int
	}{{"dense", size}, {"sparse", 4 * size}} {
		key := "bench_" + bc.name
		part := pattern(3, nr*bc.stride)
		require.Equal(b, []error{nil}, s.WriteParts(ctx, []store.PartWrite{{Key: key, Part: 0, Parts: 1, Manifest: "m", Data: [][]byte{part}}}))
		dst := make([]byte, nr*size)
		rs := make([]store.Range, nr)
		for i := range rs {
			rs[i] = store.Range{Key: key, Part: 0, Off: i * bc.stride, Dst: [][]byte{dst[i*size : (i+1)*size]}}
		}
		b.Run(bc.name+"/getrange", func(b *testing.B) {
			b.SetBytes(nr * size)
			for b.Loop() {
				n, err := s.ReadRanges(ctx, rs)
				if err != nil || n != nr {
					b.Fatal(n, err)
				}
			}
		})
		b.Run(bc.name+"/get-whole-part", func(b *testing.B) {
			_, prefix := pageKeys(key)
			b.SetBytes(nr * size)
			for b.Loop() {
				v, err := s.c.Do(ctx, s.c.B().Get().Key(prefix+"0").Build()).ToString()
				if err != nil || len(v) != len(part) {
					b.Fatal(len(v), err)
				}
				for i := range rs {
					copy(rs[i].Dst[0], v[rs[i].Off:])
				}
			}
		})
	}
}

// BenchmarkReadSpans reads what the 70B case's resharding reader reads of
// four pages: 1024 spans of 10 KiB, 128 from each of 8 parts of 2.5 MiB,
// 20 KiB apart, in one ReadRanges call: into one segment a span, in round
// trips of 2 MiB of such small replies (the default) and in one round
// trip, and into 40 segments
// of 256 bytes a span, 512 bytes apart, as a scatter read into a
// page_first pool does. Then the 8 whole parts that hold them (twice the
// bytes, as a staged read of whole parts), and the spans' bytes as
// pipelined GET of four values of 2.5 MiB, streamed into a buffer. It
// reports the server's page faults per call (faults/op, Linux only).
//
// The Redis cost model (plan.RedisTransport) comes from it: the bandwidth
// from parts (20 MiB over its time), the op cost from
// getrange/small=2048KiB/segments=1 beyond its 10 MiB at that bandwidth,
// divided by 1024, the segment cost from segments=40 beyond segments=1,
// divided by 1024 x 39.
func BenchmarkReadSpans(b *testing.B) {
	srv := redistest.StartServer(b)
	c, err := ParseURL(srv.URL())
	require.NoError(b, err)
	s, err := New(context.Background(), c)
	require.NoError(b, err)
	defer s.Close()
	ctx := context.Background()
	const pages, part, spans, span, stride = 4, 2621440, 1024, 10 << 10, 20 << 10
	data := pattern(5, part)
	pool := make([]byte, 2*spans*span) // as large as the 8 parts
	keys := make([]string, pages)
	for p := range keys {
		keys[p] = fmt.Sprintf("spans_%d", p)
		ws := make([]store.PartWrite, 8)
		for i := range ws {
			ws[i] = store.PartWrite{Key: keys[p], Part: i, Parts: 8, Manifest: "m", Data: [][]byte{data}}
		}
		require.Equal(b, make([]error, 8), s.WriteParts(ctx, ws))
		require.NoError(b, s.c.Do(ctx, s.c.B().Set().Key(keys[p]).Value(rueidis.BinaryString(data)).Build()).Error())
	}
	ranges := func(segs int) []store.Range {
		rs := make([]store.Range, spans)
		for i := range rs {
			rs[i] = store.Range{Key: keys[i/256], Part: i % 256 / 128, Off: i % 128 * stride}
			for k := range segs {
				at := (i*segs + k) * 2 * span / segs // every other piece of the pool
				rs[i].Dst = append(rs[i].Dst, pool[at:at+span/segs])
			}
		}
		return rs
	}
	faults := func() int {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", srv.PID()))
		if err != nil {
			return 0 // not Linux
		}
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
		n, _ := strconv.Atoi(f[7]) // minflt
		return n
	}
	run := func(b *testing.B, read func() error) {
		b.SetBytes(spans * span)
		if err := read(); err != nil {
			b.Fatal(err)
		}
		f0 := faults()
		for b.Loop() {
			if err := read(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(faults()-f0)/float64(b.N), "faults/op")
	}
	for _, c := range []struct {
		trip, segs int
	}{{defaultTrip.small, 1}, {defaultTrip.small, 40}, {spans * span, 1}} {
		rs := ranges(c.segs)
		b.Run(fmt.Sprintf("getrange/small=%dKiB/segments=%d", c.trip>>10, c.segs), func(b *testing.B) {
			s.trip.small = c.trip
			defer func() { s.trip = defaultTrip }()
			run(b, func() error {
				n, err := s.ReadRanges(ctx, rs)
				if err == nil && n != len(rs) {
					err = fmt.Errorf("read %d of %d ranges", n, len(rs))
				}
				return err
			})
		})
	}
	parts := make([]store.Range, 2*pages)
	for i := range parts {
		parts[i] = store.Range{Key: keys[i/2], Part: i % 2, Dst: [][]byte{pool[i*part : (i+1)*part]}}
	}
	b.Run("parts", func(b *testing.B) {
		run(b, func() error {
			n, err := s.ReadRanges(ctx, parts)
			if err == nil && n != len(parts) {
				err = fmt.Errorf("read %d of %d ranges", n, len(parts))
			}
			return err
		})
		b.SetBytes(2 * spans * span)
	})
	b.Run("get", func(b *testing.B) {
		run(b, func() error {
			cmds := make(rueidis.Commands, pages)
			for p, k := range keys {
				cmds[p] = s.c.B().Get().Key(k).Build()
			}
			st := stream{st: s.c.DoMultiStream(ctx, cmds...)}
			defer st.discard()
			for p := range pages {
				if n, err := st.read([][]byte{pool[p*part : (p+1)*part]}, 0); err != nil || n != part {
					return fmt.Errorf("GET: %d bytes, %v", n, err)
				}
			}
			return nil
		})
	})
}

// BenchmarkRangeWriter delivers 128 replies of 10 KiB from a connection's
// buffered reader (here in memory: no server, only the client's work)
// into one segment a reply and into 40 segments of 256 bytes, 512 bytes
// apart, as a scatter read into a page_first pool does. The difference
// over the 128 x 39 extra segments is the client's cost of a segment, the
// SegmentNS of plan.RedisTransport.
func BenchmarkRangeWriter(b *testing.B) {
	const replies, span = 128, 10 << 10
	wire := pattern(6, replies*span)
	pool := make([]byte, 2*replies*span)
	for _, segs := range []int{1, 40} {
		dsts := make([][][]byte, replies)
		for i := range dsts {
			for k := range segs {
				at := (i*segs + k) * 2 * span / segs
				dsts[i] = append(dsts[i], pool[at:at+span/segs])
			}
		}
		b.Run(fmt.Sprintf("segments=%d", segs), func(b *testing.B) {
			b.SetBytes(replies * span)
			r := bytes.NewReader(wire)
			br := bufio.NewReaderSize(r, 512<<10) // rueidis's default
			var w rangeWriter
			for b.Loop() {
				r.Reset(wire)
				br.Reset(r)
				for _, d := range dsts {
					w.reset(d, 0)
					if n, err := w.ReadFrom(&io.LimitedReader{R: br, N: span}); n != span || err != nil {
						b.Fatal(n, err)
					}
				}
			}
		})
	}
}
