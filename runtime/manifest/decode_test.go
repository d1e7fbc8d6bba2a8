package manifest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDecodeRoundTrip(t *testing.T) {
	m := testManifest(t)
	got, err := Decode(m.Encode(), m.Key(), testDomain)
	require.NoError(t, err)
	require.Equal(t, m.Encode(), got.Encode())
	require.Equal(t, m.Digest(), got.Digest())
	require.Equal(t, m.Key(), got.Key())
	require.Equal(t, m.Parts, got.Parts)
	require.Equal(t, m.Descriptor, got.Descriptor)
	require.Equal(t, m.Layout, got.Layout)
	// The key check is optional.
	_, err = Decode(m.Encode(), "", testDomain)
	require.NoError(t, err)
}

// replace replaces exactly one occurrence of old in s.
func replace(t *testing.T, s, old, new string) string {
	t.Helper()
	require.Equal(t, 1, strings.Count(s, old), "%q occurs once", old)
	return strings.Replace(s, old, new, 1)
}

func TestDecodeErrors(t *testing.T) {
	g := golden()
	m := testManifest(t)
	key := m.Key()
	other := (&Model{Namespace: "other", Descriptor: testModel().Descriptor}).Domain()
	part1 := `{"cp_rank":0,"cp_size":1,"head_count":1,"head_start":1,"interleave":1,"layers":[0,1]}`
	part0 := `{"cp_rank":0,"cp_size":1,"head_count":1,"head_start":0,"interleave":1,"layers":[0,1]}`
	at := func(s, sub string) int { return strings.Index(s, sub) }
	dupKV := replace(t, g, `"kv_heads":2,`, `"kv_heads":2,"kv_heads":2,`)
	dupTop := g[:len(g)-1] + `,"parts":[]}`
	for _, tc := range []struct {
		name string
		data string
		key  string // "-" for no key check
		err  string
	}{
		{"oversize", strings.Repeat(" ", 2000000), "", "manifest is 2000000 bytes; the limit is 1048576"},
		{"empty", "", "", "manifest is not valid json: unexpected end of input; want a value at byte 0"},
		{"truncated", g[:14], "", "manifest is not valid json: unexpected end of input; want a value at byte 14"},
		{"trailing", g + "{}", "", fmt.Sprintf("manifest is not valid json: unexpected '{'; want the end of input at byte %d", len(g))},
		{"missing colon", `{"a" 1}`, "", `manifest is not valid json: unexpected '1'; want ':' at byte 5`},
		{"trailing comma", `{"a":1,}`, "", `manifest is not valid json: unexpected '}'; want an object key at byte 7`},
		{"leading zero", `{"a":01}`, "", `manifest is not valid json: unexpected '1'; want ',' or '}' at byte 6`},
		{"bad number", `{"a":-}`, "", `manifest is not valid json: unexpected '}'; want a digit at byte 6`},
		{"bad literal", `{"a":nul}`, "", `manifest is not valid json: unexpected '}'; want "null" at byte 8`},
		{"bad escape", `{"a\q":1}`, "", `manifest is not valid json: invalid escape 'q' at byte 4`},
		{"bad unicode escape", `{"\u12g4":1}`, "", `manifest is not valid json: invalid hex digit 'g' in \u escape at byte 6`},
		{"control character", "{\"a\tb\":1}", "", `manifest is not valid json: control character 0x09 in string at byte 3`},
		{"invalid utf-8", "{\"a\xffb\":1}", "", `manifest is not valid json: invalid utf-8 in string at byte 3`},
		{"unterminated", `{"abc`, "", `manifest is not valid json: unterminated string at byte 5`},
		{"not json", "\x00", "", `manifest is not valid json: unexpected byte 0x00; want a value at byte 0`},
		{"too deep", strings.Repeat("[", 100), "", "manifest nests more than 16 levels deep at byte 16"},
		{"duplicate key", dupKV, "", fmt.Sprintf(`manifest has duplicate key descriptor.kv_heads at byte %d`, at(dupKV, `"kv_heads":2,"kv_heads"`)+13)},
		{"duplicate top key", dupTop, "", fmt.Sprintf(`manifest has duplicate key parts at byte %d`, len(g))},
		{"duplicate key in part", replace(t, g, part1, `{"cp_rank":0,"cp_size":1,"head_count":1,"head_start":1,"head_start":1,"interleave":1,"layers":[0,1]}`), "",
			fmt.Sprintf(`manifest has duplicate key parts[1].head_start at byte %d`, at(g, part1)+55)},
		{"not an object", `[]`, "", "manifest is an array; want an object"},
		{"unknown field", `{"extra":1,` + g[1:], "", "manifest has unknown field extra"},
		{"odd unknown field", `{"a\nb":1,` + g[1:], "", `manifest has unknown field "a\nb"`},
		{"long unknown field", `{"descriptor":{"` + strings.Repeat("x", 100) + `":1}}`, "", `manifest has unknown field descriptor."` + strings.Repeat("x", 64) + `"`},
		{"duplicate odd key", `{"a b":1,"a b":2}`, "", `manifest has duplicate key "a b" at byte 9`},
		{"long order", replace(t, g, `"order":"C T L H D"`, `"order":"`+strings.Repeat("C ", 200)+`"`), "", `manifest layout "PLHD" order is 400 bytes; the limit is 256`},
		{"long name", replace(t, g, `"name":"PLHD"`, `"name":"`+strings.Repeat("N", 300)+`"`), "", `manifest layout name is 300 bytes; the limit is 256`},
		{"long domain", replace(t, g, testDomain, testDomain+testDomain), "", fmt.Sprintf(`manifest model domain %q is not a lowercase hex sha-256 digest`, (testDomain + testDomain)[:80])},
		{"rank label", replace(t, g, part1, `{"cp_rank":0,"cp_size":1,"head_count":1,"head_start":1,"interleave":1,"layers":[0,1],"rank":1}`), "", "manifest has unknown field parts[1].rank"},
		{"missing field", replace(t, g, `,"page_size":2`, ``), "", "manifest is missing field descriptor.page_size"},
		{"missing top field", replace(t, g, `"layout":{"name":"PLHD","order":"C T L H D"},`, ``), "", "manifest is missing field layout"},
		{"string for int", replace(t, g, `"kv_heads":2`, `"kv_heads":"2"`), "", "manifest field descriptor.kv_heads is a string; want an integer"},
		{"float for int", replace(t, g, `"kv_heads":2`, `"kv_heads":2.0`), "", "manifest field descriptor.kv_heads is 2.0; want an integer"},
		{"exponent for int", replace(t, g, `"kv_heads":2`, `"kv_heads":2e0`), "", "manifest field descriptor.kv_heads is 2e0; want an integer"},
		{"huge int", replace(t, g, `"kv_heads":2`, `"kv_heads":99999999999999999999`), "", "manifest field descriptor.kv_heads is 99999999999999999999, out of range"},
		{"null array", replace(t, g, `"layers":[0,1,2,3]`, `"layers":null`), "", "manifest field descriptor.layers is null; want an array"},
		{"string in array", replace(t, g, `"layers":[0,1,2,3]`, `"layers":[0,"1",2,3]`), "", "manifest field descriptor.layers[1] is a string; want an integer"},
		{"number for string", replace(t, g, `"name":"PLHD"`, `"name":1`), "", "manifest field layout.name is a number; want a string"},
		{"bool for string", replace(t, g, `"dtype":"bf16"`, `"dtype":true`), "", "manifest field descriptor.dtype is a boolean; want a string"},
		{"object for array", replace(t, g, `"parts":[`+part0+","+part1, `"parts":{"a":[`+part0+","+part1) + "}", "",
			"manifest field parts is an object; want an array"},
		{"number for part", replace(t, g, part1, `1`), "", "manifest field parts[1] is a number; want an object"},
		{"layout not object", replace(t, g, `{"name":"PLHD","order":"C T L H D"}`, `"PLHD"`), "", "manifest field layout is a string; want an object"},
		{"bad domain", replace(t, g, testDomain, "abc"), "", `manifest model domain "abc" is not a lowercase hex sha-256 digest`},
		{"descriptor", replace(t, g, `"item_size":2`, `"item_size":4`), "", "manifest descriptor item_size is 4 but dtype bf16 has item size 2"},
		{"pool layout", replace(t, g, `"order":"C T L H D"`, `"order":"C S T L H D"`), "",
			`manifest layout "PLHD": order "C S T L H D": column 3: part layout PLHD has a slot axis S; only pool layouts have one`},
		{"bad order", replace(t, g, `"order":"C T L H D"`, `"order":"C T L H"`), "", `manifest layout "PLHD": order "C T L H": layout PLHD is missing axis D`},
		{"bad name", replace(t, g, `"name":"PLHD"`, `"name":"a b"`), "",
			`manifest layout "a b": order "C T L H D": invalid layout name "a b"; a name is a letter or _ followed by letters, digits and _`},
		{"non-canonical order", replace(t, g, `"order":"C T L H D"`, `"order":"C T L H  D"`), "", `manifest layout "PLHD" order "C T L H  D" is not canonical; want "C T L H D"`},
		{"dims and order", replace(t, replace(t, g, `"head_dims":[4,4]`, `"head_dims":[4,8]`), `"order":"C T L H D"`, `"order":"T C L H D"`), "",
			`manifest layout "PLHD" has k and v head dims 4 and 8, so C must be its outermost axis`},
		{"parts out of order", replace(t, g, part0+","+part1, part1+","+part0), "", "manifest part 1 is out of order: parts are sorted by layers, then head_start, head_count, cp_size, interleave and cp_rank"},
		{"no parts", replace(t, g, g[at(g, `"parts":`):], `"parts":[]}`), "", "manifest has no parts"},
		{"layer not in descriptor", replace(t, g, `"head_start":1,"interleave":1,"layers":[2,3]`, `"head_start":1,"interleave":1,"layers":[2,4]`), "", "manifest part 3 layer 4 is not in the descriptor"},
		{"heads out of range", replace(t, g, `{"cp_rank":0,"cp_size":1,"head_count":1,"head_start":1,"interleave":1,"layers":[2,3]}`, `{"cp_rank":0,"cp_size":1,"head_count":2,"head_start":1,"interleave":1,"layers":[2,3]}`), "",
			"manifest part 3 head_start 1 + head_count 2 is more than kv_heads 2"},
		{"negative head start", replace(t, g, `{"cp_rank":0,"cp_size":1,"head_count":1,"head_start":0,"interleave":1,"layers":[2,3]}`, `{"cp_rank":0,"cp_size":1,"head_count":1,"head_start":-1,"interleave":1,"layers":[2,3]}`), "",
			"manifest part 2 head_start is -1; it must not be negative"},
		{"covered twice", replace(t, g, part1, part0), "", "manifest covers layer 0 head 0 twice: parts 0 and 1"},
		{"uncovered", replace(t, g, `"kv_heads":2`, `"kv_heads":3`), "", "manifest does not cover layer 0 head 2"},
		{"space", "{ " + g[1:], "", "manifest encoding is not canonical: it differs from the canonical encoding at byte 1"},
		{"newline", g + "\n", "", fmt.Sprintf("manifest encoding is not canonical: it differs from the canonical encoding at byte %d", len(g))},
		{"key order", replace(t, g, part1, `{"cp_size":1,"cp_rank":0,"head_count":1,"head_start":1,"interleave":1,"layers":[0,1]}`), "",
			fmt.Sprintf("manifest encoding is not canonical: it differs from the canonical encoding at byte %d", at(g, part1)+5)},
		{"escape", replace(t, g, `"PLHD"`, `"PL\u0048D"`), "",
			fmt.Sprintf("manifest encoding is not canonical: it differs from the canonical encoding at byte %d", at(g, `PLHD`)+2)},
		{"negative zero", replace(t, g, part0, `{"cp_rank":0,"cp_size":1,"head_count":1,"head_start":-0,"interleave":1,"layers":[0,1]}`), "",
			fmt.Sprintf("manifest encoding is not canonical: it differs from the canonical encoding at byte %d", at(g, part0)+53)},
		{"other domain", replace(t, g, testDomain, other), "", fmt.Sprintf("manifest belongs to model domain %s, not %s", other, testDomain)},
		{"wrong digest", g, "kv/" + testDomain + "/manifests/" + strings.Repeat("0", 64), fmt.Sprintf(
			"manifest digest %s does not match its key %q (key digest %s)", m.Digest(), "kv/"+testDomain+"/manifests/"+strings.Repeat("0", 64), strings.Repeat("0", 64))},
		{"key of other domain", g, "kv/" + other + "/manifests/" + m.Digest(), fmt.Sprintf(
			"manifest key %q is not under its model domain %s", "kv/"+other+"/manifests/"+m.Digest(), testDomain)},
		{"malformed key", g, m.Digest(), fmt.Sprintf("manifest key %q is not of the form kv/<model_domain>/manifests/<digest>", m.Digest())},
		{"draft layers 0", replace(t, g, `"descriptor":{"dtype"`, `"descriptor":{"draft_layers":0,"dtype"`), "",
			fmt.Sprintf("manifest encoding is not canonical: it differs from the canonical encoding at byte %d", at(g, `"dtype"`)+2)},
		{"draft layers after dtype", replace(t, g, `"dtype":"bf16",`, `"dtype":"bf16","draft_layers":1,`), "",
			fmt.Sprintf("manifest encoding is not canonical: it differs from the canonical encoding at byte %d", at(g, `"dtype"`)+2)},
		{"negative draft layers", replace(t, g, `"descriptor":{"dtype"`, `"descriptor":{"draft_layers":-1,"dtype"`), "",
			"manifest descriptor draft_layers is -1; it must be from 0 to its 4 layers"},
		{"too many draft layers", replace(t, g, `"descriptor":{"dtype"`, `"descriptor":{"draft_layers":5,"dtype"`), "",
			"manifest descriptor draft_layers is 5; it must be from 0 to its 4 layers"},
		{"string draft layers", replace(t, g, `"descriptor":{"dtype"`, `"descriptor":{"draft_layers":"1","dtype"`), "",
			"manifest field descriptor.draft_layers is a string; want an integer"},
		{"duplicate draft layers", replace(t, g, `"descriptor":{"dtype"`, `"descriptor":{"draft_layers":1,"draft_layers":1,"dtype"`), "",
			fmt.Sprintf("manifest has duplicate key descriptor.draft_layers at byte %d", at(g, `"dtype"`)+17)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode([]byte(tc.data), tc.key, testDomain)
			require.EqualError(t, err, tc.err)
		})
	}
	_, err := Decode([]byte(g), key, testDomain)
	require.NoError(t, err)
}

// FuzzDecode checks that Decode never panics and that whatever it accepts
// is canonical: Encode gives back the input, and decoding that again gives
// the same manifest.
func FuzzDecode(f *testing.F) {
	g := golden()
	f.Add([]byte(g))
	f.Add([]byte(strings.Replace(g, `"kv_heads":2`, `"kv_heads":3`, 1)))
	f.Add([]byte(`{"a":[1,2.5e-3,"x\u00e9\ud83d\ude00",true,false,null,{}]}`))
	for _, build := range []func() (*Manifest, error){
		func() (*Manifest, error) {
			d := Descriptor{Layers: []int{0, 1, 2}, KVHeads: 1, HeadDims: []int{64}, Dtype: "fp8", ItemSize: 1, PageSize: 16}
			return New(testDomain, d, PartLayout{Name: "xblock", Order: "C L H D/8 T D%8"}, []Part{{Layers: []int{0, 1, 2}, HeadCount: 1}})
		},
		func() (*Manifest, error) {
			d := Descriptor{Layers: []int{0, 1, 2, 3, 4, 5, 6, 7, 8}, KVHeads: 2, HeadDims: []int{64, 32}, Dtype: "fp32", ItemSize: 4, PageSize: 8}
			return New(testDomain, d, PartLayout{Name: "HPLD", Order: "C H T L D"}, []Part{
				{Layers: []int{0, 1, 2, 3}, HeadStart: 0, HeadCount: 1},
				{Layers: []int{0, 1, 2, 3}, HeadStart: 1, HeadCount: 1},
				{Layers: []int{4, 5, 6}, HeadStart: 0, HeadCount: 2},
				{Layers: []int{7, 8}, HeadStart: 0, HeadCount: 2},
			})
		},
		func() (*Manifest, error) { return cpManifest(2, 4) },
		func() (*Manifest, error) {
			// MTP: the last of the page's layers is a draft layer.
			d := Descriptor{Layers: []int{0, 1, 2, 3, 4}, KVHeads: 2, HeadDims: []int{8, 8}, Dtype: "bf16", ItemSize: 2, PageSize: 4, DraftLayers: 1}
			return New(testDomain, d, PartLayout{Name: "LPHD", Order: "C L T H D"}, []Part{
				{Layers: []int{0, 1}, HeadCount: 2},
				{Layers: []int{2, 3, 4}, HeadCount: 2},
			})
		},
	} {
		m, err := build()
		require.NoError(f, err)
		f.Add(m.Encode())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Decode(data, "", testDomain)
		if err != nil {
			require.NotEmpty(t, err.Error())
			return
		}
		require.Equal(t, data, m.Encode())
		again, err := Decode(m.Encode(), m.Key(), testDomain)
		require.NoError(t, err)
		require.Equal(t, m.Digest(), again.Digest())
		n, err := New(m.Domain, m.Descriptor, m.Layout, m.Parts)
		require.NoError(t, err)
		require.Equal(t, data, n.Encode())
		for i := range m.Parts {
			require.Positive(t, m.PartBytes(i))
		}
	})
}
