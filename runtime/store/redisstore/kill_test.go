package redisstore

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/redistest"
	"github.com/kvreshard/kvreshard/runtime/store"
)

func openSingle(t *testing.T, srv *redistest.Server) *Store {
	t.Helper()
	c, err := ParseURL(srv.URL())
	require.NoError(t, err)
	s, err := New(context.Background(), c)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// pattern returns n bytes that depend on seed.
func pattern(seed byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) ^ seed
	}
	return b
}

// TestKillDuringReadRanges kills the server after the first round trip of a
// ReadRanges call of four: the call reports the ranges of that round trip
// and the error. The server restarts empty (it keeps no RDB); the store
// reconnects, and the page is written and read again.
func TestKillDuringReadRanges(t *testing.T) {
	srv := redistest.StartServer(t)
	s := openSingle(t, srv)
	ctx := context.Background()
	const part = 1 << 20
	data := [][]byte{pattern(1, part), pattern(2, part)}
	write := func() {
		t.Helper()
		require.Equal(t, []error{nil, nil}, s.WriteParts(ctx, []store.PartWrite{
			{Key: "page", Part: 0, Parts: 2, Manifest: "m", Data: data[:1]},
			{Key: "page", Part: 1, Parts: 2, Manifest: "m", Data: data[1:]},
		}))
	}
	write()

	// 32 ranges of 1 MiB: perTrip per round trip.
	perTrip := s.trip.bytes / part
	rs := make([]store.Range, 32)
	for i := range rs {
		rs[i] = store.Range{Key: "page", Part: i % 2, Dst: [][]byte{make([]byte, part)}}
	}
	batches := 0
	s.onBatchRead = func() {
		if batches++; batches == 1 {
			srv.Kill()
		}
	}
	n, err := s.ReadRanges(ctx, rs)
	require.Error(t, err)
	require.Equal(t, perTrip, n, "error %v", err)
	// After the kill a command may see the old connection closed (EOF,
	// broken pipe, reset) or the new one refused.
	addr := regexp.QuoteMeta(srv.Addr())
	gone := "(EOF|write tcp 127\\.0\\.0\\.1:[0-9]+->" + addr + ": write: broken pipe|read tcp 127\\.0\\.0\\.1:[0-9]+->" + addr +
		": read: connection reset by peer|dial tcp " + addr + ": connect: connection refused)$"
	require.Regexp(t, "^"+regexp.QuoteMeta(fmt.Sprintf("redis store %s: read ranges: ", srv.Addr()))+gone, err.Error())
	for i := range n {
		require.True(t, bytes.Equal(data[i%2], rs[i].Dst[0]), "range %d", i)
	}
	require.Equal(t, make([]byte, part), rs[perTrip].Dst[0])

	// Killed: every call fails.
	_, err = s.Query(ctx, []string{"page"})
	require.Regexp(t, "^"+regexp.QuoteMeta(fmt.Sprintf("redis store %s: query page: ", srv.Addr()))+gone, err.Error())
	err = s.WriteParts(ctx, []store.PartWrite{{Key: "page", Part: 0, Parts: 2, Manifest: "m", Data: data[:1]}})[0]
	require.Regexp(t, "^"+regexp.QuoteMeta(fmt.Sprintf("redis store %s: write page part 0: ", srv.Addr()))+gone, err.Error())

	s.onBatchRead = nil
	srv.Restart()
	n, err = s.ReadRanges(ctx, rs[:2])
	require.Equal(t, 0, n)
	require.EqualError(t, err, "read page part 0 [0,1048576): not found")
	// ReadRanges streams on connections of its own, so the client's
	// pipelined connections (two, each command on one at random) may
	// still be the ones the kill closed. A write that meets such a
	// connection is sent again (writeScript is idempotent): the first
	// write after the restart succeeds.
	write()
	for i := range rs {
		clear(rs[i].Dst[0])
	}
	n, err = s.ReadRanges(ctx, rs)
	require.NoError(t, err)
	require.Equal(t, len(rs), n)
	for i := range rs {
		require.True(t, bytes.Equal(data[i%2], rs[i].Dst[0]), "range %d", i)
	}
}

// TestSplitRange reads ranges longer than a round trip's budget, across
// scatter segments.
func TestSplitRange(t *testing.T) {
	srv := redistest.StartServer(t)
	s := openSingle(t, srv)
	ctx := context.Background()
	s.trip.bytes = 1 << 20
	size := 3*s.trip.bytes + 12345
	data := pattern(9, size)
	require.Equal(t, []error{nil}, s.WriteParts(ctx, []store.PartWrite{
		{Key: "big", Part: 0, Parts: 1, Manifest: "m", Data: [][]byte{data[:5], data[5 : size/2], data[size/2:]}}}))
	segs := [][]byte{make([]byte, 1), make([]byte, s.trip.bytes-1), make([]byte, 0), make([]byte, s.trip.bytes+1), make([]byte, size-10-2*s.trip.bytes-1)}
	small := make([]byte, 10)
	rounds := 0
	s.onBatchRead = func() { rounds++ }
	n, err := s.ReadRanges(ctx, []store.Range{{Key: "big", Part: 0, Off: 10, Dst: segs}, {Key: "big", Part: 0, Off: size - 10, Dst: [][]byte{small}}})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, 4, rounds)
	require.True(t, bytes.Equal(data[10:], bytes.Join(segs, nil)))
	require.Equal(t, data[size-10:], small)
}

// TestKillWhileReading kills the server at a moment that is not chosen,
// while readers run: every call returns n < len(rs) with an error, or all of
// them without, and nothing panics.
func TestKillWhileReading(t *testing.T) {
	srv := redistest.StartServer(t)
	s := openSingle(t, srv)
	ctx := context.Background()
	data := pattern(5, 1<<20)
	require.Equal(t, []error{nil}, s.WriteParts(ctx, []store.PartWrite{{Key: "page", Part: 0, Parts: 1, Manifest: "m", Data: [][]byte{data}}}))
	var wg sync.WaitGroup
	failed := make([]bool, 4)
	for g := range failed {
		wg.Go(func() {
			rs := make([]store.Range, 64)
			for i := range rs {
				rs[i] = store.Range{Key: "page", Part: 0, Off: i * 4096, Dst: [][]byte{make([]byte, 64<<10)}}
			}
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
				n, err := s.ReadRanges(ctx, rs)
				if err != nil {
					if n >= len(rs) {
						t.Errorf("n = %d with error %v", n, err)
					}
					failed[g] = true
					return
				}
				if n != len(rs) {
					t.Errorf("n = %d without error", n)
					return
				}
			}
		})
	}
	time.Sleep(50 * time.Millisecond)
	srv.Kill()
	wg.Wait()
	require.Equal(t, []bool{true, true, true, true}, failed)
}

// TestTripLimits counts the round trips of reads of many small ranges,
// long ranges, a range longer than a round trip and ranges of one byte,
// under smaller limits: replies shorter than largeReply fill the small
// budget, long ones the byte budget, and state checks count as commands.
func TestTripLimits(t *testing.T) {
	srv := redistest.StartServer(t)
	s := openSingle(t, srv)
	ctx := context.Background()
	s.trip = tripLimits{cmds: 1024, bytes: 1 << 20, small: 64 << 10}
	data := pattern(8, 3<<20)
	require.Equal(t, []error{nil}, s.WriteParts(ctx, []store.PartWrite{{Key: "page", Part: 0, Parts: 1, Manifest: "m", Data: [][]byte{data}}}))
	trips := 0
	s.onBatchRead = func() { trips++ }
	for _, c := range []struct {
		name       string
		n, size    int
		stride     int
		wantTrips  int
		wantRanges int
	}{
		{"small", 64, 8 << 10, 8 << 10, 8, 64},                        // 8 of 8 KiB fill 64 KiB
		{"long", 4, 512 << 10, 512 << 10, 2, 4},                       // 2 of 512 KiB fill 1 MiB
		{"longer than a trip", 1, 2560 << 10, 0, 3, 1},                // 1 MiB, 1 MiB, 512 KiB
		{"one byte", 2048, 1, 1, 3, 2048},                             // 1023 and a check a trip
		{"split at the end of a trip", 2, 1000 << 10, 64 << 10, 2, 2}, // 24 KiB of the second in the first trip
	} {
		t.Run(c.name, func(t *testing.T) {
			rs := make([]store.Range, c.n)
			for i := range rs {
				rs[i] = store.Range{Key: "page", Off: i * c.stride, Dst: [][]byte{make([]byte, c.size)}}
			}
			trips = 0
			n, err := s.ReadRanges(ctx, rs)
			require.NoError(t, err)
			require.Equal(t, c.wantRanges, n)
			require.Equal(t, c.wantTrips, trips)
			for i, r := range rs {
				require.True(t, bytes.Equal(data[r.Off:r.Off+c.size], r.Dst[0]), "range %d", i)
			}
		})
	}
}

// TestWriteAfterRestart restarts the server (empty) between writes, five
// times: the first write after each restart meets the connections the
// restart closed, is sent again, and succeeds; the page reads back.
// Before writes were sent again, 8 of 10 such writes failed with EOF.
func TestWriteAfterRestart(t *testing.T) {
	srv := redistest.StartServer(t)
	s := openSingle(t, srv)
	ctx := context.Background()
	for i := range 5 {
		data := [][]byte{pattern(byte(2*i), 1000), pattern(byte(2*i+1), 1000)}
		require.Equal(t, []error{nil, nil}, s.WriteParts(ctx, []store.PartWrite{
			{Key: "page", Part: 0, Parts: 2, Manifest: "m", Data: data[:1]},
			{Key: "page", Part: 1, Parts: 2, Manifest: "m", Data: data[1:]},
		}), "write %d", i)
		rs := []store.Range{{Key: "page", Part: 0, Dst: [][]byte{make([]byte, 1000)}}, {Key: "page", Part: 1, Dst: [][]byte{make([]byte, 1000)}}}
		n, err := s.ReadRanges(ctx, rs)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		require.Equal(t, data[0], rs[0].Dst[0])
		require.Equal(t, data[1], rs[1].Dst[0])
		srv.Kill()
		srv.Restart()
	}
}

// TestPutMetaAfterRestart: the first PutMeta after a restart (the
// writer's first call: it stores the manifest before any part) meets a
// closed connection too, is sent again, and succeeds; so does GetMeta.
// Before PutMeta was sent again, it failed with EOF.
func TestPutMetaAfterRestart(t *testing.T) {
	srv := redistest.StartServer(t)
	s := openSingle(t, srv)
	ctx := context.Background()
	for i := range 5 {
		key := fmt.Sprintf("kv/d/manifests/m%d", i)
		require.NoError(t, s.PutMeta(ctx, key, []byte("{}")), "put %d", i)
		got, err := s.GetMeta(ctx, key)
		require.NoError(t, err)
		require.Equal(t, []byte("{}"), got)
		srv.Kill()
		srv.Restart()
		_, err = s.GetMeta(ctx, key)
		require.Equal(t, store.ErrNotFound, err, "get %d after the restart", i)
	}
}
