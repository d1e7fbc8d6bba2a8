package lru

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestEvictsLeastRecentlyUsed(t *testing.T) {
	c := New[int](2)
	c.Put("a", 1)
	c.Put("b", 2)
	v, ok := c.Get("a") // a is now the most recent
	require.True(t, ok)
	require.Equal(t, 1, v)
	c.Put("c", 3) // evicts b
	_, ok = c.Get("b")
	require.False(t, ok)
	for k, want := range map[string]int{"a": 1, "c": 3} {
		v, ok := c.Get(k)
		require.True(t, ok, k)
		require.Equal(t, want, v)
	}
	c.Put("a", 10) // replaces, no eviction
	require.Equal(t, 2, c.Len())
	v, _ = c.Get("a")
	require.Equal(t, 10, v)
	require.Equal(t, 1, New[string](0).max, "a bound below one holds one entry")
}

func TestRemove(t *testing.T) {
	c := New[int](2)
	c.Put("a", 1)
	c.Put("b", 2)
	c.Remove("a")
	c.Remove("missing")
	_, ok := c.Get("a")
	require.False(t, ok)
	require.Equal(t, 1, c.Len())
	c.Put("c", 3)
	c.Put("d", 4) // evicts b, not a dropped entry's ghost
	_, ok = c.Get("b")
	require.False(t, ok)
	require.Equal(t, 2, c.Len())
}
