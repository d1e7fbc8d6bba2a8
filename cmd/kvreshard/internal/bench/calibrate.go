package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/store"
	"github.com/kvreshard/kvreshard/runtime/store/filestore"
	"github.com/kvreshard/kvreshard/runtime/store/memstore"
)

// Calibration is a store's measured cost model: what a range read costs
// beyond its bytes, what each segment past the first adds, and the
// bandwidth of large reads, with the timings they come from. OpNS comes
// from reads of 16 KiB, the size of the reads that strategies choose
// between (the 70B case's source spans are 10 KiB); SmallOpNS from reads
// of 256 bytes, for comparison: on Redis, a larger reply costs more than
// its bytes at the large-read bandwidth.
//
// CopyBandwidth and CopyRunNS are this machine's speed of the local
// copies out of a staging buffer (measureCopy), the same for every store.
type Calibration struct {
	Name                                  string
	OpNS, SmallOpNS, SegmentNS, Bandwidth float64
	CopyBandwidth, CopyRunNS              float64

	Small, Medium, Big, Plain, Scatter time.Duration
}

// The reads Calibrate times, from one part of calPart bytes.
const (
	calPart    = 16 << 20
	calSmall   = 4096 // reads of 256 bytes, 2 KiB apart
	calMed     = 256  // reads of calMedSize, twice that apart
	calMedSize = 16 << 10
	calBig     = 8    // reads of 2 MiB
	calScat    = 1024 // reads of 1 KiB, 4 KiB apart: one segment, then 4 of 256
)

func (c Calibration) String() string {
	return fmt.Sprintf("op %.0f ns (%.0f ns at 256 bytes), segment %.0f ns, %.2f GB/s; copies %.2f GB/s, %.1f ns a run (%d reads of 256 bytes in %s, %d of 16 KiB in %s, %d of 2 MiB in %s, %d of 1 KiB in %s, in 4 segments in %s)",
		c.OpNS, c.SmallOpNS, c.SegmentNS, c.Bandwidth/1e9, c.CopyBandwidth/1e9, c.CopyRunNS, calSmall, c.Small, calMed, c.Medium, calBig, c.Big, calScat, c.Plain, c.Scatter)
}

// Transport returns the cost model the calibration measures: the default
// transport of its store, with the measured figures. The op cost is the
// larger of OpNS and SmallOpNS, as for the defaults. The memory store's
// reads are local copies, so its copy speed is its bandwidth and segment
// cost, as MemoryTransport's is; the other stores copy out of a staging
// buffer at the machine's measured copy speed.
func (c Calibration) Transport() (plan.Transport, error) {
	t, err := plan.TransportNamed(c.Name)
	if err != nil {
		return t, err
	}
	t.OpNS, t.SegmentNS, t.Bandwidth = math.Round(max(c.OpNS, c.SmallOpNS)), math.Round(c.SegmentNS), round(c.Bandwidth)
	t.CopyBandwidth, t.CopyRunNS = round(c.CopyBandwidth), math.Round(c.CopyRunNS*10)/10
	if t.InPlace {
		t.CopyBandwidth, t.CopyRunNS = t.Bandwidth, t.SegmentNS
	}
	return t, t.Validate()
}

// Calibrate measures the store named memory, file (in a temporary
// directory) or redis (on a server that start starts; nil: StartRedis),
// best of 7 runs of each batch of reads.
func Calibrate(ctx context.Context, name string, start func() (string, func(), error)) (Calibration, error) {
	var st store.Store
	switch name {
	case "memory":
		st = memstore.New()
	case "file":
		dir, err := os.MkdirTemp("", "kvreshard-calibrate-")
		if err != nil {
			return Calibration{}, err
		}
		defer os.RemoveAll(dir)
		if st, err = filestore.Open(dir, filestore.Options{}); err != nil {
			return Calibration{}, err
		}
	case "redis":
		if start == nil {
			start = StartRedis
		}
		u, stop, err := start()
		if err != nil {
			return Calibration{}, fmt.Errorf("no Redis server: %w", err)
		}
		defer stop()
		if st, err = store.Open(ctx, u); err != nil {
			return Calibration{}, err
		}
	default:
		return Calibration{}, fmt.Errorf("unknown store %q; stores are memory, file, redis", name)
	}
	defer st.Close()
	part := make([]byte, calPart)
	for i := range part {
		part[i] = byte(i*31 + i>>9)
	}
	const key = "calibrate"
	if errs := st.WriteParts(ctx, []store.PartWrite{{Key: key, Part: 0, Parts: 1, Manifest: "calibrate-manifest", Data: [][]byte{part}}}); errs[0] != nil {
		return Calibration{}, errs[0]
	}
	dst := make([]byte, calPart)
	batch := func(n, stride, size, segs int) []store.Range {
		rs := make([]store.Range, n)
		for i := range rs {
			d := dst[i*size : (i+1)*size]
			seg := size / segs
			for s := range segs {
				rs[i].Dst = append(rs[i].Dst, d[s*seg:(s+1)*seg])
			}
			rs[i].Key, rs[i].Off = key, i*stride
		}
		return rs
	}
	time := func(rs []store.Range) (time.Duration, error) {
		return best(7, 1, func() error {
			n, err := st.ReadRanges(ctx, rs)
			if err == nil && n != len(rs) {
				err = fmt.Errorf("read %d of %d ranges", n, len(rs))
			}
			return err
		})
	}
	c := Calibration{Name: name}
	c.CopyBandwidth, c.CopyRunNS = measureCopy(4<<20, 256, 7)
	var err error
	if c.Big, err = time(batch(calBig, 2<<20, 2<<20, 1)); err != nil {
		return c, err
	}
	if c.Small, err = time(batch(calSmall, 2048, 256, 1)); err != nil {
		return c, err
	}
	if c.Medium, err = time(batch(calMed, 2*calMedSize, calMedSize, 1)); err != nil {
		return c, err
	}
	if c.Plain, err = time(batch(calScat, 4096, 1024, 1)); err != nil {
		return c, err
	}
	if c.Scatter, err = time(batch(calScat, 4096, 1024, 4)); err != nil {
		return c, err
	}
	c.Bandwidth = float64(calBig*(2<<20)) / c.Big.Seconds()
	c.SmallOpNS = max(0, (float64(c.Small.Nanoseconds())-float64(calSmall*256)/c.Bandwidth*1e9)/calSmall)
	c.OpNS = max(0, (float64(c.Medium.Nanoseconds())-float64(calMed*calMedSize)/c.Bandwidth*1e9)/calMed)
	c.SegmentNS = max(0, float64(c.Scatter.Nanoseconds()-c.Plain.Nanoseconds())/(3*calScat))
	return c, nil
}

// measureCopy times local copies of size bytes in turns, best of reps:
// one copy() of them all, and copies of run bytes taken from every other
// run of the source into contiguous memory, one copy() a run. It returns
// the bytes a second of the first, and what a run of the second costs
// beyond its bytes at that speed.
func measureCopy(size, run, reps int) (bandwidth, runNS float64) {
	src, dst := make([]byte, size), make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	whole, runs, _ := pairwise(reps, 1, func() { copy(dst, src) }, func() {
		for o := 0; o+2*run <= size; o += 2 * run {
			copy(dst[o/2:o/2+run], src[o:o+run])
		}
	})
	bandwidth = float64(size) / max(whole.Seconds(), 1e-9)
	n := size / (2 * run)
	runNS = (float64(runs.Nanoseconds()) - float64(size/2)/bandwidth*1e9) / float64(n)
	return bandwidth, max(runNS, 0)
}
