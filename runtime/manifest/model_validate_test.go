package manifest_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/runtime/manifest"
)

// Two namespaces that differ only in invalid UTF-8 would share a domain
// (JSON carries U+FFFD for both), so Validate refuses them.
func TestModelValidateUTF8(t *testing.T) {
	d := manifest.Descriptor{Layers: []int{0, 1}, KVHeads: 2, HeadDims: []int{8, 8}, Dtype: "fp32", ItemSize: 4, PageSize: 4}
	a := manifest.Model{Namespace: "a\xff", Descriptor: d}
	b := manifest.Model{Namespace: "a\xfe", Descriptor: d}
	require.Equal(t, a.Domain(), b.Domain(), "the collision Validate exists for")
	require.EqualError(t, a.Validate(), `model namespace "a\xff" is not valid UTF-8`)
	for _, m := range []manifest.Model{
		{ModelID: "m\xc3", Descriptor: d},
		{Revision: "\x80", Descriptor: d},
		{Fingerprint: "rope\xff", Descriptor: d},
	} {
		require.Error(t, m.Validate())
	}
	require.EqualError(t, (&manifest.Model{ModelID: "m\xc3", Descriptor: d}).Validate(), `model model id "m\xc3" is not valid UTF-8`)
	require.NoError(t, (&manifest.Model{Namespace: "ns", ModelID: "llama-3-70b", Revision: "2", Fingerprint: "rope=1e6", Descriptor: d}).Validate())
	bad := d
	bad.KVHeads = 0
	require.EqualError(t, (&manifest.Model{Descriptor: bad}).Validate(), "descriptor kv_heads is 0; it must be positive")
}
