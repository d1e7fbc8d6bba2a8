package manifest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func testModel() *Model {
	return &Model{
		Namespace:   "ns",
		ModelID:     "llama",
		Revision:    "r1",
		Fingerprint: "rope=1e6",
		Descriptor: Descriptor{
			Layers:   []int{0, 1, 2, 3},
			KVHeads:  2,
			HeadDims: []int{4, 4},
			Dtype:    "bf16",
			ItemSize: 2,
			PageSize: 2,
		},
	}
}

var testDomain = testModel().Domain()

// testManifest is TP 2 x PP 2 of testModel, given out of order.
func testManifest(t *testing.T) *Manifest {
	t.Helper()
	m, err := New(testDomain, testModel().Descriptor, PartLayout{Name: "PLHD", Order: "C T L H D"}, []Part{
		{Layers: []int{2, 3}, HeadStart: 1, HeadCount: 1},
		{Layers: []int{0, 1}, HeadStart: 1, HeadCount: 1},
		{Layers: []int{2, 3}, HeadStart: 0, HeadCount: 1},
		{Layers: []int{0, 1}, HeadStart: 0, HeadCount: 1},
	})
	require.NoError(t, err)
	return m
}

const goldenJSON = `{"descriptor":{"dtype":"bf16","head_dims":[4,4],"item_size":2,"kv_heads":2,"layers":[0,1,2,3],"page_size":2},` +
	`"layout":{"name":"PLHD","order":"C T L H D"},"model_domain":"DOMAIN","parts":[` +
	`{"cp_rank":0,"cp_size":1,"head_count":1,"head_start":0,"interleave":1,"layers":[0,1]},{"cp_rank":0,"cp_size":1,"head_count":1,"head_start":1,"interleave":1,"layers":[0,1]},` +
	`{"cp_rank":0,"cp_size":1,"head_count":1,"head_start":0,"interleave":1,"layers":[2,3]},{"cp_rank":0,"cp_size":1,"head_count":1,"head_start":1,"interleave":1,"layers":[2,3]}]}`

func golden() string { return strings.Replace(goldenJSON, "DOMAIN", testDomain, 1) }

func TestEncodeGolden(t *testing.T) {
	m := testManifest(t)
	require.Equal(t, golden(), string(m.Encode()))
	sum := sha256.Sum256([]byte(golden()))
	require.Equal(t, hex.EncodeToString(sum[:]), m.Digest())
	require.Equal(t, "sha256:"+m.Digest(), m.ID())
	require.Equal(t, "kv/"+testDomain+"/manifests/"+m.Digest(), m.Key())

	// The same bytes as a generic encoder that sorts keys and adds no
	// spaces.
	var v any
	require.NoError(t, json.Unmarshal(m.Encode(), &v))
	again, err := json.Marshal(v)
	require.NoError(t, err)
	require.Equal(t, string(m.Encode()), string(again))
}

func TestEncodeIsACopy(t *testing.T) {
	m := testManifest(t)
	b := m.Encode()
	b[0] = 'x'
	require.Equal(t, golden(), string(m.Encode()))
}

func TestPartOrderIsDerived(t *testing.T) {
	a := testManifest(t)
	d := testModel().Descriptor
	l := PartLayout{Name: "PLHD", Order: "C T L H D"}
	parts := []Part{
		{Layers: []int{0, 1}, HeadStart: 0, HeadCount: 1},
		{Layers: []int{0, 1}, HeadStart: 1, HeadCount: 1},
		{Layers: []int{2, 3}, HeadStart: 0, HeadCount: 1},
		{Layers: []int{2, 3}, HeadStart: 1, HeadCount: 1},
	}
	for _, perm := range [][]int{{0, 1, 2, 3}, {3, 2, 1, 0}, {2, 0, 3, 1}, {1, 3, 0, 2}} {
		in := make([]Part, len(parts))
		for i, j := range perm {
			in[i] = parts[j]
		}
		b, err := New(testDomain, d, l, in)
		require.NoError(t, err)
		require.Equal(t, a.Encode(), b.Encode())
		require.Equal(t, a.ID(), b.ID())
		for i := range parts {
			want := parts[i]
			want.TokenSet = TokenSet{CPSize: 1, Interleave: 1} // New stores the zero token set as every token
			require.Equal(t, want, b.Parts[i])
		}
	}
}

func TestNewCopiesAndCanonicalizes(t *testing.T) {
	d := testModel().Descriptor
	parts := []Part{{Layers: []int{0, 1, 2, 3}, HeadStart: 0, HeadCount: 2}}
	m, err := New(testDomain, d, PartLayout{Name: "PLHD", Order: "  C T  L H\tD "}, parts)
	require.NoError(t, err)
	require.Equal(t, "C T L H D", m.Layout.Order)
	parts[0].Layers[0] = 9
	d.Layers[0] = 9
	d.HeadDims[0] = 9
	require.Equal(t, []int{0, 1, 2, 3}, m.Parts[0].Layers)
	require.Equal(t, []int{0, 1, 2, 3}, m.Descriptor.Layers)
	require.Equal(t, []int{4, 4}, m.Descriptor.HeadDims)
	_, err = Decode(m.Encode(), m.Key(), testDomain)
	require.NoError(t, err)
}

func TestPartBytesAndPartOf(t *testing.T) {
	m := testManifest(t)
	// PageSize 2 x 2 layers x 1 head x (4 + 4) dims x 2 bytes.
	for i := range m.Parts {
		require.Equal(t, 2*2*1*8*2, m.PartBytes(i))
	}
	require.Equal(t, 0, m.PartOf(1, 0))
	require.Equal(t, 1, m.PartOf(0, 1))
	require.Equal(t, 2, m.PartOf(3, 0))
	require.Equal(t, 3, m.PartOf(2, 1))
	require.Equal(t, -1, m.PartOf(4, 0))
	require.Equal(t, -1, m.PartOf(0, 2))
	require.Equal(t, -1, m.PartOf(0, -1))

	// K and V head dims differ; MLA has one component.
	d := Descriptor{Layers: []int{5, 7}, KVHeads: 4, HeadDims: []int{64, 32}, Dtype: "fp32", ItemSize: 4, PageSize: 8}
	m, err := New(testDomain, d, PartLayout{Name: "HPLD", Order: "C H T L D"}, []Part{{Layers: []int{5, 7}, HeadStart: 0, HeadCount: 4}})
	require.NoError(t, err)
	require.Equal(t, 8*2*4*(64+32)*4, m.PartBytes(0))
	require.Equal(t, 8*2*4*(64+32)*4, d.PageBytes())
	d = Descriptor{Layers: []int{0}, KVHeads: 1, HeadDims: []int{576}, Dtype: "fp8", ItemSize: 1, PageSize: 64}
	m, err = New(testDomain, d, PartLayout{Name: "PLHD", Order: "C T L H D"}, []Part{{Layers: []int{0}, HeadStart: 0, HeadCount: 1}})
	require.NoError(t, err)
	require.Equal(t, 64*576, m.PartBytes(0))
}

func TestItemSizeOf(t *testing.T) {
	for dtype, want := range map[string]int{"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1} {
		got, err := ItemSizeOf(dtype)
		require.NoError(t, err)
		require.Equal(t, want, got, dtype)
	}
	_, err := ItemSizeOf("int8")
	require.EqualError(t, err, `dtype "int8" is unknown; dtypes are fp32, bf16, fp16 and fp8`)
}

func TestDescriptorValidate(t *testing.T) {
	for _, tc := range []struct {
		edit func(d *Descriptor)
		err  string
	}{
		{func(d *Descriptor) { d.Layers = nil }, "descriptor has no layers"},
		{func(d *Descriptor) { d.Layers = []int{-1, 0} }, "descriptor layer -1 is negative"},
		{func(d *Descriptor) { d.Layers = []int{0, 2, 2} }, "descriptor layers are not strictly ascending: 2 after 2"},
		{func(d *Descriptor) { d.KVHeads = 0 }, "descriptor kv_heads is 0; it must be positive"},
		{func(d *Descriptor) { d.HeadDims = []int{1, 2, 3} }, "descriptor has 3 head dims; want 2 (k and v) or 1 (an mla latent)"},
		{func(d *Descriptor) { d.HeadDims = nil }, "descriptor has 0 head dims; want 2 (k and v) or 1 (an mla latent)"},
		{func(d *Descriptor) { d.HeadDims = []int{4, 0} }, "descriptor v head dim is 0; it must be positive"},
		{func(d *Descriptor) { d.HeadDims = []int{-4} }, "descriptor latent head dim is -4; it must be positive"},
		{func(d *Descriptor) { d.Dtype = "e4m3" }, `descriptor dtype "e4m3" is unknown; dtypes are fp32, bf16, fp16 and fp8`},
		{func(d *Descriptor) { d.ItemSize = 4 }, "descriptor item_size is 4 but dtype bf16 has item size 2"},
		{func(d *Descriptor) { d.PageSize = -1 }, "descriptor page_size is -1; it must be positive"},
		{func(d *Descriptor) { d.PageSize = 1 << 40 }, "descriptor page is more than 1099511627776 bytes"},
		{func(d *Descriptor) { d.PageSize, d.KVHeads = 1<<31, 1<<31 }, "descriptor page is more than 1099511627776 bytes"},
		{func(d *Descriptor) { d.DraftLayers = -1 }, "descriptor draft_layers is -1; it must be from 0 to its 4 layers"},
		{func(d *Descriptor) { d.DraftLayers = 5 }, "descriptor draft_layers is 5; it must be from 0 to its 4 layers"},
	} {
		d := testModel().Descriptor
		tc.edit(&d)
		require.EqualError(t, d.Validate(), tc.err)
	}
	d := testModel().Descriptor
	require.NoError(t, d.Validate())
	for _, n := range []int{1, 4} {
		d.DraftLayers = n
		require.NoError(t, d.Validate())
	}
}

func TestDomain(t *testing.T) {
	m := testModel()
	// The canonical JSON of the model, written out.
	want := `{"descriptor":{"dtype":"bf16","head_dims":[4,4],"item_size":2,"kv_heads":2,"layers":[0,1,2,3],"page_size":2},` +
		`"fingerprint":"rope=1e6","model_id":"llama","namespace":"ns","revision":"r1"}`
	sum := sha256.Sum256([]byte(want))
	require.Equal(t, hex.EncodeToString(sum[:]), m.Domain())
	require.True(t, isDomain(m.Domain()))

	// Every semantic field changes the domain.
	seen := map[string]string{m.Domain(): "base"}
	for name, edit := range map[string]func(m *Model){
		"namespace":    func(m *Model) { m.Namespace = "ns2" },
		"model id":     func(m *Model) { m.ModelID = "llama2" },
		"revision":     func(m *Model) { m.Revision = "r2" },
		"fingerprint":  func(m *Model) { m.Fingerprint = "rope=5e5" },
		"layers":       func(m *Model) { m.Descriptor.Layers = []int{0, 1, 2, 4} },
		"kv heads":     func(m *Model) { m.Descriptor.KVHeads = 4 },
		"head dims":    func(m *Model) { m.Descriptor.HeadDims = []int{4, 8} },
		"mla":          func(m *Model) { m.Descriptor.HeadDims = []int{4} },
		"dtype":        func(m *Model) { m.Descriptor.Dtype, m.Descriptor.ItemSize = "fp16", 2 },
		"item size":    func(m *Model) { m.Descriptor.ItemSize = 4 },
		"page size":    func(m *Model) { m.Descriptor.PageSize = 16 },
		"draft layers": func(m *Model) { m.Descriptor.DraftLayers = 1 },
		// The same layers, one fewer of them a draft layer.
		"more draft layers": func(m *Model) { m.Descriptor.DraftLayers = 2 },
		// Fields do not run into each other.
		"shifted": func(m *Model) { m.Namespace, m.ModelID = "nsl", "lama" },
	} {
		e := testModel()
		edit(e)
		d := e.Domain()
		prev, dup := seen[d]
		require.False(t, dup, "%s gives the domain of %s", name, prev)
		seen[d] = name
	}
}

// TestDomainExcludesTopology: the same model written by different
// topologies and layouts has one domain and one page key, while the
// manifests differ.
func TestDomainExcludesTopology(t *testing.T) {
	d := testModel().Descriptor
	tp1pp2, err := New(testDomain, d, PartLayout{Name: "PLHD", Order: "C T L H D"}, []Part{
		{Layers: []int{0, 1}, HeadStart: 0, HeadCount: 2},
		{Layers: []int{2, 3}, HeadStart: 0, HeadCount: 2},
	})
	require.NoError(t, err)
	tp2pp1, err := New(testDomain, d, PartLayout{Name: "HPLD", Order: "C H T L D"}, []Part{
		{Layers: []int{0, 1, 2, 3}, HeadStart: 0, HeadCount: 1},
		{Layers: []int{0, 1, 2, 3}, HeadStart: 1, HeadCount: 1},
	})
	require.NoError(t, err)
	require.NotEqual(t, tp1pp2.Digest(), tp2pp1.Digest())
	require.Equal(t, tp1pp2.Domain, tp2pp1.Domain)
	require.Equal(t, PageKey("sglang", "abc123", tp1pp2.Domain), PageKey("sglang", "abc123", tp2pp1.Domain))
	require.Equal(t, "kv/"+testDomain+"/manifests/", strings.TrimSuffix(tp1pp2.Key(), tp1pp2.Digest()))
}

func TestPageKey(t *testing.T) {
	key := PageKey("mooncake_llama", "0a1b", testDomain)
	require.Equal(t, "mooncake_llama_0a1b_"+testDomain, key)
	prefix, hash, domain, ok := SplitPageKey(key)
	require.True(t, ok)
	require.Equal(t, []string{"mooncake_llama", "0a1b", testDomain}, []string{prefix, hash, domain})
	_, _, _, ok = SplitPageKey("a_b")
	require.False(t, ok)
}

func TestNewErrors(t *testing.T) {
	d := testModel().Descriptor
	plhd := PartLayout{Name: "PLHD", Order: "C T L H D"}
	all := []Part{{Layers: []int{0, 1, 2, 3}, HeadStart: 0, HeadCount: 2}}
	for _, tc := range []struct {
		domain string
		edit   func(d *Descriptor)
		layout PartLayout
		parts  []Part
		err    string
	}{
		{domain: "abc", err: `manifest model domain "abc" is not a lowercase hex sha-256 digest`},
		{domain: strings.ToUpper(testDomain), err: fmt.Sprintf("manifest model domain %q is not a lowercase hex sha-256 digest", strings.ToUpper(testDomain))},
		{edit: func(d *Descriptor) { d.KVHeads = 0 }, err: "manifest descriptor kv_heads is 0; it must be positive"},
		{layout: PartLayout{Name: "page_first", Order: "C S T L H D"},
			err: `manifest layout "page_first": order "C S T L H D": column 3: part layout page_first has a slot axis S; only pool layouts have one`},
		{layout: PartLayout{Name: "X", Order: "C T L H"}, err: `manifest layout "X": order "C T L H": layout X is missing axis D`},
		{layout: PartLayout{Name: "vllm", Order: "L C T H D"}, edit: func(d *Descriptor) { d.HeadDims = []int{4, 8} },
			err: `manifest layout "vllm" has k and v head dims 4 and 8, so C must be its outermost axis`},
		{layout: PartLayout{Name: "xblock", Order: "C L H D/8 T D%8"},
			err: `manifest layout "xblock" splits D by 8, which does not divide the k head dim 4`},
		{layout: PartLayout{Name: "tblock", Order: "C T/4 L H D T%4"},
			err: `manifest layout "tblock" splits T by 4, which does not divide page_size 2`},
		{parts: []Part{}, err: "manifest has no parts"},
		{parts: []Part{{Layers: nil, HeadCount: 2}}, err: "manifest part 0 has no layers"},
		{parts: []Part{{Layers: []int{0, 2, 1, 3}, HeadCount: 2}}, err: "manifest part 0 layers are not strictly ascending: 1 after 2"},
		{parts: []Part{{Layers: []int{0, 1, 2, 3, 4}, HeadCount: 2}}, err: "manifest part 0 layer 4 is not in the descriptor"},
		{parts: []Part{{Layers: []int{0, 1, 2, 3}, HeadCount: 0}}, err: "manifest part 0 head_count is 0; it must be positive"},
		{parts: []Part{{Layers: []int{0, 1, 2, 3}, HeadStart: 1, HeadCount: 2}}, err: "manifest part 0 head_start 1 + head_count 2 is more than kv_heads 2"},
		{parts: []Part{{Layers: []int{0, 1, 2, 3}, HeadStart: -1, HeadCount: 2}}, err: "manifest part 0 head_start is -1; it must not be negative"},
		{parts: []Part{{Layers: []int{0, 1, 2, 3}, HeadStart: 1 << 62, HeadCount: 1 << 62}},
			err: "manifest part 0 head_start 4611686018427387904 + head_count 4611686018427387904 is more than kv_heads 2"},
		{parts: []Part{{Layers: []int{0, 1, 2, 3}, HeadStart: 0, HeadCount: 1}}, err: "manifest does not cover layer 0 head 1"},
		{parts: []Part{{Layers: []int{0, 1, 3}, HeadStart: 0, HeadCount: 2}}, err: "manifest does not cover layer 2 head 0"},
		{parts: []Part{
			{Layers: []int{0, 1, 2, 3}, HeadStart: 1, HeadCount: 1},
			{Layers: []int{0, 1}, HeadStart: 0, HeadCount: 1},
			{Layers: []int{2, 3}, HeadStart: 0, HeadCount: 2},
		}, err: "manifest covers layer 2 head 1 twice: parts 2 and 1"},
		{parts: []Part{all[0], all[0]}, err: "manifest covers layer 0 head 0 twice: parts 0 and 1"},
	} {
		domain := testDomain
		if tc.domain != "" {
			domain = tc.domain
		}
		dd := d.clone()
		if tc.edit != nil {
			tc.edit(&dd)
		}
		l := plhd
		if tc.layout.Name != "" {
			l = tc.layout
		}
		parts := all
		if tc.parts != nil {
			parts = tc.parts
		}
		_, err := New(domain, dd, l, parts)
		require.EqualError(t, err, tc.err)
	}
}

func TestNewSplitLayouts(t *testing.T) {
	d := Descriptor{Layers: []int{0, 1}, KVHeads: 2, HeadDims: []int{16, 16}, Dtype: "fp16", ItemSize: 2, PageSize: 8}
	for _, order := range []string{"C L H D/8 T D%8", "L C H T D", "C T/4 L H D T%4"} {
		_, err := New(testDomain, d, PartLayout{Name: "custom", Order: order}, []Part{{Layers: []int{0, 1}, HeadCount: 2}})
		require.NoError(t, err, order)
	}
}

// sizeManifest returns a descriptor of layers 0..n-1 and heads KV heads,
// and one part per head holding every layer: what a TP writer with one
// head per rank stores.
func sizeManifest(n, heads int) (Descriptor, []Part) {
	d := Descriptor{KVHeads: heads, HeadDims: []int{8, 8}, Dtype: "fp8", ItemSize: 1, PageSize: 1}
	for l := range n {
		d.Layers = append(d.Layers, l)
	}
	parts := make([]Part, heads)
	for h := range parts {
		parts[h] = Part{Layers: d.Layers, HeadStart: h, HeadCount: 1}
	}
	return d, parts
}

// encodedLen is the length of a manifest's JSON, measured with
// encoding/json: its keys come in another order, but its bytes are as
// many as the canonical encoding's.
func encodedLen(t *testing.T, d Descriptor, l PartLayout, parts []Part) int {
	t.Helper()
	b, err := json.Marshal(&Manifest{Domain: testDomain, Descriptor: d, Layout: l, Parts: parts})
	require.NoError(t, err)
	return len(b)
}

// New refuses a manifest that Decode would refuse for its size (issue 14:
// TP 64 with 4096 layers made 1.26 MB that no reader accepted), and a
// manifest of exactly MaxSize bytes is made and decoded.
func TestNewRefusesWhatDecodeRefuses(t *testing.T) {
	l := PartLayout{Name: "PLHD", Order: "C T L H D"}
	d, parts := sizeManifest(4096, 64)
	n := encodedLen(t, d, l, parts)
	require.Greater(t, n, MaxSize)
	_, err := New(testDomain, d, l, parts)
	require.EqualError(t, err, fmt.Sprintf("manifest of 64 parts is %d bytes encoded; readers accept at most 1048576", n))

	// The most layers whose manifest fits, then a layout name that pads it
	// to exactly MaxSize bytes.
	lo, hi := 1, 1<<17
	for lo+1 < hi {
		mid := (lo + hi) / 2
		d, parts := sizeManifest(mid, 1)
		if encodedLen(t, d, PartLayout{Name: "P", Order: l.Order}, parts) <= MaxSize {
			lo = mid
		} else {
			hi = mid
		}
	}
	d, parts = sizeManifest(lo, 1)
	pad := MaxSize - encodedLen(t, d, PartLayout{Name: "P", Order: l.Order}, parts)
	require.Less(t, pad, MaxLayoutText)
	exact := PartLayout{Name: "P" + strings.Repeat("x", pad), Order: l.Order}
	m, err := New(testDomain, d, exact, parts)
	require.NoError(t, err)
	require.Len(t, m.Encode(), MaxSize)
	_, err = Decode(m.Encode(), m.Key(), testDomain)
	require.NoError(t, err)

	over := PartLayout{Name: exact.Name + "x", Order: l.Order}
	_, err = New(testDomain, d, over, parts)
	require.EqualError(t, err, fmt.Sprintf("manifest of 1 part is %d bytes encoded; readers accept at most %d", MaxSize+1, MaxSize))
	_, err = Decode([]byte(strings.Replace(string(m.Encode()), exact.Name, over.Name, 1)), "", testDomain)
	require.EqualError(t, err, fmt.Sprintf("manifest is %d bytes; the limit is %d", MaxSize+1, MaxSize))
}

// MaxParts is the most parts of the shortest encoding that fit in MaxSize,
// and New refuses more before it copies them.
func TestMaxParts(t *testing.T) {
	b, err := json.Marshal(Part{Layers: []int{0}, HeadStart: 0, HeadCount: 1})
	require.NoError(t, err)
	require.Equal(t, MaxSize/(len(b)+1), MaxParts)
	d, _ := sizeManifest(MaxParts+1, 1)
	parts := make([]Part, MaxParts+1)
	for i := range parts {
		parts[i] = Part{Layers: []int{i}, HeadCount: 1}
	}
	_, err = New(testDomain, d, PartLayout{Name: "PLHD", Order: "C T L H D"}, parts)
	require.EqualError(t, err, fmt.Sprintf("manifest has %d parts; readers accept at most %d", MaxParts+1, MaxParts))
	// As many parts, one fewer: too long all the same.
	d, _ = sizeManifest(MaxParts, 1)
	_, err = New(testDomain, d, PartLayout{Name: "PLHD", Order: "C T L H D"}, parts[:MaxParts])
	require.ErrorContains(t, err, fmt.Sprintf("manifest of %d parts is ", MaxParts))
}

// TestDraftLayers: a descriptor's draft layers are written (first, in
// key order) only when there are some, so that every domain and manifest
// ID of a model without them is unchanged; with them they enter the domain
// and the manifest, and decode back.
func TestDraftLayers(t *testing.T) {
	m := testModel()
	m.Descriptor.DraftLayers = 1
	want := `{"descriptor":{"draft_layers":1,"dtype":"bf16","head_dims":[4,4],"item_size":2,"kv_heads":2,"layers":[0,1,2,3],"page_size":2},` +
		`"fingerprint":"rope=1e6","model_id":"llama","namespace":"ns","revision":"r1"}`
	sum := sha256.Sum256([]byte(want))
	require.Equal(t, hex.EncodeToString(sum[:]), m.Domain())
	require.NotEqual(t, testDomain, m.Domain())

	domain := m.Domain()
	mf, err := New(domain, m.Descriptor, PartLayout{Name: "PLHD", Order: "C T L H D"}, []Part{
		{Layers: []int{0, 1}, HeadCount: 2},
		{Layers: []int{2, 3}, HeadCount: 2},
	})
	require.NoError(t, err)
	enc := string(mf.Encode())
	require.True(t, strings.HasPrefix(enc, `{"descriptor":{"draft_layers":1,"dtype":"bf16",`), enc)
	got, err := Decode(mf.Encode(), mf.Key(), domain)
	require.NoError(t, err)
	require.Equal(t, 1, got.Descriptor.DraftLayers)
	require.Equal(t, mf.Digest(), got.Digest())

	// Without draft layers the manifest is the one it always was.
	require.Equal(t, golden(), string(testManifest(t).Encode()))
	require.NotContains(t, golden(), "draft_layers")
}
