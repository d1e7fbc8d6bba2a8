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
	o, err := decodeState("3 0 7\n0000000000000001 ffffffffffffffff 0000000000000000\nkv/d/manifests/a\nb", nil)
	require.NoError(t, err)
	require.Equal(t, &store.Object{Complete: true, Manifest: "kv/d/manifests/a\nb", PartSizes: []int{3, 0, 7},
		Checksums: []uint64{1, 1<<64 - 1, 0}}, o)

	many := strings.Repeat("1 ", store.MaxParts) + "1"
	manySums := strings.Repeat("0000000000000000 ", store.MaxParts) + "0000000000000000"
	for _, c := range []struct{ reply, shown string }{
		{"", `""`},
		{"1", `"1"`},
		{"1\n0000000000000000", `"1\n0000000000000000"`},
		{"1\n0000000000000000\n", `"1\n0000000000000000\n"`},                                         // no manifest
		{"\n\nm", `"\n\nm"`},                                                                         // no parts
		{"1 2\n0000000000000000\nm", `"1 2\n0000000000000000\nm"`},                                   // counts differ
		{"-1\n0000000000000000\nm", `"-1\n0000000000000000\nm"`},                                     // negative size
		{"1099511627777\n0000000000000000\nm", `"1099511627777\n0000000000000000\nm"`},               // past 1 TiB
		{"99999999999999999999\n0000000000000000\nm", `"99999999999999999999\n0000000000000000\nm"`}, // past int64
		{"1\n000000000000000\nm", `"1\n000000000000000\nm"`},                                         // 15 digits
		{"1\n+000000000000000\nm", `"1\n+000000000000000\nm"`},                                       // a sign
		{"1\n00000000000000000\nm", `"1\n00000000000000000\nm"`},                                     // 17 digits
		{"1\nzzzzzzzzzzzzzzzz\nm", `"1\nzzzzzzzzzzzzzzzz\nm"`},                                       // not hex
		{"1\n0000000000000000\n" + strings.Repeat("m", maxManifestKey+1), `"1\n0000000000000000\nmmmmmmmmmmmmmmmmmmmmm"`},
		{many + "\n" + manySums + "\nm", `"` + strings.Repeat("1 ", 20) + `"`}, // MaxParts+1 parts
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
