package manifest

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// cpDesc is an MLA page of 16 tokens over 2 layers.
func cpDesc() Descriptor {
	return Descriptor{Layers: []int{0, 1}, KVHeads: 1, HeadDims: []int{8}, Dtype: "fp16", ItemSize: 2, PageSize: 16}
}

// cpManifest is the manifest of PP 1 x CP cp with interleave il of cpDesc:
// one part per CP rank.
func cpManifest(cp, il int) (*Manifest, error) {
	var parts []Part
	for r := cp - 1; r >= 0; r-- {
		parts = append(parts, Part{Layers: []int{0, 1}, HeadCount: 1, TokenSet: TokenSet{CPSize: cp, CPRank: r, Interleave: il}})
	}
	return New(testDomain, cpDesc(), PartLayout{Name: "PLHD", Order: "C T L H D"}, parts)
}

func TestTokenSetMapping(t *testing.T) {
	for _, tc := range []struct {
		s    TokenSet
		page int
		want []int // the page's tokens of local tokens 0, 1, ...
	}{
		{TokenSet{}, 4, []int{0, 1, 2, 3}},
		{TokenSet{CPSize: 2, CPRank: 1, Interleave: 1}, 8, []int{1, 3, 5, 7}},
		{TokenSet{CPSize: 2, CPRank: 0, Interleave: 2}, 8, []int{0, 1, 4, 5}},
		{TokenSet{CPSize: 4, CPRank: 3, Interleave: 4}, 16, []int{12, 13, 14, 15}},
		{TokenSet{CPSize: 3, CPRank: 2, Interleave: 2}, 12, []int{4, 5, 10, 11}},
	} {
		require.NoError(t, tc.s.Norm().Check("set", tc.page))
		require.Equal(t, len(tc.want), tc.s.Tokens(tc.page))
		var got []int
		for j := 0; j < tc.s.Tokens(tc.page); j++ {
			got = append(got, tc.s.Global(j))
		}
		require.Equal(t, tc.want, got, "%+v", tc.s)
		for p := 0; p < tc.page; p++ {
			j, ok := tc.s.Local(p)
			found := -1
			for i, w := range tc.want {
				if w == p {
					found = i
				}
			}
			require.Equal(t, found >= 0, ok, "token %d", p)
			if ok {
				require.Equal(t, found, j, "token %d", p)
			}
		}
	}
}

func TestCPManifest(t *testing.T) {
	m, err := cpManifest(2, 4)
	require.NoError(t, err)
	require.Len(t, m.Parts, 2)
	require.Equal(t, TokenSet{CPSize: 2, CPRank: 0, Interleave: 4}, m.Parts[0].TokenSet)
	require.Equal(t, TokenSet{CPSize: 2, CPRank: 1, Interleave: 4}, m.Parts[1].TokenSet)
	// 8 of the 16 tokens, 2 layers, one head of 8 fp16 elements.
	require.Equal(t, 8*2*8*2, m.PartBytes(0))
	require.Equal(t, 0, m.PartOfToken(1, 0, 3))
	require.Equal(t, 1, m.PartOfToken(1, 0, 4))
	require.Equal(t, -1, m.PartOfToken(2, 0, 4))
	enc := string(m.Encode())
	require.Contains(t, enc, `"parts":[{"cp_rank":0,"cp_size":2,"head_count":1,"head_start":0,"interleave":4,"layers":[0,1]},`+
		`{"cp_rank":1,"cp_size":2,"head_count":1,"head_start":0,"interleave":4,"layers":[0,1]}]}`)
	got, err := Decode(m.Encode(), m.Key(), testDomain)
	require.NoError(t, err)
	require.Equal(t, m.Parts, got.Parts)
	// The token set is in the identity: another interleave is another id.
	o, err := cpManifest(2, 2)
	require.NoError(t, err)
	require.NotEqual(t, m.ID(), o.ID())
}

func TestCPDecodeErrors(t *testing.T) {
	m, err := cpManifest(2, 4)
	require.NoError(t, err)
	g := string(m.Encode())
	p0 := `{"cp_rank":0,"cp_size":2,"head_count":1,"head_start":0,"interleave":4,"layers":[0,1]}`
	p1 := `{"cp_rank":1,"cp_size":2,"head_count":1,"head_start":0,"interleave":4,"layers":[0,1]}`
	both := p0 + "," + p1
	for _, tc := range []struct {
		name, parts, err string
	}{
		{"missing cp_rank", strings.Replace(both, `"cp_rank":1,`, ``, 1), "manifest is missing field parts[1].cp_rank"},
		{"string cp_size", strings.Replace(both, `"cp_size":2`, `"cp_size":"2"`, 1), "manifest field parts[0].cp_size is a string; want an integer"},
		{"zero cp_size", strings.ReplaceAll(both, `"cp_size":2`, `"cp_size":0`), "manifest part 0 cp_size is 0; it must be positive"},
		{"cp_size above the page", strings.ReplaceAll(both, `"cp_size":2`, `"cp_size":17`), "manifest part 0 cp_size 17 is more than the page's 16 tokens"},
		{"cp_rank out of range", strings.Replace(both, `"cp_rank":1`, `"cp_rank":2`, 1), "manifest part 1 cp_rank 2 is outside cp_size 2"},
		{"negative cp_rank", `{"cp_rank":-1,` + p0[len(`{"cp_rank":0,`):] + "," + p1, "manifest part 0 cp_rank -1 is outside cp_size 2"},
		{"zero interleave", strings.ReplaceAll(both, `"interleave":4`, `"interleave":0`), "manifest part 0 interleave is 0; it must be positive"},
		{"interleave not dividing", strings.ReplaceAll(both, `"interleave":4`, `"interleave":3`), "manifest part 0 interleave 3 does not divide the page's 16 tokens"},
		{"cp x interleave not dividing", strings.ReplaceAll(both, `"interleave":4`, `"interleave":16`), "manifest part 0 cp_size 2 x interleave 16 does not divide the page's 16 tokens"},
		{"mixed interleaves", strings.Replace(both, `"interleave":4`, `"interleave":2`, 1), "manifest part 1 has cp_size 2 and interleave 4 but part 0 has 2 and 2; a manifest's parts share them"},
		{"cp rank uncovered", strings.Replace(both, `"cp_rank":1`, `"cp_rank":0`, 1), "manifest covers layer 0 head 0 cp_rank 0 twice: parts 0 and 1"},
		{"one cp rank", p0, "manifest does not cover layer 0 head 0 cp_rank 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := strings.Replace(g, both, tc.parts, 1)
			require.NotEqual(t, g, data)
			_, err := Decode([]byte(data), "", testDomain)
			require.EqualError(t, err, tc.err)
		})
	}
	// Every token has one encoding: cp_size 1, interleave 1.
	g1, err := cpManifest(1, 1)
	require.NoError(t, err)
	_, err = Decode([]byte(strings.Replace(string(g1.Encode()), `"interleave":1`, `"interleave":4`, 1)), "", testDomain)
	require.EqualError(t, err, "manifest part 0 has cp_size 1 and interleave 4; a part of every token has interleave 1")

	// A product past int64 is refused, not wrapped: a page of 2^40 fp8
	// tokens of one layer, head and element.
	huge := Descriptor{Layers: []int{0}, KVHeads: 1, HeadDims: []int{1}, Dtype: "fp8", ItemSize: 1, PageSize: 1 << 40}
	_, err = New(testDomain, huge, PartLayout{Name: "PLHD", Order: "C T L H D"}, []Part{{Layers: []int{0}, HeadCount: 1,
		TokenSet: TokenSet{CPSize: 1 << 39, Interleave: 1 << 39}}})
	require.EqualError(t, err, "manifest part 0 cp_size 549755813888 x interleave 549755813888 does not divide the page's 1099511627776 tokens")

	// A layout that splits T must split the tokens of a part: 16 tokens
	// over CP 8 leave 2, which T/4 does not split.
	var parts []Part
	for r := 0; r < 8; r++ {
		parts = append(parts, Part{Layers: []int{0, 1}, HeadCount: 1, TokenSet: TokenSet{CPSize: 8, CPRank: r, Interleave: 1}})
	}
	_, err = New(testDomain, cpDesc(), PartLayout{Name: "tsplit", Order: "C T/4 L H T%4 D"}, parts)
	require.EqualError(t, err, `manifest layout "tsplit" splits T by 4, which does not divide the 2 tokens a part of cp_size 8 holds`)
	_, err = New(testDomain, cpDesc(), PartLayout{Name: "tsplit", Order: "C T/4 L H T%4 D"}, parts[:4:4])
	require.Error(t, err)
}

func TestTokenSetSame(t *testing.T) {
	all := TokenSet{}
	require.True(t, all.Same(TokenSet{CPSize: 1, Interleave: 1}))
	require.True(t, all.Same(TokenSet{CPSize: 1, Interleave: 4}))
	r1 := TokenSet{CPSize: 2, CPRank: 1, Interleave: 4}
	require.True(t, r1.Same(r1))
	require.False(t, r1.Same(TokenSet{CPSize: 2, CPRank: 0, Interleave: 4}))
	require.False(t, r1.Same(TokenSet{CPSize: 2, CPRank: 1, Interleave: 2}))
	require.False(t, r1.Same(all))
	require.False(t, TokenSet{CPSize: 2}.Same(all))
}
