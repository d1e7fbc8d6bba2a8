package plan

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
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
	// CopyBandwidth (bytes per second) and CopyRunNS (ns per run beyond
	// its bytes) are the speed of the local copies out of a staging
	// buffer: configured, as every figure is, so that a plan's choice is
	// the same on every run (`kvreshard bench --calibrate` measures them).
	CopyBandwidth float64
	CopyRunNS     float64
	// InPlace says the store lends its bytes (store.Viewer) instead of
	// reading them: a staged read moves nothing and costs only OpNS, so a
	// staged plan reads whole parts, whatever their gaps, and its cost is
	// the copy kernel's.
	InPlace bool
	// Batch is the staging bytes a reader's pipelined batch of staged
	// reads fills at least, one store call each; 0 means the reader's
	// default (4 MiB). A store whose every call costs much whatever its
	// bytes wants larger batches. Like InPlace it is a property of the
	// store, not a figure of a costs file.
	Batch int
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

// The speed of the local copies out of a staging buffer, for the file,
// Redis and RDMA transports: a property of the machine, not of the store.
// Measured on this project's machine (2 cores, AMD EPYC, shared; load
// average 1 to 20), five runs of
//
//	go run ./cmd/kvreshard bench --quick
//
// whose copy_vs_memmove baseline, one copy() of the 70B case's 2.5 MiB,
// ran at 27.2 to 28.1 GB/s (22 at load average 20), and whose
// copy_vs_memmove_runs baseline, copy() of the same bytes as its 10240
// runs of 256 bytes, one call a run (what a staged read of spans does), at
// 18.0 to 20.5 GB/s (8.4 at load average 17): 28 GB/s and, beyond the
// bytes, 3.7 to 4.9 ns a run. `bench --calibrate` measures the same
// (4 MiB copied whole and as runs of 256 bytes): 20.6 to 28.5 GB/s and 0
// to 13 ns a run, too noisy a run cost to configure; it writes what it
// measures to a costs file (--costs).
const (
	localCopyBandwidth = 28e9
	localCopyRunNS     = 4
)

// MemoryTransport is the in-process store (mem://): a range is a map
// lookup and a copy, and a staged read is a map lookup that lends the part
// (InPlace). Measured: op 0 to 41 ns, segment 7 to 15 ns, 9.0 to 12.6
// GB/s. A scatter list is a list of copies, so its bound is ours: 64
// segments by default keep a 70B-size source span in one read.
//
// Its reads are local copies, so its copy speed is its bandwidth and
// segment cost, not the machine's copy speed of the other transports
// (localCopyBandwidth): the choice between reading runs and copying from
// lent parts then rests on the op counts alone.
func MemoryTransport() Transport {
	return Transport{Name: "memory", OpNS: 25, SegmentNS: 10, Bandwidth: 11e9, Segments: 64, SegmentLimit: 1024, InPlace: true,
		CopyBandwidth: 11e9, CopyRunNS: 10}
}

// FileTransport is the file store (file://): a range is a positioned read
// from the page cache, one system call per segment. Measured: op 810 to
// 1000 ns (256-byte reads; 16 KiB reads cost no more than their bytes),
// segment 680 to 1130 ns, 6.0 to 8.1 GB/s.
func FileTransport() Transport {
	return Transport{Name: "file", OpNS: 900, SegmentNS: 800, Bandwidth: 7e9, Segments: 4, SegmentLimit: 1024,
		CopyBandwidth: localCopyBandwidth, CopyRunNS: localCopyRunNS}
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
// scatter bound is ours. At the configured copy speed (localCopyBandwidth,
// localCopyRunNS) staged reads of the spans cost 134583 ns of copies a
// 70B page against scatter's 109824 ns of extra segments, so auto keeps
// scatter on every run; bench's auto_regret_redis checks that choice
// against the strategies timed in turns.
func RedisTransport() Transport {
	return Transport{Name: "redis", OpNS: 4700, SegmentNS: 11, Bandwidth: 1.7e9, Segments: 64, SegmentLimit: 1024,
		CopyBandwidth: localCopyBandwidth, CopyRunNS: localCopyRunNS}
}

// RDMATransport models one-sided RDMA reads for planning only (nothing in
// this repository posts them): a work request with a scatter list of at
// most 30 entries (what NICs allow; Mooncake's transfer engine posts 4 by
// default), 250 ns of CPU and NIC work per request, 10 ns per extra entry,
// and a 200 Gb/s link.
func RDMATransport() Transport {
	return Transport{Name: "rdma", OpNS: 250, SegmentNS: 10, Bandwidth: 200e9 / 8, Segments: 4, SegmentLimit: 30,
		CopyBandwidth: localCopyBandwidth, CopyRunNS: localCopyRunNS}
}

// EngineTransport is an object engine (package enginestore), as Mooncake
// Store's Python client over TCP on loopback with a holder in another
// process: a ranged read costs about 12 µs a range beyond its bytes
// (get_into_ranges: 128 ranges of 1 KiB in 1.56 ms, 10,000 of 256 bytes
// in 114 ms) and whole objects move at about 5 GB/s (batch_get_into of 128
// objects of 256 KiB in 5.1 to 7.3 ms). Each segment of a scatter list is
// a range of its own, so it costs as much. A call costs far more than its
// ranges (a callback into the host process, then the engine's request:
// about 0.7 ms for a 70B page's 2.5 MiB of spans), so a reader's
// pipelined batches are of 8 MiB: mooncake_vs_get_into was 0.48 to 0.50
// with 4 MiB batches, 0.67 to 0.70 with 8 and 0.62 to 0.64 with 16, in
// the same session, while the file and Redis figures did not move.
func EngineTransport() Transport {
	return Transport{Name: "engine", OpNS: 12000, SegmentNS: 12000, Bandwidth: 5e9, Segments: 1, SegmentLimit: 64,
		CopyBandwidth: localCopyBandwidth, CopyRunNS: localCopyRunNS, Batch: 8 << 20}
}

// StoreTransport returns the default cost model of the store a URL names
// (store.Open's schemes): file for file://, redis for redis:// and
// redis+cluster://, engine for mooncake:// and engine: (the C library's
// object engines), memory for mem:// and anything else.
func StoreTransport(url string) Transport {
	switch {
	case strings.HasPrefix(url, "file:"):
		return FileTransport()
	case strings.HasPrefix(url, "redis:"), strings.HasPrefix(url, "redis+cluster:"):
		return RedisTransport()
	case strings.HasPrefix(url, "mooncake:"), strings.HasPrefix(url, "engine:"):
		return EngineTransport()
	}
	return MemoryTransport()
}

// TransportNamed returns the default transport of a name: memory, file,
// redis, engine or rdma.
func TransportNamed(name string) (Transport, error) {
	switch name {
	case "memory":
		return MemoryTransport(), nil
	case "file":
		return FileTransport(), nil
	case "redis":
		return RedisTransport(), nil
	case "engine":
		return EngineTransport(), nil
	case "rdma":
		return RDMATransport(), nil
	}
	return Transport{}, fmt.Errorf("unknown transport %q; transports are memory, file, redis, engine, rdma", name)
}

// Validate returns why t is not a usable cost model, or nil: every
// figure must lie within the bounds of its field (costFields), and the
// default segments within the limit.
func (t *Transport) Validate() error {
	for _, f := range costFields {
		if v := f.get(t); !(v >= f.min && v <= f.max) {
			return fmt.Errorf("transport %s: %s is %v; want %s", t.Name, f.name, v, f.want())
		}
	}
	if t.Segments > t.SegmentLimit {
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

// readNS is the time of n operations moving bytes. The bytes are scaled
// before they are divided, so that whole figures (a bandwidth of 1e9, say)
// give whole nanoseconds, exactly.
func (t *Transport) readNS(n, bytes int) float64 {
	return float64(n)*t.OpNS + float64(bytes)*1e9/t.Bandwidth
}

// maxEstimate bounds an estimate: figures within costFields' bounds stay
// far below it, and the conversion to a Duration never overflows.
const maxEstimate = float64(1 << 62)

// Estimate is the time the plan takes on the transport: its operations and
// bytes (only operations, for a staged plan on an in-place transport); for
// a scatter plan its extra segments; for a staged plan the local copies of
// its runs out of the staging buffer, at the transport's configured copy
// speed. A run a copy kernel moves costs only its bytes: the kernel moves
// the runs of a strided loop in one call (kernel.Copy2D); every other run
// is a copy() of its own. It depends on the plan and the figures alone:
// the same plan and transport give the same estimate on every run.
func (t *Transport) Estimate(pl *Plan) time.Duration {
	ns := t.readNS(pl.OpCount(), pl.ReadBytes)
	switch pl.Strategy {
	case Scatter:
		ns += float64(len(pl.Ops)-len(pl.Reads)) * t.SegmentNS
	case Staged:
		if t.InPlace {
			ns = float64(pl.OpCount()) * t.OpNS
		}
		runs := 0
		for _, r := range pl.Reads {
			if !r.Kernel {
				runs += r.N
			}
		}
		ns += float64(pl.Bytes)*1e9/t.CopyBandwidth + float64(runs)*t.CopyRunNS
	}
	return time.Duration(math.Ceil(min(ns, maxEstimate)))
}

// costField is one figure of a cost model: its name in a costs file, its
// bounds, and how to get and set it. Whole says the figure is a count.
type costField struct {
	name     string
	min, max float64
	unit     string
	whole    bool
	get      func(*Transport) float64
	set      func(*Transport, float64)
}

func (f *costField) want() string {
	return fmt.Sprintf("%s%g to %g%s", map[bool]string{true: "a whole number from ", false: ""}[f.whole], f.min, f.max, f.unit)
}

// The bounds of the figures: a nanosecond cost up to a second, a
// bandwidth from 1 MB/s to 1 PB/s, a scatter list of up to 65536
// segments. They keep any plan's estimate finite and far within a
// Duration.
const (
	maxCostNS       = 1e9
	minBandwidth    = 1e6
	maxBandwidth    = 1e15
	maxSegmentLimit = 1 << 16
)

// costFields are the figures of a Transport, in the order of a costs file.
var costFields = []costField{
	{"op_ns", 0, maxCostNS, " ns", false, func(t *Transport) float64 { return t.OpNS }, func(t *Transport, v float64) { t.OpNS = v }},
	{"segment_ns", 0, maxCostNS, " ns", false, func(t *Transport) float64 { return t.SegmentNS }, func(t *Transport, v float64) { t.SegmentNS = v }},
	{"bandwidth", minBandwidth, maxBandwidth, " bytes a second", false, func(t *Transport) float64 { return t.Bandwidth }, func(t *Transport, v float64) { t.Bandwidth = v }},
	{"copy_bandwidth", minBandwidth, maxBandwidth, " bytes a second", false, func(t *Transport) float64 { return t.CopyBandwidth }, func(t *Transport, v float64) { t.CopyBandwidth = v }},
	{"copy_run_ns", 0, maxCostNS, " ns", false, func(t *Transport) float64 { return t.CopyRunNS }, func(t *Transport, v float64) { t.CopyRunNS = v }},
	{"segments", 1, maxSegmentLimit, "", true, func(t *Transport) float64 { return float64(t.Segments) }, func(t *Transport, v float64) { t.Segments = int(v) }},
	{"segment_limit", 1, maxSegmentLimit, "", true, func(t *Transport) float64 { return float64(t.SegmentLimit) }, func(t *Transport, v float64) { t.SegmentLimit = int(v) }},
}

// Transports are cost models by transport name: memory, file, redis, engine,
// rdma.
type Transports map[string]Transport

// DefaultTransports returns the default cost model of every transport.
func DefaultTransports() Transports {
	return Transports{"memory": MemoryTransport(), "file": FileTransport(), "redis": RedisTransport(), "rdma": RDMATransport()}
}

// Named returns the set's cost model of a transport name, or the default
// (TransportNamed) when the set has none of that name.
func (ts Transports) Named(name string) (Transport, error) {
	if t, ok := ts[name]; ok {
		return t, nil
	}
	return TransportNamed(name)
}

// Store returns the set's cost model of the store a URL names (the
// transport StoreTransport chooses), or the default when the set has
// none of that name.
func (ts Transports) Store(url string) Transport {
	t := StoreTransport(url)
	if c, ok := ts[t.Name]; ok {
		return c
	}
	return t
}

// CostsFile is the JSON form of measured cost models: what `kvreshard
// bench --calibrate` writes and LoadTransports reads.
//
//	{"measured": "how and where",
//	 "transports": {"file": {"op_ns": 900, "segment_ns": 800, "bandwidth": 7000000000,
//	   "copy_bandwidth": 9000000000, "copy_run_ns": 3, "segments": 4, "segment_limit": 1024}}}
//
// Measured is free text. Transports are named memory, file, redis,
// engine or rdma; each gives every figure of its cost model (TransportCosts), and a
// transport the file does not name keeps its default. Whether a store
// lends its bytes (Transport.InPlace) is a property of the store, not a
// figure: it comes from the default of the name.
type CostsFile struct {
	Measured   string                    `json:"measured,omitempty"`
	Transports map[string]TransportCosts `json:"transports"`
}

// TransportCosts are the figures of one transport in a costs file: the
// Transport fields of the same meaning, bandwidths in bytes a second.
type TransportCosts struct {
	OpNS          float64 `json:"op_ns"`
	SegmentNS     float64 `json:"segment_ns"`
	Bandwidth     float64 `json:"bandwidth"`
	CopyBandwidth float64 `json:"copy_bandwidth"`
	CopyRunNS     float64 `json:"copy_run_ns"`
	Segments      int     `json:"segments"`
	SegmentLimit  int     `json:"segment_limit"`
}

// Costs returns the figures of t for a costs file.
func (t *Transport) Costs() TransportCosts {
	return TransportCosts{OpNS: t.OpNS, SegmentNS: t.SegmentNS, Bandwidth: t.Bandwidth, CopyBandwidth: t.CopyBandwidth,
		CopyRunNS: t.CopyRunNS, Segments: t.Segments, SegmentLimit: t.SegmentLimit}
}

// maxCostsBytes bounds the size of a costs file: four transports take
// well under a kilobyte.
const maxCostsBytes = 64 << 10

// LoadTransports reads a costs file (CostsFile): the default transports,
// with those the file names replaced by its figures. The error names the
// file and, for bad content, the field.
func LoadTransports(path string) (Transports, error) {
	data, err := readCostsFile(path)
	if err == nil {
		var ts Transports
		if ts, err = ParseTransports(data); err == nil {
			return ts, nil
		}
	}
	return nil, fmt.Errorf("costs file %s: %w", path, err)
}

// readCostsFile reads a regular file of at most maxCostsBytes, opened
// without blocking: a FIFO in its place is refused, not waited on.
func readCostsFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return nil, pe.Err
		}
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file (%s)", fi.Mode().Type())
	}
	data, err := io.ReadAll(io.LimitReader(f, maxCostsBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxCostsBytes {
		return nil, fmt.Errorf("larger than %d bytes", maxCostsBytes)
	}
	return data, nil
}

// ParseTransports parses the content of a costs file (CostsFile): the
// default transports, with those the file names replaced by its figures.
// The error names the field at fault, such as
// "transports.redis.copy_bandwidth".
func ParseTransports(data []byte) (Transports, error) {
	top, err := jsonObject(data, "the file")
	if err != nil {
		return nil, err
	}
	for _, k := range slices.Sorted(maps.Keys(top)) {
		if k != "measured" && k != "transports" {
			return nil, fmt.Errorf("unknown field %q; a costs file has measured and transports", k)
		}
	}
	if raw, ok := top["measured"]; ok {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, errors.New("measured: want a string")
		}
	}
	raw, ok := top["transports"]
	if !ok {
		return nil, errors.New("transports: missing")
	}
	objs, err := jsonObject(raw, "transports")
	if err != nil {
		return nil, err
	}
	ts := DefaultTransports()
	for _, name := range slices.Sorted(maps.Keys(objs)) {
		t, err := TransportNamed(name)
		if err != nil {
			return nil, fmt.Errorf("transports: %w", err)
		}
		at := "transports." + name
		fields, err := jsonObject(objs[name], at)
		if err != nil {
			return nil, err
		}
		for _, k := range slices.Sorted(maps.Keys(fields)) {
			if !slices.ContainsFunc(costFields, func(f costField) bool { return f.name == k }) {
				return nil, fmt.Errorf("%s: unknown field %q; the fields are %s", at, k, costFieldNames())
			}
		}
		for _, f := range costFields {
			raw, ok := fields[f.name]
			if !ok {
				return nil, fmt.Errorf("%s.%s: missing", at, f.name)
			}
			v, err := jsonNumber(raw)
			if err == nil && (f.whole && v != math.Trunc(v) || !(v >= f.min && v <= f.max)) {
				err = fmt.Errorf("%s; want %s", raw, f.want())
			}
			if err != nil {
				return nil, fmt.Errorf("%s.%s: %w", at, f.name, err)
			}
			f.set(&t, v)
		}
		if t.Segments > t.SegmentLimit {
			return nil, fmt.Errorf("%s.segments: %d is over segment_limit %d", at, t.Segments, t.SegmentLimit)
		}
		if err := t.Validate(); err != nil {
			return nil, fmt.Errorf("%s: %w", at, err)
		}
		ts[name] = t
	}
	return ts, nil
}

func costFieldNames() string {
	var names []string
	for _, f := range costFields {
		names = append(names, f.name)
	}
	return strings.Join(names, ", ")
}

// jsonObject decodes a JSON object into its members, or says that what
// (a field path) is not one: where its syntax breaks (line and column), or
// what it is instead.
func jsonObject(data []byte, what string) (map[string]json.RawMessage, error) {
	if !json.Valid(data) {
		err := json.Unmarshal(data, new(any))
		var se *json.SyntaxError
		if errors.As(err, &se) {
			// The offset is past the byte at fault.
			line, col := lineCol(data, int(se.Offset)-1)
			return nil, fmt.Errorf("%s: not JSON: line %d, column %d: %v", what, line, col, se)
		}
		return nil, fmt.Errorf("%s: not JSON: %v", what, err)
	}
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("%s: %v", what, err)
	}
	if _, ok := v.(map[string]any); !ok {
		return nil, fmt.Errorf("%s: want an object, not %s", what, jsonKind(v))
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%s: %v", what, err)
	}
	return m, nil
}

// jsonNumber decodes a JSON number, refusing anything else (a quoted
// number included) and numbers beyond a float64.
func jsonNumber(raw json.RawMessage) (float64, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return 0, err
	}
	n, ok := v.(json.Number)
	if !ok {
		return 0, fmt.Errorf("want a number, not %s", jsonKind(v))
	}
	f, err := strconv.ParseFloat(string(n), 64)
	if err != nil {
		return 0, fmt.Errorf("%s is out of range", n)
	}
	return f, nil
}

// jsonKind names the kind of a decoded JSON value.
func jsonKind(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case string:
		return fmt.Sprintf("the string %q", v)
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return "a number"
}

// lineCol returns the line and column (from 1) of the byte at offset off
// of data, or of its end.
func lineCol(data []byte, off int) (line, col int) {
	off = min(max(off, 0), len(data))
	line = 1 + bytes.Count(data[:off], []byte("\n"))
	return line, off - bytes.LastIndexByte(data[:off], '\n')
}
