package plan_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
)

// TestAutoTies plans pages on transports whose figures make two or three
// strategies' estimates exactly equal, and checks that auto breaks the
// tie by the fixed rule: fewer ops, then fewer bytes read, then the order
// direct, scatter, staged. Bandwidths of 1e9 and divisors of it keep the
// estimates whole nanoseconds.
func TestAutoTies(t *testing.T) {
	whole := smallCase(t) // TP 1 x PP 1: each part's 64 bytes, 8 runs of 8
	whole.dst = placement.Topology{TP: 1, PP: 1}
	layer0 := smallCase(t) // PP 2 rank 0: 4 runs of 8 bytes a part, 8 bytes apart
	// A latent page of 2 heads written by TP 1 in HPLD (head outermost)
	// and read by TP 2 rank 0 into layer_first: one source span of 32
	// bytes a part, 4 runs; staged, the whole part of 64 bytes.
	half := stratCase{d: manifest.Descriptor{Layers: []int{0, 1}, KVHeads: 2, HeadDims: []int{4}, Dtype: "fp16", ItemSize: 2, PageSize: 2},
		src: placement.Topology{TP: 1, PP: 1}, dst: placement.Topology{TP: 2, PP: 1},
		srcL: stratLayout(t, ir.Part, "HPLD", ""), dstL: stratLayout(t, ir.Pool, "layer_first", ""), slots: 1}
	for _, x := range []struct {
		name                   string
		c                      stratCase
		opNS, segNS, copyBW    float64
		inPlace                bool
		maxGap                 int
		est                    [3]int64
		want                   plan.Strategy
		ops, readBytes, kernel int
	}{
		// 16 direct ops, or 4 reads and 12 more segments at the op's cost:
		// 1728 ns each; 2 whole parts staged, but copied at 1 MB/s.
		{"fewer ops: scatter over direct", whole, 100, 100, 1e6, false, 0,
			[3]int64{16*100 + 128, 4*100 + 128 + 12*100, 2*100 + 128 + 128000}, plan.Scatter, 4, 128, 0},
		// Free segments; 2 whole parts, their 128 bytes copied at 640 MB/s
		// in the time of the 2 reads more that scatter takes: 528 ns each.
		{"fewer ops: staged over scatter", whole, 100, 0, 6.4e8, false, 0,
			[3]int64{16*100 + 128, 4*100 + 128, 2*100 + 128 + 200}, plan.Staged, 2, 128, 2},
		// One read each: the span's 4 segments (3 extra at 32 ns) against
		// the whole part and its copy at 500 MB/s: 228 ns each.
		{"fewer bytes: scatter over staged", half, 100, 32, 5e8, false, 32,
			[3]int64{4*100 + 32, 100 + 32 + 3*32, 100 + 64 + 64}, plan.Scatter, 1, 32, 0},
		// In place, a staged read of a run costs its op and its copy at the
		// link's speed: 8 ops of 8 bytes each way, 864 ns each.
		{"fixed order: direct", layer0, 100, 50, 1e9, true, -1,
			[3]int64{8*100 + 64, 8*100 + 64, 8*100 + 64}, plan.Direct, 8, 64, 0},
	} {
		tr := plan.Transport{Name: "tie", OpNS: x.opNS, SegmentNS: x.segNS, Bandwidth: 1e9, Segments: 4, SegmentLimit: 64,
			CopyBandwidth: x.copyBW, InPlace: x.inPlace}
		m, p := x.c.planner(t, plan.Options{Strategy: plan.Auto, Transport: &tr, MaxGap: x.maxGap})
		for range 3 {
			pl, err := p.Build(m)
			require.NoError(t, err, x.name)
			for s, ns := range x.est {
				require.Equal(t, ns, pl.Estimates[s].Nanoseconds(), "%s: %s", x.name, plan.Strategy(s))
			}
			require.Equal(t, x.want, pl.Strategy, x.name)
			require.Equal(t, x.ops, pl.OpCount(), x.name)
			require.Equal(t, x.readBytes, pl.ReadBytes, x.name)
			kernels := 0
			for _, r := range pl.Reads {
				if r.Kernel {
					kernels++
				}
			}
			require.Equal(t, x.kernel, kernels, x.name)
		}
	}
}

// TestConfiguredEstimates pins the estimates of the 70B case on the
// default cost models: every figure is configured, so they are the same
// numbers on every run and machine, and so is auto's choice. The page
// needs 2621440 bytes in 10240 runs of 256, 256 source spans of 40 runs.
// Redis and file bridge no 10 KiB gap (break-even 7990 and 6300 bytes), so
// staged reads the spans and copies every run (28 GB/s and 4 ns a run);
// the memory store lends the two whole parts, copied by the kernel.
func TestConfiguredEstimates(t *testing.T) {
	c := case70B(t, 1)
	for _, x := range []struct {
		tr   plan.Transport
		want plan.Strategy
		est  [3]int64
	}{
		// Bytes at 1.7 GB/s: 1542023.5 ns; ops at 4700 ns; scatter's 9984
		// extra segments at 11 ns (109824) against staged's copies (93622.9
		// + 40960).
		{plan.RedisTransport(), plan.Scatter, [3]int64{10240*4700 + 1542024, 256*4700 + 1542024 + 109824, 256*4700 + 1542024 + 134583}},
		// Bytes at 7 GB/s: 374491.4 ns; ops at 900 ns; 4 segments a read,
		// 7680 extra at 800 ns.
		{plan.FileTransport(), plan.Staged, [3]int64{10240*900 + 374492, 2560*900 + 374492 + 7680*800, 256*900 + 374492 + 134583}},
		// Bytes at 11 GB/s: 238312.7 ns; ops at 25 ns, segments at 10.
		{plan.MemoryTransport(), plan.Staged, [3]int64{10240*25 + 238313, 256*25 + 238313 + 9984*10, 2*25 + 238313}},
	} {
		tr := x.tr
		require.NoError(t, tr.Validate())
		require.Positive(t, tr.CopyBandwidth, tr.Name)
		m, p := c.planner(t, plan.Options{Strategy: plan.Auto, Transport: &tr})
		pl, err := p.Build(m)
		require.NoError(t, err)
		require.Equal(t, x.want, pl.Strategy, tr.Name)
		var got [3]int64
		for s := range got {
			got[s] = pl.Estimates[s].Nanoseconds()
		}
		require.Equal(t, x.est, got, tr.Name)
	}
}

// TestTransportValidate: each figure out of its bounds is named, with the
// bounds.
func TestTransportValidate(t *testing.T) {
	for _, x := range []struct {
		edit func(tr *plan.Transport)
		want string
	}{
		{func(tr *plan.Transport) { tr.OpNS = -1 }, "transport file: op_ns is -1; want 0 to 1e+09 ns"},
		{func(tr *plan.Transport) { tr.SegmentNS = 2e9 }, "transport file: segment_ns is 2e+09; want 0 to 1e+09 ns"},
		{func(tr *plan.Transport) { tr.Bandwidth = 0 }, "transport file: bandwidth is 0; want 1e+06 to 1e+15 bytes a second"},
		{func(tr *plan.Transport) { tr.CopyBandwidth = 0 }, "transport file: copy_bandwidth is 0; want 1e+06 to 1e+15 bytes a second"},
		{func(tr *plan.Transport) { tr.CopyRunNS = -0.5 }, "transport file: copy_run_ns is -0.5; want 0 to 1e+09 ns"},
		{func(tr *plan.Transport) { tr.Segments = 0 }, "transport file: segments is 0; want a whole number from 1 to 65536"},
		{func(tr *plan.Transport) { tr.SegmentLimit = 1 << 20 }, "transport file: segment_limit is 1.048576e+06; want a whole number from 1 to 65536"},
		{func(tr *plan.Transport) { tr.Segments, tr.SegmentLimit = 8, 4 }, "transport file: default segments 8 must be within 1 and the limit 4"},
	} {
		tr := plan.FileTransport()
		x.edit(&tr)
		require.EqualError(t, tr.Validate(), x.want)
	}
}

// costsJSON is a costs file that sets every figure of the file and Redis
// transports.
const costsJSON = `{"measured": "by hand",
 "transports": {
  "file": {"op_ns": 1200, "segment_ns": 700, "bandwidth": 5e9, "copy_bandwidth": 9e9, "copy_run_ns": 2.5, "segments": 8, "segment_limit": 512},
  "redis": {"op_ns": 5000, "segment_ns": 12, "bandwidth": 1500000000, "copy_bandwidth": 7e9, "copy_run_ns": 6, "segments": 40, "segment_limit": 1024}
 }}`

func TestParseTransports(t *testing.T) {
	ts, err := plan.ParseTransports([]byte(costsJSON))
	require.NoError(t, err)
	want := plan.DefaultTransports()
	want["file"] = plan.Transport{Name: "file", OpNS: 1200, SegmentNS: 700, Bandwidth: 5e9, CopyBandwidth: 9e9, CopyRunNS: 2.5, Segments: 8, SegmentLimit: 512}
	want["redis"] = plan.Transport{Name: "redis", OpNS: 5000, SegmentNS: 12, Bandwidth: 1.5e9, CopyBandwidth: 7e9, CopyRunNS: 6, Segments: 40, SegmentLimit: 1024}
	require.Equal(t, want, ts)
	require.Equal(t, want["redis"], ts.Store("redis://127.0.0.1:1"))
	require.Equal(t, plan.MemoryTransport(), ts.Store("mem://"))
	rdma, err := ts.Named("rdma")
	require.NoError(t, err)
	require.Equal(t, plan.RDMATransport(), rdma)
	_, err = ts.Named("tcp")
	require.EqualError(t, err, `unknown transport "tcp"; transports are memory, file, redis, engine, rdma`)

	// What a costs file holds round-trips, the memory store's lending
	// included (a property of the store, not a figure).
	f := plan.CostsFile{Measured: "defaults", Transports: map[string]plan.TransportCosts{}}
	for name, tr := range plan.DefaultTransports() {
		f.Transports[name] = tr.Costs()
	}
	data, err := json.Marshal(f)
	require.NoError(t, err)
	ts, err = plan.ParseTransports(data)
	require.NoError(t, err)
	require.Equal(t, plan.DefaultTransports(), ts)
	require.True(t, ts["memory"].InPlace)
	ts, err = plan.ParseTransports([]byte(`{"transports": {}}`))
	require.NoError(t, err)
	require.Equal(t, plan.DefaultTransports(), ts)

	fields := [][2]string{{"op_ns", "1"}, {"segment_ns", "1"}, {"bandwidth", "1e9"}, {"copy_bandwidth", "1e9"}, {"copy_run_ns", "1"}, {"segments", "4"}, {"segment_limit", "8"}}
	// bad returns a file transport whose field has the value.
	bad := func(field, value string) string {
		var kv []string
		for _, f := range fields {
			if f[0] == field {
				f[1] = value
			}
			kv = append(kv, `"`+f[0]+`": `+f[1])
		}
		return `{"transports": {"file": {` + strings.Join(kv, ", ") + `}}}`
	}
	for _, x := range []struct{ data, want string }{
		{``, "the file: not JSON: line 1, column 1: unexpected end of JSON input"},
		{"{\n  \"transports\": {\n    \"file\": {op_ns: 1}}}", `the file: not JSON: line 3, column 14: invalid character 'o' looking for beginning of object key string`},
		{`[]`, "the file: want an object, not an array"},
		{`{"transports": {}} {}`, "the file: not JSON: line 1, column 20: invalid character '{' after top-level value"},
		{`{"transport": {}}`, `unknown field "transport"; a costs file has measured and transports`},
		{`{"measured": 1, "transports": {}}`, "measured: want a string"},
		{`{"measured": "x"}`, "transports: missing"},
		{`{"transports": null}`, "transports: want an object, not null"},
		{`{"transports": {"tcp": {}}}`, `transports: unknown transport "tcp"; transports are memory, file, redis, engine, rdma`},
		{`{"transports": {"file": [1]}}`, "transports.file: want an object, not an array"},
		{`{"transports": {"file": {"op_ns": 1, "speed": 2}}}`, `transports.file: unknown field "speed"; the fields are op_ns, segment_ns, bandwidth, copy_bandwidth, copy_run_ns, segments, segment_limit`},
		{`{"transports": {"file": {"op_ns": 1}}}`, "transports.file.segment_ns: missing"},
		{bad("copy_bandwidth", "0"), "transports.file.copy_bandwidth: 0; want 1e+06 to 1e+15 bytes a second"},
		{bad("op_ns", `"900"`), `transports.file.op_ns: want a number, not the string "900"`},
		{bad("op_ns", `-1`), "transports.file.op_ns: -1; want 0 to 1e+09 ns"},
		{bad("segment_ns", `null`), "transports.file.segment_ns: want a number, not null"},
		{bad("bandwidth", `1e400`), "transports.file.bandwidth: 1e400 is out of range"},
		{bad("copy_run_ns", `true`), "transports.file.copy_run_ns: want a number, not a boolean"},
		{bad("segments", `2.5`), "transports.file.segments: 2.5; want a whole number from 1 to 65536"},
		{bad("segment_limit", `1e9`), "transports.file.segment_limit: 1e9; want a whole number from 1 to 65536"},
		{bad("segments", `16`), "transports.file.segments: 16 is over segment_limit 8"},
	} {
		_, err := plan.ParseTransports([]byte(x.data))
		require.EqualError(t, err, x.want, x.data)
	}
}

// TestLoadTransports reads costs files: the error names the file, and
// what is not a regular file (a FIFO no writer opens) is refused at once.
func TestLoadTransports(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "costs.json")
	require.NoError(t, os.WriteFile(good, []byte(costsJSON), 0o644))
	ts, err := plan.LoadTransports(good)
	require.NoError(t, err)
	require.Equal(t, 5000.0, ts["redis"].OpNS)

	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"transports": {"redis": {"op_ns": "fast"}}}`), 0o644))
	big := filepath.Join(dir, "big.json")
	require.NoError(t, os.WriteFile(big, []byte(`{"measured": "`+strings.Repeat("x", 64<<10)+`", "transports": {}}`), 0o644))
	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o644))
	for _, x := range []struct{ path, want string }{
		{bad, "costs file " + bad + `: transports.redis.op_ns: want a number, not the string "fast"`},
		{filepath.Join(dir, "none.json"), "costs file " + dir + "/none.json: no such file or directory"},
		{dir, "costs file " + dir + ": not a regular file (d---------)"},
		{fifo, "costs file " + fifo + ": not a regular file (p---------)"},
		{big, "costs file " + big + ": larger than 65536 bytes"},
	} {
		_, err := plan.LoadTransports(x.path)
		require.EqualError(t, err, x.want)
	}
}
