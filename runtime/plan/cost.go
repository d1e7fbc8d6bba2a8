package plan

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"time"
)

// Transport is the cost model of one way of moving bytes from a store into
// a pool: what an operation costs, what each extra scatter segment costs,
// the bandwidth, the scatter-list bounds, and how fast this machine copies
// out of a staging buffer. Estimate turns a plan into a time; Auto keeps
// the plan with the lowest.
type Transport struct {
	Name string
	// OpNS is the time of one transport operation in ns, amortized over a
	// batch: a pipelined command, a system call, an RDMA work request.
	OpNS float64
	// SegmentNS is what each destination segment past the first adds to a
	// scatter read.
	SegmentNS float64
	// Bandwidth is the bytes per second the transport moves.
	Bandwidth float64
	// Segments is the default bound of a scatter list, SegmentLimit the
	// largest the transport takes.
	Segments, SegmentLimit int
	// CopyBandwidth (bytes per second) and CopyRunNS (ns per run) are the
	// speed of the local copies out of a staging buffer. Zero means
	// measured once in this process (LocalCopy).
	CopyBandwidth float64
	CopyRunNS     float64
	// InPlace says the store lends its bytes (store.Viewer) instead of
	// reading them: a staged read moves nothing and costs only OpNS, so a
	// staged plan reads whole parts, whatever their gaps, and its cost is
	// the copy kernel's.
	InPlace bool
}

// The default transports. The store figures were measured on the machine
// this was written on (2 cores, AMD EPYC, shared with other jobs and
// loaded: load average 1 to 15 over the session), with
//
//	go run ./cmd/kvreshard bench --calibrate
//
// which times, best of 7, batches of range reads from a stored part: 4096
// reads of 256 bytes, 256 of 16 KiB, 8 of 2 MiB, and 1024 of 1 KiB in one
// segment and in 4. Bandwidth comes from the 2 MiB reads; the op cost is
// the time of a 16 KiB read beyond its bytes (the size strategies choose
// between: the 70B case's source spans are 10 KiB), or of a 256-byte read
// where that is larger; a segment's cost is what 4 segments add to a read
// of 1 KiB, per extra segment. Three runs at load average about 1 gave the
// ranges quoted below; an idle machine is faster, and the choice of Auto
// depends on the ratios, which move less.

// MemoryTransport is the in-process store (mem://): a range is a map
// lookup and a copy, and a staged read is a map lookup that lends the part
// (InPlace). Measured: op 0 to 41 ns, segment 7 to 15 ns, 9.0 to 12.6
// GB/s. A scatter list is a list of copies, so its bound is ours: 64
// segments by default keep a 70B-size source span in one read.
//
// Its reads are local copies, so its copy speed is configured as its
// bandwidth and segment cost, not measured (LocalCopy): the choice
// between reading runs and copying from lent parts then rests on the op
// counts alone, and a start-up measurement skewed by load (or by the race
// detector) cannot flip it.
func MemoryTransport() Transport {
	return Transport{Name: "memory", OpNS: 25, SegmentNS: 10, Bandwidth: 11e9, Segments: 64, SegmentLimit: 1024, InPlace: true,
		CopyBandwidth: 11e9, CopyRunNS: 10}
}

// FileTransport is the file store (file://): a range is a positioned read
// from the page cache, one system call per segment. Measured: op 810 to
// 1000 ns (256-byte reads; 16 KiB reads cost no more than their bytes),
// segment 680 to 1130 ns, 6.0 to 8.1 GB/s.
func FileTransport() Transport {
	return Transport{Name: "file", OpNS: 900, SegmentNS: 800, Bandwidth: 7e9, Segments: 4, SegmentLimit: 1024}
}

// RedisTransport is a Redis server on loopback (redis://): a range is one
// pipelined GETRANGE whose reply is streamed into its segments (see the
// redisstore package). Measured not with --calibrate, whose 16 KiB reads
// on a fresh server pay its first page faults of reply buffers (op 7 to 15
// µs), but, six runs at load average about 2, with
//
//	go test -run '^$' -bench 'ReadSpans|RangeWriter' ./runtime/store/redisstore/
//
// bandwidth 1.57 to 1.85 GB/s (8 whole parts of 2.5 MiB); op 3.8 to 6.1 µs
// (1024 spans of 10 KiB, the 70B case's source spans, beyond their bytes
// at that bandwidth); segment 10 to 14 ns (the client's cost of each
// segment of a reply past the first). On the 70B case auto then reads the
// 256 spans in 40 segments each (scatter), which took 0.85 to 0.94 of the
// time of staged reads of the two whole parts and 0.79 to 0.89 of staged
// reads of the spans (medians of 50 turns, four runs). As for memory, the
// scatter bound is ours.
func RedisTransport() Transport {
	return Transport{Name: "redis", OpNS: 4700, SegmentNS: 11, Bandwidth: 1.7e9, Segments: 64, SegmentLimit: 1024}
}

// RDMATransport models one-sided RDMA reads for planning only (nothing in
// this repository posts them): a work request with a scatter list of at
// most 30 entries (what NICs allow; Mooncake's transfer engine posts 4 by
// default), 250 ns of CPU and NIC work per request, 10 ns per extra entry,
// and a 200 Gb/s link.
func RDMATransport() Transport {
	return Transport{Name: "rdma", OpNS: 250, SegmentNS: 10, Bandwidth: 200e9 / 8, Segments: 4, SegmentLimit: 30}
}

// StoreTransport returns the default cost model of the store a URL names
// (store.Open's schemes): file for file://, redis for redis:// and
// redis+cluster://, memory for mem:// and anything else.
func StoreTransport(url string) Transport {
	switch {
	case strings.HasPrefix(url, "file:"):
		return FileTransport()
	case strings.HasPrefix(url, "redis:"), strings.HasPrefix(url, "redis+cluster:"):
		return RedisTransport()
	}
	return MemoryTransport()
}

// TransportNamed returns the default transport of a name: memory, file,
// redis or rdma.
func TransportNamed(name string) (Transport, error) {
	switch name {
	case "memory":
		return MemoryTransport(), nil
	case "file":
		return FileTransport(), nil
	case "redis":
		return RedisTransport(), nil
	case "rdma":
		return RDMATransport(), nil
	}
	return Transport{}, fmt.Errorf("unknown transport %q; transports are memory, file, redis, rdma", name)
}

// Validate returns why t is not a usable cost model, or nil.
func (t *Transport) Validate() error {
	switch {
	case !(t.OpNS >= 0) || !(t.SegmentNS >= 0) || !(t.CopyRunNS >= 0):
		return fmt.Errorf("transport %s: costs must be non-negative", t.Name)
	case !(t.Bandwidth > 0) || math.IsInf(t.Bandwidth, 0) || !(t.CopyBandwidth >= 0):
		return fmt.Errorf("transport %s: bandwidth must be positive", t.Name)
	case t.SegmentLimit < 1 || t.Segments < 1 || t.Segments > t.SegmentLimit:
		return fmt.Errorf("transport %s: default segments %d must be within 1 and the limit %d", t.Name, t.Segments, t.SegmentLimit)
	}
	return nil
}

// BreakEvenGap is the unneeded bytes the transport moves in the time of
// one operation: bridging a smaller gap is cheaper than another read. An
// in-place transport moves no bytes, so any gap is worth bridging.
func (t *Transport) BreakEvenGap() int {
	if t.InPlace {
		return math.MaxInt32
	}
	return int(t.OpNS * t.Bandwidth / 1e9)
}

// readNS is the time of n operations moving bytes.
func (t *Transport) readNS(n, bytes int) float64 {
	return float64(n)*t.OpNS + float64(bytes)/t.Bandwidth*1e9
}

// Estimate is the time the plan takes on the transport: its operations and
// bytes (only operations, for a staged plan on an in-place transport); for
// a scatter plan its extra segments; for a staged plan the local copies of
// its runs out of the staging buffer. A run a copy kernel moves costs only
// its bytes: the kernel moves the runs of a strided loop in one call
// (kernel.Copy2D); every other run is a copy() of its own.
func (t *Transport) Estimate(pl *Plan) time.Duration {
	ns := t.readNS(pl.OpCount(), pl.ReadBytes)
	switch pl.Strategy {
	case Scatter:
		ns += float64(len(pl.Ops)-len(pl.Reads)) * t.SegmentNS
	case Staged:
		if t.InPlace {
			ns = float64(pl.OpCount()) * t.OpNS
		}
		bw, run := t.CopyBandwidth, t.CopyRunNS
		if bw == 0 {
			bw, run = LocalCopy()
		}
		runs := 0
		for _, r := range pl.Reads {
			if !r.Kernel {
				runs += r.N
			}
		}
		ns += float64(pl.Bytes)/bw*1e9 + float64(runs)*run
	}
	return time.Duration(math.Ceil(ns))
}

var (
	copyOnce        sync.Once
	copyBW, copyRun float64
)

// LocalCopy returns this machine's local copy speed, measured once per
// process (a few milliseconds, the first time a staged plan is
// estimated): bytes per second of one large copy, and ns per run beyond
// its bytes for copies of 256-byte runs.
func LocalCopy() (bandwidth, runNS float64) {
	copyOnce.Do(func() { copyBW, copyRun = measureCopy(4<<20, 256, 5) })
	return copyBW, copyRun
}

// measureCopy times copies of size bytes: whole, and as runs of run bytes
// taken from every other run of the source; best of reps.
func measureCopy(size, run, reps int) (bandwidth, runNS float64) {
	src, dst := make([]byte, size), make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	whole, runs := time.Duration(math.MaxInt64), time.Duration(math.MaxInt64)
	for range reps {
		start := time.Now()
		copy(dst, src)
		whole = min(whole, time.Since(start))
		start = time.Now()
		for o := 0; o+2*run <= size; o += 2 * run {
			copy(dst[o/2:o/2+run], src[o:o+run])
		}
		runs = min(runs, time.Since(start))
	}
	bandwidth = float64(size) / max(whole.Seconds(), 1e-9)
	n := size / (2 * run)
	runNS = (float64(runs.Nanoseconds()) - float64(size/2)/bandwidth*1e9) / float64(n)
	return bandwidth, max(runNS, 0)
}
