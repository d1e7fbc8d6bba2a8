package placement

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/runtime/manifest"
)

func desc(layers, heads int) *manifest.Descriptor {
	d := &manifest.Descriptor{KVHeads: heads, HeadDims: []int{16, 16}, Dtype: "bf16", ItemSize: 2, PageSize: 16}
	for l := range layers {
		d.Layers = append(d.Layers, l)
	}
	return d
}

// all is the token set of every token, as Parts gives it.
var all = manifest.TokenSet{CPSize: 1, Interleave: 1}

func seq(lo, hi int) []int {
	var s []int
	for i := lo; i < hi; i++ {
		s = append(s, i)
	}
	return s
}

func shares(t *testing.T, top Topology, d *manifest.Descriptor) []Share {
	t.Helper()
	var out []Share
	for _, r := range top.Ranks() {
		s, err := top.Share(d, r)
		require.NoError(t, err)
		out = append(out, s)
	}
	return out
}

func TestEvenSplit(t *testing.T) {
	require.Equal(t, []Share{
		{Layers: seq(0, 4), HeadStart: 0, HeadCount: 4},
		{Layers: seq(4, 8), HeadStart: 0, HeadCount: 4},
	}, shares(t, Topology{TP: 1, PP: 2}, desc(8, 4)))

	// The remainder goes to the first stages: 10 layers on PP 3 are 4, 3, 3.
	require.Equal(t, []Share{
		{Layers: seq(0, 4), HeadStart: 0, HeadCount: 1},
		{Layers: seq(0, 4), HeadStart: 1, HeadCount: 1},
		{Layers: seq(4, 7), HeadStart: 0, HeadCount: 1},
		{Layers: seq(4, 7), HeadStart: 1, HeadCount: 1},
		{Layers: seq(7, 10), HeadStart: 0, HeadCount: 1},
		{Layers: seq(7, 10), HeadStart: 1, HeadCount: 1},
	}, shares(t, Topology{TP: 2, PP: 3}, desc(10, 2)))

	// 11 layers on PP 4: 3, 3, 3, 2.
	var sizes []int
	for _, s := range shares(t, Topology{TP: 1, PP: 4}, desc(11, 1)) {
		sizes = append(sizes, len(s.Layers))
	}
	require.Equal(t, []int{3, 3, 3, 2}, sizes)
}

func TestUnevenSplit(t *testing.T) {
	top := Topology{TP: 2, PP: 3, PPLayers: []int{4, 3, 2}}
	d := desc(9, 2)
	d.HeadDims = []int{64, 32}
	d.Dtype, d.ItemSize, d.PageSize = "fp32", 4, 8
	parts, err := top.Parts(d)
	require.NoError(t, err)
	require.Equal(t, []manifest.Part{
		{Layers: seq(0, 4), HeadStart: 0, HeadCount: 1, TokenSet: all},
		{Layers: seq(0, 4), HeadStart: 1, HeadCount: 1, TokenSet: all},
		{Layers: seq(4, 7), HeadStart: 0, HeadCount: 1, TokenSet: all},
		{Layers: seq(4, 7), HeadStart: 1, HeadCount: 1, TokenSet: all},
		{Layers: seq(7, 9), HeadStart: 0, HeadCount: 1, TokenSet: all},
		{Layers: seq(7, 9), HeadStart: 1, HeadCount: 1, TokenSet: all},
	}, parts)

	// Layer ids are the descriptor's, not indices.
	d = desc(0, 2)
	d.Layers = []int{3, 5, 8, 13, 21}
	s, err := Topology{TP: 1, PP: 2, PPLayers: []int{1, 4}}.Share(d, Rank{PP: 1})
	require.NoError(t, err)
	require.Equal(t, Share{Layers: []int{5, 8, 13, 21}, HeadStart: 0, HeadCount: 2}, s)
}

func TestTP3SixHeads(t *testing.T) {
	require.Equal(t, []Share{
		{Layers: seq(0, 4), HeadStart: 0, HeadCount: 2},
		{Layers: seq(0, 4), HeadStart: 2, HeadCount: 2},
		{Layers: seq(0, 4), HeadStart: 4, HeadCount: 2},
	}, shares(t, Topology{TP: 3, PP: 1}, desc(4, 6)))
}

func TestReplicatedHeads(t *testing.T) {
	top := Topology{TP: 16, PP: 2}
	d := desc(4, 8)
	parts, err := top.Parts(d)
	require.NoError(t, err)
	require.Len(t, parts, 16) // 8 per stage
	for i, p := range parts {
		require.Equal(t, manifest.Part{Layers: seq(i/8*2, i/8*2+2), HeadStart: i % 8, HeadCount: 1, TokenSet: all}, p)
	}
	for _, r := range top.Ranks() {
		s, err := top.Share(d, r)
		require.NoError(t, err)
		require.Equal(t, Share{Layers: seq(r.PP*2, r.PP*2+2), HeadStart: r.TP / 2, HeadCount: 1}, s)
		part, writes, err := top.Writer(d, r)
		require.NoError(t, err)
		require.Equal(t, r.PP*8+r.TP/2, part)
		require.Equal(t, r.TP%2 == 0, writes, "rank %+v", r)
	}
}

func TestRanks(t *testing.T) {
	require.Equal(t, []Rank{{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {1, 1, 0}, {0, 2, 0}, {1, 2, 0}}, Topology{TP: 2, PP: 3}.Ranks())
	require.Nil(t, Topology{TP: 0, PP: 3}.Ranks())
	// Past the bounds there is no list to build (and no slice to overflow).
	require.Nil(t, Topology{TP: 4611686018427387904, PP: 1}.Ranks())
	require.Nil(t, Topology{TP: 2, PP: 1 << 62}.Ranks())
}

// A topology whose parts no manifest holds is refused before they are
// built (4M parts of one layer and head); its ranks still have shares.
func TestTooManyParts(t *testing.T) {
	top := Topology{TP: MaxTP, PP: 4096}
	d := desc(4096, MaxTP)
	d.HeadDims = []int{1}
	_, err := top.Parts(d)
	require.EqualError(t, err, fmt.Sprintf("tp 1024 x pp 4096 stores 4194304 parts a page; a manifest holds at most %d", manifest.MaxParts))
	s, err := top.Share(d, Rank{TP: 1023, PP: 4095})
	require.NoError(t, err)
	require.Equal(t, Share{Layers: []int{4095}, HeadStart: 1023, HeadCount: 1}, s)
	// The most parts a manifest holds are built.
	top = Topology{TP: 1, PP: manifest.MaxParts}
	parts, err := top.Parts(desc(manifest.MaxParts, 1))
	require.NoError(t, err)
	require.Len(t, parts, manifest.MaxParts)
	_, err = Topology{TP: 1, PP: manifest.MaxParts + 1}.Parts(desc(manifest.MaxParts+1, 1))
	require.EqualError(t, err, fmt.Sprintf("tp 1 x pp %d stores %d parts a page; a manifest holds at most %d", manifest.MaxParts+1, manifest.MaxParts+1, manifest.MaxParts))
}

// The largest topologies within the bounds place every head: 1024 ranks
// of 1024 heads, and an MLA model's one head on 64 ranks.
func TestBoundsInclusive(t *testing.T) {
	for _, c := range []struct{ tp, heads, parts int }{{MaxTP, MaxTP, MaxTP}, {MaxReplication, 1, 1}, {MaxTP, MaxTP / MaxReplication, MaxTP / MaxReplication}} {
		top := Topology{TP: c.tp, PP: 2}
		d := desc(2, c.heads)
		parts, err := top.Parts(d)
		require.NoError(t, err, "%+v heads %d", top, c.heads)
		require.Len(t, parts, 2*c.parts)
		require.Len(t, top.Ranks(), 2*c.tp)
		part, writes, err := top.Writer(d, Rank{TP: c.tp - 1, PP: 1})
		require.NoError(t, err)
		require.Equal(t, 2*c.parts-1, part)
		require.Equal(t, c.parts == c.tp, writes)
	}
}

// TestConsistent checks, over many topologies, that the parts make a valid
// manifest (every layer and head exactly once), that each rank's Writer part
// is its share, and that each part has exactly one writer.
func TestConsistent(t *testing.T) {
	domain := (&manifest.Model{ModelID: "m"}).Domain()
	for _, layers := range []int{1, 3, 8, 9} {
		for _, heads := range []int{1, 2, 4, 6, 8} {
			for _, tp := range []int{1, 2, 3, 4, 6, 8, 12, 16} {
				for pp := 1; pp <= min(layers, 4); pp++ {
					d := desc(layers, heads)
					top := Topology{TP: tp, PP: pp}
					parts, err := top.Parts(d)
					if tp <= heads && heads%tp != 0 || tp > heads && tp%heads != 0 {
						require.Error(t, err)
						continue
					}
					require.NoError(t, err, "%+v heads %d", top, heads)
					m, err := manifest.New(domain, *d, manifest.PartLayout{Name: "PLHD", Order: "C T L H D"}, parts)
					require.NoError(t, err, "%+v heads %d", top, heads)
					require.Equal(t, parts, m.Parts)
					writers := make([]int, len(parts))
					for _, r := range top.Ranks() {
						s, err := top.Share(d, r)
						require.NoError(t, err)
						part, writes, err := top.Writer(d, r)
						require.NoError(t, err)
						require.Equal(t, manifest.Part{Layers: s.Layers, HeadStart: s.HeadStart, HeadCount: s.HeadCount, TokenSet: s.Tokens.Norm()}, parts[part])
						require.Equal(t, part, m.PartOf(s.Layers[0], s.HeadStart))
						if writes {
							writers[part]++
						}
					}
					for i, n := range writers {
						require.Equal(t, 1, n, "%+v heads %d part %d", top, heads, i)
					}
				}
			}
		}
	}
}

// TestReferenceParts compares with the parts and part sizes of the
// reference planner's cases (runtime/plan/testdata/reference-plans.json, made by the
// proposal's own planner).
func TestReferenceParts(t *testing.T) {
	domain := (&manifest.Model{ModelID: "m"}).Domain()
	type part struct {
		layers       []int
		start, count int
		bytes        int
	}
	for _, tc := range []struct {
		name                                   string
		layers, heads, kDim, vDim, item, pageT int
		dtype                                  string
		top                                    Topology
		want                                   []part
	}{
		{"pub-1", 8, 4, 16, 16, 2, 16, "bf16", Topology{TP: 1, PP: 2}, []part{
			{seq(0, 4), 0, 4, 16384}, {seq(4, 8), 0, 4, 16384}}},
		{"pub-2", 8, 4, 16, 16, 2, 16, "bf16", Topology{TP: 2, PP: 1}, []part{
			{seq(0, 8), 0, 2, 16384}, {seq(0, 8), 2, 2, 16384}}},
		{"pub-3", 16, 8, 32, 32, 2, 32, "bf16", Topology{TP: 4, PP: 1}, []part{
			{seq(0, 16), 0, 2, 131072}, {seq(0, 16), 2, 2, 131072}, {seq(0, 16), 4, 2, 131072}, {seq(0, 16), 6, 2, 131072}}},
		{"pub-4", 16, 8, 32, 32, 2, 32, "bf16", Topology{TP: 2, PP: 2}, []part{
			{seq(0, 8), 0, 4, 131072}, {seq(0, 8), 4, 4, 131072}, {seq(8, 16), 0, 4, 131072}, {seq(8, 16), 4, 4, 131072}}},
		{"pub-5", 9, 2, 64, 32, 4, 8, "fp32", Topology{TP: 2, PP: 3, PPLayers: []int{4, 3, 2}}, []part{
			{seq(0, 4), 0, 1, 12288}, {seq(0, 4), 1, 1, 12288}, {seq(4, 7), 0, 1, 9216},
			{seq(4, 7), 1, 1, 9216}, {seq(7, 9), 0, 1, 6144}, {seq(7, 9), 1, 1, 6144}}},
	} {
		d := &manifest.Descriptor{Layers: seq(0, tc.layers), KVHeads: tc.heads, HeadDims: []int{tc.kDim, tc.vDim},
			Dtype: tc.dtype, ItemSize: tc.item, PageSize: tc.pageT}
		parts, err := tc.top.Parts(d)
		require.NoError(t, err, tc.name)
		m, err := manifest.New(domain, *d, manifest.PartLayout{Name: "PLHD", Order: "C T L H D"}, parts)
		require.NoError(t, err, tc.name)
		var got []part
		for i, p := range m.Parts {
			got = append(got, part{p.Layers, p.HeadStart, p.HeadCount, m.PartBytes(i)})
		}
		require.Equal(t, tc.want, got, tc.name)
	}
}

func TestErrors(t *testing.T) {
	for _, tc := range []struct {
		top    Topology
		layers int
		heads  int
		err    string
	}{
		{Topology{TP: 0, PP: 1}, 4, 4, "tp 0 is not positive"},
		{Topology{TP: 1, PP: -1}, 4, 4, "pp -1 is not positive"},
		{Topology{TP: 3, PP: 1}, 4, 4, "kv-heads 4 is not divisible by tp 3"},
		{Topology{TP: 6, PP: 1}, 4, 4, "tp 6 is more than kv-heads 4 but not a multiple of it"},
		{Topology{TP: 1, PP: 5}, 4, 4, "pp 5 is more than the 4 layers"},
		{Topology{TP: 1, PP: 2, PPLayers: []int{4}}, 4, 4, "pp-layers has length 1, not pp 2"},
		{Topology{TP: 1, PP: 2, PPLayers: []int{4, 0}}, 4, 4, "pp-layers stage 1 has 0 layers; every stage needs at least one"},
		{Topology{TP: 1, PP: 2, PPLayers: []int{5, -1}}, 4, 4, "pp-layers stage 0 has 5 layers, more than the 4 layers"},
		{Topology{TP: 1, PP: 2, PPLayers: []int{1, 2}}, 4, 4, "pp-layers sum to 3, not the 4 layers"},
		{Topology{TP: 1, PP: 1}, 4, 0, "descriptor kv_heads is 0; it must be positive"},
		// Bounds: TP at most MaxTP, a head on at most MaxReplication ranks,
		// PP at most the layers even when pp-layers is given.
		{Topology{TP: 4611686018427387904, PP: 1}, 4, 4, "tp 4611686018427387904 is more than 1024"},
		{Topology{TP: 1000000000, PP: 1}, 4, 4, "tp 1000000000 is more than 1024"},
		{Topology{TP: 2048, PP: 1}, 4, 2048, "tp 2048 is more than 1024"},
		{Topology{TP: 128, PP: 1}, 4, 1, "tp 128 replicates each of the 1 kv-heads on 128 ranks; at most 64"},
		{Topology{TP: 520, PP: 1}, 4, 8, "tp 520 replicates each of the 8 kv-heads on 65 ranks; at most 64"},
		{Topology{TP: 1, PP: 1 << 62, PPLayers: []int{4}}, 4, 4, "pp 4611686018427387904 is more than the 4 layers"},
	} {
		d := desc(tc.layers, tc.heads)
		require.EqualError(t, tc.top.Validate(d), tc.err)
		_, err := tc.top.Share(d, Rank{})
		require.EqualError(t, err, tc.err)
		_, err = tc.top.Parts(d)
		require.EqualError(t, err, tc.err)
		_, _, err = tc.top.Writer(d, Rank{})
		require.EqualError(t, err, tc.err)
	}
	top := Topology{TP: 2, PP: 2}
	for _, r := range []Rank{{TP: 2}, {PP: 2}, {TP: -1}, {PP: -1}} {
		_, err := top.Share(desc(4, 4), r)
		require.EqualError(t, err, fmt.Sprintf("rank tp %d pp %d is outside tp 2 x pp 2", r.TP, r.PP))
		_, _, err = top.Writer(desc(4, 4), r)
		require.EqualError(t, err, fmt.Sprintf("rank tp %d pp %d is outside tp 2 x pp 2", r.TP, r.PP))
	}
}
