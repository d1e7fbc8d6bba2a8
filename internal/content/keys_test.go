package content_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/runtime/manifest"
)

func TestPageKeys(t *testing.T) {
	const domain = "d0d0"
	keys := content.PageKeys("my_prefix", domain, 3)
	require.Equal(t, []string{
		"my_prefix_0000000000000000_d0d0",
		"my_prefix_9e3779b97f4a7c15_d0d0",
		"my_prefix_3c6ef372fe94f82a_d0d0",
	}, keys)
	for _, k := range keys {
		prefix, _, d, ok := manifest.SplitPageKey(k)
		require.True(t, ok)
		require.Equal(t, "my_prefix", prefix)
		require.Equal(t, domain, d)
	}
	require.Empty(t, content.PageKeys("p", domain, 0))
}
