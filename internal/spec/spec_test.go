package spec_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/spec"
)

func good() spec.Model {
	return spec.Model{Layers: 6, KVHeads: 4, HeadDim: 8, Page: 16, Dtype: "bf16", Name: "m", Revision: "1", Namespace: "ns"}
}

func TestBuild(t *testing.T) {
	m, err := good().Build()
	require.NoError(t, err)
	require.Equal(t, []int{0, 1, 2, 3, 4, 5}, m.Descriptor.Layers)
	require.Equal(t, []int{8, 8}, m.Descriptor.HeadDims, "v_head_dim 0 is head_dim")
	require.Equal(t, 2, m.Descriptor.ItemSize)
	require.Equal(t, "m", m.ModelID)

	g := good()
	g.VHeadDim, g.DraftLayers = 4, 2
	m, err = g.Build()
	require.NoError(t, err)
	require.Equal(t, []int{8, 4}, m.Descriptor.HeadDims)
	require.Equal(t, 2, m.Descriptor.DraftLayers)

	g = good()
	g.MLA = true
	m, err = g.Build()
	require.NoError(t, err)
	require.Equal(t, []int{8}, m.Descriptor.HeadDims, "one latent")
}

func TestBuildErrors(t *testing.T) {
	for _, c := range []struct {
		edit  func(*spec.Model)
		field string
		want  string
	}{
		{func(m *spec.Model) { m.Layers = 0 }, "layers", "layers 0 is not from 1 to 4096"},
		{func(m *spec.Model) { m.Layers = 4097 }, "layers", "layers 4097 is not from 1 to 4096"},
		{func(m *spec.Model) { m.KVHeads = -1 }, "kv_heads", "kv_heads -1 must be positive"},
		{func(m *spec.Model) { m.HeadDim = 0 }, "head_dim", "head_dim 0 must be positive"},
		{func(m *spec.Model) { m.VHeadDim = -2 }, "v_head_dim", "v_head_dim -2 is negative; 0 means head_dim"},
		{func(m *spec.Model) { m.MLA, m.VHeadDim = true, 8 }, "v_head_dim", "v_head_dim 8 is not allowed: an mla model has one latent component"},
		{func(m *spec.Model) { m.Dtype = "" }, "dtype", "dtype is required (fp32, bf16, fp16 or fp8)"},
		{func(m *spec.Model) { m.Dtype = "int8" }, "dtype", `dtype "int8" is unknown; dtypes are fp32, bf16, fp16 and fp8`},
		{func(m *spec.Model) { m.Page = 0 }, "page", "page 0 must be positive"},
		{func(m *spec.Model) { m.DraftLayers = 7 }, "draft_layers", "draft_layers 7 is not from 0 to the 6 layers"},
		{func(m *spec.Model) { m.DraftLayers = -1 }, "draft_layers", "draft_layers -1 is not from 0 to the 6 layers"},
	} {
		m := good()
		c.edit(&m)
		_, err := m.Build()
		require.EqualError(t, err, c.want)
		var fe *spec.FieldError
		require.True(t, errors.As(err, &fe), c.want)
		require.Equal(t, c.field, fe.Field)
	}
	// Errors of the whole model are the manifest package's.
	m := good()
	m.Layers, m.KVHeads, m.HeadDim, m.Page = 4096, 1<<20, 1<<20, 1<<20
	_, err := m.Build()
	require.ErrorContains(t, err, "descriptor page is more than")
	var fe *spec.FieldError
	require.False(t, errors.As(err, &fe))
}

func TestPageKeys(t *testing.T) {
	ks, err := spec.PageKeys("kvreshard", "dom", [][]byte{[]byte("ab"), []byte("\xff\x01")})
	require.NoError(t, err)
	require.Equal(t, []string{"kvreshard_ab_dom", "kvreshard_\xff\x01_dom"}, ks)
	for _, c := range []struct {
		key  string
		want string
	}{
		{"", "key 1 is empty"},
		{"a\x00b", "key 1 contains a NUL byte"},
		{"a_b", `key 1 "a_b" contains '_'; a key is the page's hash, without '_'`},
	} {
		_, err := spec.PageKeys("kvreshard", "dom", [][]byte{[]byte("ok"), []byte(c.key)})
		require.EqualError(t, err, c.want)
	}
}

// FuzzBuild: no model panics the rules, and an accepted one is valid.
func FuzzBuild(f *testing.F) {
	f.Add(6, 4, 8, 0, 16, false, 0, "bf16")
	f.Add(4096, 1, 1, 0, 1, true, 4096, "fp8")
	f.Add(-1, 0, 0, -1, 0, true, -1, "")
	f.Fuzz(func(t *testing.T, layers, heads, dim, vdim, page int, mla bool, draft int, dtype string) {
		m, err := spec.Model{Layers: layers, KVHeads: heads, HeadDim: dim, VHeadDim: vdim, Page: page, MLA: mla,
			DraftLayers: draft, Dtype: dtype}.Build()
		if err != nil {
			return
		}
		require.NoError(t, m.Validate())
		require.Len(t, m.Descriptor.Layers, layers)
	})
}
