package redisstore

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/runtime/store"
)

// TestDecodeState decodes state replies, good and bad: a bad one is that
// page's Err, never a panic or an allocation sized by the reply's numbers.
func TestDecodeState(t *testing.T) {
	o, err := decodeState("3 0 7\nkv/d/manifests/a\nb", nil)
	require.NoError(t, err)
	require.Equal(t, &store.Object{Complete: true, Manifest: "kv/d/manifests/a\nb", PartSizes: []int{3, 0, 7}}, o)

	many := strings.Repeat("1 ", store.MaxParts) + "1"
	for _, c := range []struct{ reply, shown string }{
		{"", `""`},
		{"1", `"1"`},
		{"1\n", `"1\n"`},     // no manifest
		{"\nm", `"\nm"`},     // no parts
		{"1 \nm", `"1 \nm"`}, // an empty size
		{"-1\nm", `"-1\nm"`}, // negative size
		{"1099511627777\nm", `"1099511627777\nm"`},               // past 1 TiB
		{"99999999999999999999\nm", `"99999999999999999999\nm"`}, // past int64
		{"1\n" + strings.Repeat("m", maxManifestKey+1), `"1\n` + strings.Repeat("m", 38) + `"`},
		{many + "\nm", `"` + strings.Repeat("1 ", 20) + `"`}, // MaxParts+1 parts
	} {
		o, err := decodeState(c.reply, nil)
		require.NoError(t, err)
		require.Equal(t, &store.Object{Err: o.Err}, o, "%.60q", c.reply)
		require.EqualError(t, o.Err, "unexpected state reply "+c.shown, "%.60q", c.reply)
	}

	// A reason of the state script.
	o, err = decodeState("!parts\nabc", nil)
	require.NoError(t, err)
	require.Equal(t, &store.Object{Err: o.Err}, o)
	require.EqualError(t, o.Err, `unreadable state: part count "abc" is not a number from 1 to 65536`)
	o, err = decodeState("!what\nnot known", nil)
	require.NoError(t, err)
	require.EqualError(t, o.Err, `unreadable state: "what\nnot known"`)
}
