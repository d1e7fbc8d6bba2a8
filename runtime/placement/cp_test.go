package placement

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/runtime/manifest"
)

func mla(layers, page int) *manifest.Descriptor {
	d := &manifest.Descriptor{KVHeads: 1, HeadDims: []int{8}, Dtype: "fp16", ItemSize: 2, PageSize: page}
	for l := range layers {
		d.Layers = append(d.Layers, l)
	}
	return d
}

// With MLA the latent is replicated on every TP rank, but CP ranks hold
// different tokens: TP 2 x CP 2 writes two parts, one per CP rank, each by
// TP rank 0.
func TestCPParts(t *testing.T) {
	d := mla(2, 8)
	top := Topology{TP: 2, PP: 1, CP: 2, Interleave: 1}
	parts, err := top.Parts(d)
	require.NoError(t, err)
	require.Equal(t, []manifest.Part{
		{Layers: seq(0, 2), HeadCount: 1, TokenSet: manifest.TokenSet{CPSize: 2, CPRank: 0, Interleave: 1}},
		{Layers: seq(0, 2), HeadCount: 1, TokenSet: manifest.TokenSet{CPSize: 2, CPRank: 1, Interleave: 1}},
	}, parts)
	require.Equal(t, []Rank{{0, 0, 0}, {1, 0, 0}, {0, 0, 1}, {1, 0, 1}}, top.Ranks())
	for _, r := range top.Ranks() {
		part, writes, err := top.Writer(d, r)
		require.NoError(t, err)
		require.Equal(t, r.CP, part)
		require.Equal(t, r.TP == 0, writes)
		s, err := top.Share(d, r)
		require.NoError(t, err)
		require.Equal(t, parts[part].TokenSet, s.Tokens)
	}
}

// Every rank's part is the one Writer names, every part is written once,
// and the manifest of the parts covers every token.
func TestCPWriters(t *testing.T) {
	domain := (&manifest.Model{Namespace: "ns", ModelID: "m", Revision: "r"}).Domain()
	for _, heads := range []int{1, 2, 4} {
		d := desc(4, heads)
		for _, top := range []Topology{
			{TP: 1, PP: 1, CP: 4, Interleave: 4}, {TP: 2, PP: 2, CP: 2, Interleave: 1}, {TP: 4, PP: 1, CP: 2, Interleave: 8},
			{TP: 1, PP: 4, CP: 16, Interleave: 1}, {TP: 2, PP: 1, CP: 1, Interleave: 16},
		} {
			parts, err := top.Parts(d)
			require.NoError(t, err)
			m, err := manifest.New(domain, *d, manifest.PartLayout{Name: "PLHD", Order: "C T L H D"}, parts)
			require.NoError(t, err, "%+v", top)
			require.Equal(t, parts, m.Parts)
			writers := make([]int, len(parts))
			for _, r := range top.Ranks() {
				s, err := top.Share(d, r)
				require.NoError(t, err)
				part, writes, err := top.Writer(d, r)
				require.NoError(t, err)
				require.Equal(t, manifest.Part{Layers: s.Layers, HeadStart: s.HeadStart, HeadCount: s.HeadCount, TokenSet: s.Tokens.Norm()}, parts[part])
				if writes {
					writers[part]++
				}
			}
			for i, n := range writers {
				require.Equal(t, 1, n, "%+v part %d", top, i)
			}
		}
	}
}

func TestCPErrors(t *testing.T) {
	d := mla(2, 16)
	for _, tc := range []struct {
		top Topology
		err string
	}{
		{Topology{TP: 1, PP: 1, CP: 2, Interleave: 3}, "cp interleave 3 does not divide the page's 16 tokens"},
		{Topology{TP: 1, PP: 1, CP: 32}, "cp 32 is more than the page's 16 tokens"},
		{Topology{TP: 1, PP: 1, CP: 4, Interleave: 8}, "cp 4 x cp interleave 8 is 32 tokens, which does not divide the page's 16 tokens"},
		{Topology{TP: 1, PP: 1, CP: 3}, "cp 3 x cp interleave 1 is 3 tokens, which does not divide the page's 16 tokens"},
		{Topology{TP: 1, PP: 1, CP: -1}, "cp -1 is not positive"},
		{Topology{TP: 1, PP: 1, CP: 2, Interleave: -2}, "cp interleave -2 is not positive"},
	} {
		require.EqualError(t, tc.top.Validate(d), tc.err)
		_, err := tc.top.Parts(d)
		require.EqualError(t, err, tc.err)
	}
	top := Topology{TP: 2, PP: 1, CP: 2}
	_, err := top.Share(d, Rank{TP: 1, CP: 2})
	require.EqualError(t, err, "rank tp 1 pp 0 cp 2 is outside tp 2 x pp 1 x cp 2")
	_, _, err = top.Writer(d, Rank{CP: -1})
	require.EqualError(t, err, "rank tp 0 pp 0 cp -1 is outside tp 2 x pp 1 x cp 2")
	_, err = Topology{TP: 1, PP: 1}.Share(d, Rank{CP: 1})
	require.EqualError(t, err, "rank tp 0 pp 0 cp 1 is outside tp 1 x pp 1 x cp 1")
	big := mla(1, 4096)
	_, err = Topology{TP: 1, PP: 1, CP: 2048}.Parts(big)
	require.EqualError(t, err, "cp 2048 is more than 1024")
}
