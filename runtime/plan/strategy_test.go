package plan_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/internal/content"
	_ "github.com/kvreshard/kvreshard/layouts"
	"github.com/kvreshard/kvreshard/runtime/kernel"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
)

// stratCase is one randomized planner case of the strategy tests.
type stratCase struct {
	d          manifest.Descriptor
	src, dst   placement.Topology
	rank       placement.Rank
	srcL, dstL *ir.Layout
	slots      int
	slot       int
}

func (c *stratCase) String() string {
	return fmt.Sprintf("layers %v heads %d dims %v %s page %d; %s tp=%d pp=%d %v -> %s tp=%d pp=%d %v rank %d/%d slot %d/%d",
		c.d.Layers, c.d.KVHeads, c.d.HeadDims, c.d.Dtype, c.d.PageSize, c.srcL.Name, c.src.TP, c.src.PP, c.src.PPLayers,
		c.dstL.Name, c.dst.TP, c.dst.PP, c.dst.PPLayers, c.rank.TP, c.rank.PP, c.slot, c.slots)
}

// stratLayout returns a built-in layout, or parses an order for the
// interpreter.
func stratLayout(t *testing.T, kind ir.Kind, name, order string) *ir.Layout {
	t.Helper()
	if order == "" {
		l, err := kernel.LayoutNamed(name)
		require.NoError(t, err)
		return l
	}
	l, err := ir.ParseLayout(kind, name, order)
	require.NoError(t, err)
	return l
}

// stratTopology draws a topology valid for d: TP a divisor of the heads or
// twice them, PP up to 3 stages, unevenly split half of the time.
func stratTopology(r *rand.Rand, d *manifest.Descriptor) placement.Topology {
	for {
		tps := []int{1, 2 * d.KVHeads}
		for tp := 2; tp <= d.KVHeads; tp++ {
			if d.KVHeads%tp == 0 {
				tps = append(tps, tp)
			}
		}
		t := placement.Topology{TP: tps[r.IntN(len(tps))], PP: 1 + r.IntN(min(len(d.Layers), 3))}
		if t.PP > 1 && r.IntN(2) == 0 {
			left := len(d.Layers)
			for i := 0; i < t.PP-1; i++ {
				n := 1 + r.IntN(left-(t.PP-1-i))
				t.PPLayers = append(t.PPLayers, n)
				left -= n
			}
			t.PPLayers = append(t.PPLayers, left)
		}
		if t.Validate(d) == nil {
			return t
		}
	}
}

// randomStratCase draws a model, a writer and a reader rank, with built-in
// layouts (compiled kernels) and interpreted ones.
func randomStratCase(t *testing.T, r *rand.Rand) stratCase {
	parts := []*ir.Layout{
		stratLayout(t, ir.Part, "PLHD", ""), stratLayout(t, ir.Part, "LPHD", ""), stratLayout(t, ir.Part, "HPLD", ""),
		stratLayout(t, ir.Part, "flash", "L C T H D"),
	}
	pools := []*ir.Layout{
		stratLayout(t, ir.Pool, "page_first", ""), stratLayout(t, ir.Pool, "page_first_direct", ""),
		stratLayout(t, ir.Pool, "layer_first", ""), stratLayout(t, ir.Pool, "page_head", ""),
		stratLayout(t, ir.Pool, "hnd", "S L C H T D"),
	}
	var c stratCase
	c.srcL = parts[r.IntN(len(parts))]
	all := append(pools, parts...)
	c.dstL = all[r.IntN(len(all))]
	dtype := []string{"fp32", "bf16", "fp8"}[r.IntN(3)]
	dims := []int{1 + r.IntN(12)}
	if c.srcL.COuter() && c.dstL.COuter() && r.IntN(2) == 0 {
		dims = append(dims, 1+r.IntN(12))
	} else if r.IntN(5) != 0 {
		dims = append(dims, dims[0])
	}
	var layers []int
	for id, n := r.IntN(3), 1+r.IntN(7); len(layers) < n; id += 1 + r.IntN(2) {
		layers = append(layers, id)
	}
	c.d = manifest.Descriptor{Layers: layers, KVHeads: []int{1, 2, 3, 4, 6}[r.IntN(5)], HeadDims: dims, Dtype: dtype, PageSize: 1 + r.IntN(8)}
	c.d.ItemSize, _ = manifest.ItemSizeOf(dtype)
	c.src = stratTopology(r, &c.d)
	c.dst = stratTopology(r, &c.d)
	ranks := c.dst.Ranks()
	c.rank = ranks[r.IntN(len(ranks))]
	c.slots = 1
	if c.dstL.Kind == ir.Pool {
		c.slots = 1 + r.IntN(3)
		c.slot = r.IntN(c.slots)
	}
	return c
}

func (c *stratCase) planner(t *testing.T, opts plan.Options) (*manifest.Manifest, *plan.Planner) {
	t.Helper()
	m, err := plan.ManifestFor(strings.Repeat("ab", 32), &c.d, c.src, c.srcL)
	require.NoError(t, err)
	b, err := plan.BindingFor(&c.d, c.dst, c.rank, c.dstL, c.slots)
	require.NoError(t, err)
	p, err := plan.NewPlanner(&c.d, b, opts)
	require.NoError(t, err)
	return m, p
}

// execute moves a page as a transport and the reader do, following the
// plan's strategy: each op (direct); each read delivered into its
// segments in order (scatter); each round of reads into a staging buffer
// of the bound's size, which holds garbage before each round, then
// Planner.CopyStaged (staged).
func execute(t *testing.T, p *plan.Planner, tpl *plan.Plan, slot int, parts, regions [][]byte, bound int) {
	t.Helper()
	ops := p.Instantiate(tpl, slot, nil)
	switch tpl.Strategy {
	case plan.Direct:
		require.Nil(t, tpl.Reads)
		for _, op := range ops {
			copy(regions[op.Region][op.Dst:op.Dst+op.Len], parts[op.Part][op.Src:op.Src+op.Len])
		}
	case plan.Scatter:
		for _, r := range tpl.Reads {
			src := parts[r.Part][r.Src : r.Src+r.Len]
			for _, op := range ops[r.First : r.First+r.N] {
				src = src[copy(regions[op.Region][op.Dst:op.Dst+op.Len], src):]
			}
			require.Empty(t, src)
		}
	case plan.Staged:
		stage := make([]byte, bound)
		for i := 0; i < len(tpl.Reads); {
			for k := range stage {
				stage[k] = 0xa5
			}
			j := i
			for ; j < len(tpl.Reads) && tpl.Reads[j].Round == tpl.Reads[i].Round; j++ {
				r := tpl.Reads[j]
				copy(stage[r.Stage:r.Stage+r.Len], parts[r.Part][r.Src:r.Src+r.Len])
			}
			for k := i; k < j; k++ {
				r := tpl.Reads[k]
				p.CopyStaged(tpl, k, stage[r.Stage:r.Stage+r.Len], regions, slot)
			}
			i = j
		}
	default:
		t.Fatalf("plan strategy %s", tpl.Strategy)
	}
}

// checkBounds checks the bounds a strategy promises.
func checkBounds(t *testing.T, tpl *plan.Plan, maxSeg, bound int) {
	t.Helper()
	switch tpl.Strategy {
	case plan.Scatter:
		for _, r := range tpl.Reads {
			require.LessOrEqual(t, r.N, maxSeg)
		}
	case plan.Staged:
		require.LessOrEqual(t, tpl.StageBytes, bound)
		perRound := map[int]int{}
		for _, r := range tpl.Reads {
			require.LessOrEqual(t, r.Len, bound)
			require.LessOrEqual(t, r.Stage+r.Len, tpl.StageBytes)
			perRound[r.Round] = max(perRound[r.Round], r.Stage+r.Len)
		}
		require.Len(t, perRound, tpl.Rounds)
	}
	require.Equal(t, tpl.Estimates[tpl.Strategy], tpl.Estimate)
	require.Positive(t, tpl.Estimate)
}

// TestStrategiesByteExact plans random cases with every strategy, random
// scatter and staging bounds and gaps, and every transport for auto;
// executes each plan as a transport would, into a pool that already
// holds a direct plan's page at another slot, and checks every element of
// the page and every other byte of the pool.
func TestStrategiesByteExact(t *testing.T) {
	n := 150
	if testing.Short() {
		n = 40
	}
	r := rand.New(rand.NewPCG(6, 6))
	seen := map[string]int{}
	for i := range n {
		c := randomStratCase(t, r)
		seed := r.Uint64()
		m, direct := c.planner(t, plan.Options{})
		parts := fillParts(t, m, seed)
		want := direct.Geometry().NewRegions()
		dtpl, err := direct.Template(m)
		require.NoError(t, err)
		apply(direct, dtpl, c.slot, parts, want)
		require.NoError(t, content.Verify(direct.Geometry(), want, c.slot, seed), "case %d: %s", i, c.String())
		for _, s := range []plan.Strategy{plan.Direct, plan.Scatter, plan.Staged, plan.Auto} {
			tr := []func() plan.Transport{plan.MemoryTransport, plan.FileTransport, plan.RedisTransport, plan.RDMATransport}[r.IntN(4)]()
			tr.CopyBandwidth, tr.CopyRunNS = 8e9, 5
			opts := plan.Options{Strategy: s, Transport: &tr,
				MaxSegments: 1 + r.IntN(min(6, tr.SegmentLimit)),
				StageBytes:  []int{c.d.ItemSize, 64, 200, 1 << 10, 1 << 20}[r.IntN(5)] / c.d.ItemSize * c.d.ItemSize,
				MaxGap:      []int{-1, 0, 16, 1 << 20}[r.IntN(4)]}
			_, p := c.planner(t, opts)
			tpl, err := p.Template(m)
			require.NoError(t, err, "case %d %s: %s", i, s, c.String())
			if s != plan.Auto {
				require.Equal(t, s, tpl.Strategy)
			}
			checkBounds(t, tpl, opts.MaxSegments, opts.StageBytes)
			got := p.Geometry().NewRegions()
			execute(t, p, tpl, c.slot, parts, got, opts.StageBytes)
			require.NoError(t, content.Verify(p.Geometry(), got, c.slot, seed), "case %d %s: %s", i, s, c.String())
			require.Equal(t, want, got, "case %d %s: bytes outside the page changed: %s", i, s, c.String())
			key := tpl.Strategy.String()
			for _, rd := range tpl.Reads {
				if rd.Kernel {
					key += "+kernel"
					break
				}
			}
			seen[key]++
		}
	}
	t.Logf("plans by strategy: %v", seen)
	for _, k := range []string{"direct", "scatter", "staged", "staged+kernel"} {
		require.Positive(t, seen[k], "no %s plan among the cases", k)
	}
}

// case70B is a 70B-size page (80 layers, 8 KV heads, head dim 128, bf16,
// 64 tokens) written by TP 8 in PLHD and read by rank 0/0 of TP 4 x PP 2
// into a page_first pool of slots pages.
func case70B(t *testing.T, slots int) stratCase {
	d := manifest.Descriptor{KVHeads: 8, HeadDims: []int{128, 128}, Dtype: "bf16", ItemSize: 2, PageSize: 64}
	for i := range 80 {
		d.Layers = append(d.Layers, i)
	}
	return stratCase{d: d, src: placement.Topology{TP: 8, PP: 1}, dst: placement.Topology{TP: 4, PP: 2},
		srcL: stratLayout(t, ir.Part, "PLHD", ""), dstL: stratLayout(t, ir.Pool, "page_first", ""), slots: slots}
}

// TestStrategies70B pins the op counts of every strategy on the 70B case:
// 10240 runs of 256 bytes; per part 128 source spans (a token's 40
// layers of one component) of 40 runs each.
func TestStrategies70B(t *testing.T) {
	c := case70B(t, 2)
	tr := plan.RedisTransport()
	tr.CopyBandwidth, tr.CopyRunNS = 8e9, 5
	for _, x := range []struct {
		opts   plan.Options
		ops    int
		read   int
		rounds int
		kernel bool
	}{
		{plan.Options{Strategy: plan.Direct}, 10240, 2621440, 0, false},
		{plan.Options{Strategy: plan.Scatter, MaxSegments: 4}, 2560, 2621440, 0, false},
		{plan.Options{Strategy: plan.Scatter, MaxSegments: 30}, 512, 2621440, 0, false},
		{plan.Options{Strategy: plan.Scatter, MaxSegments: 40}, 256, 2621440, 0, false},
		// Gaps of 10240 bytes (the other 40 layers) are not bridged: 256
		// spans; bridged, each part is one read, copied by the kernel.
		{plan.Options{Strategy: plan.Staged, MaxGap: 10239}, 256, 2621440, 1, false},
		{plan.Options{Strategy: plan.Staged, MaxGap: 10240}, 2, 2 * 2621440, 1, true},
		// A bound of 102400 bytes reads at most its half at once, 51200
		// bytes: 3 of the 128 chunks of 10240 needed bytes, 20480 apart,
		// of a part: 42 reads of 3 and one of 2 a part, one round each.
		{plan.Options{Strategy: plan.Staged, MaxGap: 10240, StageBytes: 102400}, 86, 2 * (42*51200 + 30720), 86, false},
		// A bound of 51200: reads of 25600 bytes, a chunk, the gap and
		// half of the next chunk, or the rest of a chunk, the gap and the
		// next chunk: 2 reads for 3 chunks, 86 a part (the last reads the
		// last chunk's rest alone).
		{plan.Options{Strategy: plan.Staged, MaxGap: 10240, StageBytes: 51200}, 172, 2 * (85*25600 + 5120), 172, false},
	} {
		x.opts.Transport = &tr
		m, p := c.planner(t, x.opts)
		pl, err := p.Build(m)
		require.NoError(t, err)
		require.Equal(t, x.opts.Strategy, pl.Strategy)
		require.Equal(t, x.ops, pl.OpCount(), "%+v", x.opts)
		require.Equal(t, 2621440, pl.Bytes)
		require.Equal(t, x.read, pl.ReadBytes, "%+v", x.opts)
		require.Equal(t, x.rounds, pl.Rounds, "%+v", x.opts)
		require.Equal(t, x.kernel, pl.CopyKernel(0) != "")
		if x.kernel {
			require.Equal(t, "part(C T L H D) -> pool(C S T L H D)", pl.CopyKernel(1))
			require.Equal(t, 2*2621440, pl.StageBytes)
		}
	}
}

// TestCostModelChoice plans the 70B case for transports that differ only
// in the cost of an operation: a cheap one keeps direct reads, a dear one
// stages whole parts; in between, scatter wins. An in-place transport
// (the memory store lends its parts) stages whole parts at any op cost.
func TestCostModelChoice(t *testing.T) {
	c := case70B(t, 1)
	base := plan.Transport{Name: "x", SegmentNS: 5, Bandwidth: 10e9, Segments: 4, SegmentLimit: 30, CopyBandwidth: 10e9, CopyRunNS: 5}
	for _, x := range []struct {
		opNS    float64
		inPlace bool
		want    plan.Strategy
		ops     int
		est     [3]int64
	}{
		// The bytes take 262144 ns on the link and again to copy; 10240
		// runs cost 51200 ns to copy one by one, nothing more when a copy
		// kernel moves them. Scatter: 2560 reads and 7680 more segments.
		// Staged: gaps up to opNS x 10 bytes are bridged, so 256 spans
		// until the 10240-byte gaps are, then 2 whole parts.
		{0, false, plan.Direct, 10240, [3]int64{262144, 38400 + 262144, 262144 + 262144 + 51200}},
		{10, false, plan.Scatter, 2560, [3]int64{102400 + 262144, 25600 + 38400 + 262144, 2560 + 262144 + 262144 + 51200}},
		{20000, false, plan.Staged, 2, [3]int64{204800000 + 262144, 51200000 + 38400 + 262144, 40000 + 524288 + 262144}},
		// In place: any gap is bridged and a staged read moves nothing.
		{25, true, plan.Staged, 2, [3]int64{256000 + 262144, 64000 + 38400 + 262144, 50 + 262144}},
	} {
		tr := base
		tr.OpNS, tr.InPlace = x.opNS, x.inPlace
		m, p := c.planner(t, plan.Options{Strategy: plan.Auto, Transport: &tr})
		pl, err := p.Build(m)
		require.NoError(t, err)
		require.Equal(t, x.want, pl.Strategy, "op cost %v", x.opNS)
		require.Equal(t, x.ops, pl.OpCount())
		for s, ns := range x.est {
			require.Equal(t, ns, pl.Estimates[s].Nanoseconds(), "op cost %v, %s", x.opNS, plan.Strategy(s))
		}
		require.Equal(t, pl.Estimates[x.want], pl.Estimate)
	}
}

// smallCase is a page of 2 layers, 2 heads, head dims 4, fp16, 2 tokens,
// written by TP 2 in PLHD (two parts of 64 bytes) and read by rank 0/0 of
// TP 1 x PP 2 (layer 0 of both heads) into a page_first pool of 2 slots.
func smallCase(t *testing.T) stratCase {
	return stratCase{d: manifest.Descriptor{Layers: []int{0, 1}, KVHeads: 2, HeadDims: []int{4, 4}, Dtype: "fp16", ItemSize: 2, PageSize: 2},
		src: placement.Topology{TP: 2, PP: 1}, dst: placement.Topology{TP: 1, PP: 2},
		srcL: stratLayout(t, ir.Part, "PLHD", ""), dstL: stratLayout(t, ir.Pool, "page_first", ""), slots: 2}
}

// TestVerifyReads hands Verify scatter, staged and direct plans broken in
// one way each, and checks the sentinel and the exact text of each error.
// The page of smallCase read whole (TP 1 x PP 1) has 16 runs of 8 bytes;
// each part's 8 runs are its 64 contiguous bytes.
func TestVerifyReads(t *testing.T) {
	c := smallCase(t)
	c.dst = placement.Topology{TP: 1, PP: 1}
	m, sp := c.planner(t, plan.Options{Strategy: plan.Scatter, MaxSegments: 3})
	sc, err := sp.Build(m)
	require.NoError(t, err)
	require.Len(t, sc.Ops, 16)
	require.Equal(t, []plan.Read{
		{Part: 0, Src: 0, Len: 24, First: 0, N: 3}, {Part: 0, Src: 24, Len: 24, First: 3, N: 3}, {Part: 0, Src: 48, Len: 16, First: 6, N: 2},
		{Part: 1, Src: 0, Len: 24, First: 8, N: 3}, {Part: 1, Src: 24, Len: 24, First: 11, N: 3}, {Part: 1, Src: 48, Len: 16, First: 14, N: 2},
	}, sc.Reads)
	_, stp := c.planner(t, plan.Options{Strategy: plan.Staged, StageBytes: 96, MaxGap: -1})
	st, err := stp.Build(m)
	require.NoError(t, err)
	require.Equal(t, []plan.Read{
		{Part: 0, Src: 0, Len: 64, First: 0, N: 8, Round: 0, Kernel: true},
		{Part: 1, Src: 0, Len: 64, First: 8, N: 8, Round: 1, Kernel: true},
	}, st.Reads)
	require.Equal(t, []int{64, 2, 128}, []int{st.StageBytes, st.Rounds, st.ReadBytes})
	_, dp := c.planner(t, plan.Options{})
	d, err := dp.Build(m)
	require.NoError(t, err)
	// Layer 0 only (PP 2): each part's runs are [0,8), [16,24), [32,40) and
	// [48,56); gaps of 8 bytes make one span and the 8-byte tail is small
	// too, so each part is read whole.
	c2 := smallCase(t)
	m2, kp := c2.planner(t, plan.Options{Strategy: plan.Staged, MaxGap: 8})
	k, err := kp.Build(m2)
	require.NoError(t, err)
	require.Equal(t, []plan.Read{
		{Part: 0, Src: 0, Len: 64, First: 0, N: 4, Round: 0, Kernel: true},
		{Part: 1, Src: 0, Len: 64, First: 4, N: 4, Round: 0, Stage: 64, Kernel: true},
	}, k.Reads)

	for _, x := range []struct {
		name   string
		p      *plan.Planner
		base   *plan.Plan
		break_ func(pl *plan.Plan)
		is     error
		want   string
	}{
		{"segments over the bound", sp, sc, func(pl *plan.Plan) { pl.Reads[0].N, pl.Reads[0].Len = 4, 32; pl.Reads[1].First = 4 }, plan.ErrLimit,
			"plan over its limits: read 0 has 4 segments; the limit is 3"},
		{"ops fed twice", sp, sc, func(pl *plan.Plan) { pl.Reads[1].First = 4 }, plan.ErrCoverage,
			"plan does not cover the requirement: read 1 feeds ops [4,7); the next op to feed is 3 of 16"},
		{"segments longer than the read", sp, sc, func(pl *plan.Plan) { pl.Reads[0].Len = 16 }, plan.ErrCoverage,
			"plan does not cover the requirement: the segments of read 0 hold 24 of its 16 bytes"},
		{"segment not the next bytes", sp, sc, func(pl *plan.Plan) { pl.Reads[0].Src = 8 }, plan.ErrCoverage,
			"plan does not cover the requirement: op 0 (part 0, src 0) is not the next bytes of read 0 (part 0 at 8)"},
		{"ops not fed", sp, sc, func(pl *plan.Plan) { pl.Reads = pl.Reads[:5] }, plan.ErrCoverage,
			"plan does not cover the requirement: the reads feed 14 of 16 ops"},
		{"read bytes", sp, sc, func(pl *plan.Plan) { pl.ReadBytes = 100 }, plan.ErrCoverage,
			"plan does not cover the requirement: the plan says its reads move 100 bytes but they move 128"},
		{"scatter read with staging fields", sp, sc, func(pl *plan.Plan) { pl.Reads[2].Kernel = true }, plan.ErrStrategy,
			"plan reads do not fit its strategy: scatter read 2 has staging fields"},
		{"read past the part", sp, sc, func(pl *plan.Plan) { pl.Reads[5].Src = 56 }, plan.ErrBounds,
			"plan op out of bounds: read 5 reads [56,72) of part 1, which has 64 bytes"},
		{"read part", sp, sc, func(pl *plan.Plan) { pl.Reads[5].Part = 2 }, plan.ErrBounds,
			"plan op out of bounds: read 5 reads part 2 of 2"},
		{"odd read", sp, sc, func(pl *plan.Plan) { pl.Reads[0].Len = 15 }, plan.ErrAlignment,
			"plan op not aligned to the item size: read 0 (part 0, src 0, len 15) with item size 2"},
		{"too many ops", sp, sc, func(pl *plan.Plan) {}, plan.ErrLimit, ""},
		{"staging over the bound", stp, st, func(pl *plan.Plan) { pl.StageBytes = 100 }, plan.ErrLimit,
			"plan over its limits: 100 staging bytes; the bound is 96"},
		{"staging overlap", stp, st, func(pl *plan.Plan) { pl.Reads[1].Round, pl.Reads[1].Stage = 0, 32 }, plan.ErrBounds,
			"plan op out of bounds: read 1 stages at [32,96) of 64 bytes, over an earlier read of its round or outside the buffer"},
		{"round skipped", stp, st, func(pl *plan.Plan) { pl.Reads[1].Round = 2 }, plan.ErrStrategy,
			"plan reads do not fit its strategy: read 1 is in staging round 2 after round 0"},
		{"rounds", stp, st, func(pl *plan.Plan) { pl.Rounds = 5 }, plan.ErrStrategy,
			"plan reads do not fit its strategy: the plan says 5 staging rounds but its reads use 2"},
		{"kernel read of some runs", stp, st, func(pl *plan.Plan) { pl.Reads[0].N = 7; pl.Reads[1].First, pl.Reads[1].N = 7, 9 }, plan.ErrCoverage,
			"plan does not cover the requirement: kernel read 0 feeds 7 of the 8 runs of part 0"},
		{"run outside its staged read", stp, st, func(pl *plan.Plan) { pl.Reads[0].Len, pl.Reads[0].Kernel = 56, false }, plan.ErrCoverage,
			"plan does not cover the requirement: op 7 (part 0, [56,64)) is outside read 0 (part 0, [0,56))"},
		{"kernel read of a span", kp, k, func(pl *plan.Plan) { pl.Reads[0].Len = 56 }, plan.ErrStrategy,
			"plan reads do not fit its strategy: kernel read 0 holds [0,56) of part 0, not the whole part (64 bytes)"},
		{"staged bytes over the limit", kp, k, func(pl *plan.Plan) {}, plan.ErrLimit, ""},
		{"direct plan with reads", dp, d, func(pl *plan.Plan) { pl.Reads = []plan.Read{{Len: 2, N: 1}} }, plan.ErrStrategy,
			"plan reads do not fit its strategy: a direct plan issues its ops; it has 1 reads"},
		{"unknown strategy", dp, d, func(pl *plan.Plan) { pl.Strategy = 7 }, plan.ErrStrategy,
			"plan reads do not fit its strategy: unknown strategy 7"},
	} {
		pl := *x.base
		pl.Reads = append([]plan.Read{}, x.base.Reads...)
		x.break_(&pl)
		p := x.p
		switch x.name {
		case "too many ops":
			_, p = c.planner(t, plan.Options{Strategy: plan.Scatter, MaxSegments: 3, MaxOps: 5})
			x.want = "plan over its limits: 6 ops; the limit is 5"
			_, err := p.Build(m)
			require.EqualError(t, err, x.want)
		case "staged bytes over the limit":
			// 64 bytes to deliver, 128 to read.
			_, p = c2.planner(t, plan.Options{Strategy: plan.Staged, MaxGap: 8, MaxBytes: 100})
			x.want = "plan over its limits: 128 bytes read; the limit is 100"
			_, err := p.Build(m2)
			require.EqualError(t, err, x.want)
		}
		err := p.Verify(&pl)
		if x.is == nil {
			require.NoError(t, err, x.name)
			continue
		}
		require.ErrorIs(t, err, x.is, x.name)
		require.EqualError(t, err, x.want, x.name)
		require.NoError(t, x.p.Verify(x.base), x.name)
	}
}

// TestAutoWithinLimits: auto keeps the fastest plan that is within the
// limits; when none is, the direct plan's error is returned.
func TestAutoWithinLimits(t *testing.T) {
	c := smallCase(t)
	c.dst = placement.Topology{TP: 1, PP: 1}
	tr := plan.Transport{Name: "t", OpNS: 100, SegmentNS: 25, Bandwidth: 7.3e9, Segments: 4, SegmentLimit: 1024, CopyBandwidth: 8e9, CopyRunNS: 5}
	for _, x := range []struct {
		maxOps, stage int
		want          plan.Strategy
		ops           int
		err           string
	}{
		// Direct: 16 ops. Scatter (4 segments): 4 reads. Staged: 2 whole
		// parts, or 8 reads of 16 bytes under a 16-byte bound.
		{0, 0, plan.Staged, 2, ""},
		{0, 16, plan.Scatter, 4, ""},
		{3, 0, plan.Staged, 2, ""},
		{3, 16, 0, 0, "plan over its limits: 16 ops; the limit is 3"},
	} {
		m, p := c.planner(t, plan.Options{Strategy: plan.Auto, Transport: &tr, MaxOps: x.maxOps, StageBytes: x.stage})
		pl, err := p.Build(m)
		if x.err != "" {
			require.EqualError(t, err, x.err)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, x.want, pl.Strategy, "max ops %d, stage %d", x.maxOps, x.stage)
		require.Equal(t, x.ops, pl.OpCount())
	}
}

// TestStrategyOptions checks the option errors of NewPlanner and
// ParseStrategy.
func TestStrategyOptions(t *testing.T) {
	c := smallCase(t)
	b, err := plan.BindingFor(&c.d, c.dst, c.rank, c.dstL, c.slots)
	require.NoError(t, err)
	rdma := plan.RDMATransport()
	bad := plan.MemoryTransport()
	bad.Name, bad.Bandwidth = "x", 0
	for _, x := range []struct {
		opts plan.Options
		want string
	}{
		{plan.Options{Strategy: 9}, "unknown strategy 9"},
		{plan.Options{Transport: &rdma, MaxSegments: 31}, "max segments 31: transport rdma takes 1 to 30 segments a read"},
		{plan.Options{MaxSegments: -1}, "max segments -1: transport memory takes 1 to 1024 segments a read"},
		{plan.Options{StageBytes: 1}, "stage bytes 1: the staging bound must hold at least one item (2 bytes)"},
		{plan.Options{MaxGap: -2}, "max gap -2: give a byte count, 0 for the transport's break-even gap, or -1 for none"},
		{plan.Options{Transport: &bad}, "transport x: bandwidth is 0; want 1e+06 to 1e+15 bytes a second"},
	} {
		_, err := plan.NewPlanner(&c.d, b, x.opts)
		require.EqualError(t, err, x.want)
	}
	for i, name := range []string{"direct", "scatter", "staged", "auto"} {
		s, err := plan.ParseStrategy(name)
		require.NoError(t, err)
		require.Equal(t, plan.Strategy(i), s)
		require.Equal(t, name, s.String())
	}
	_, err = plan.ParseStrategy("fast")
	require.EqualError(t, err, `unknown strategy "fast"; strategies are direct, scatter, staged, auto`)
	for _, name := range []string{"memory", "file", "redis", "rdma"} {
		tr, err := plan.TransportNamed(name)
		require.NoError(t, err)
		require.Equal(t, name, tr.Name)
		require.NoError(t, tr.Validate())
	}
	_, err = plan.TransportNamed("tcp")
	require.EqualError(t, err, `unknown transport "tcp"; transports are memory, file, redis, engine, rdma`)
	for url, name := range map[string]string{"file:///tmp/kv": "file", "redis://127.0.0.1:6379": "redis",
		"redis+cluster://a:1,b:2": "redis", "mem://x": "memory", "": "memory"} {
		require.Equal(t, name, plan.StoreTransport(url).Name, url)
	}
	require.Equal(t, 200e9/8, plan.RDMATransport().Bandwidth)
}
