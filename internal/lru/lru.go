// Package lru is a bounded, concurrency-safe cache that evicts the least
// recently used entry: the planner keeps its templates in one, the reader
// its manifests, the engine store the commits of pages.
package lru

import (
	"container/list"
	"sync"
)

// Cache maps string keys to values of type V, holding at most its bound.
type Cache[V any] struct {
	mu    sync.Mutex
	max   int
	order *list.List // front: most recently used
	items map[string]*list.Element
}

type entry[V any] struct {
	key string
	val V
}

// New returns a cache of at most bound entries (at least one).
func New[V any](bound int) *Cache[V] {
	return &Cache[V]{max: max(bound, 1), order: list.New(), items: map[string]*list.Element{}}
}

// Get returns the value under key and marks it used.
func (c *Cache[V]) Get(key string) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.items[key]; ok {
		c.order.MoveToFront(e)
		return e.Value.(*entry[V]).val, true
	}
	var zero V
	return zero, false
}

// Put stores val under key, evicting the least recently used entries past
// the bound.
func (c *Cache[V]) Put(key string, val V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.items[key]; ok {
		e.Value.(*entry[V]).val = val
		c.order.MoveToFront(e)
		return
	}
	c.items[key] = c.order.PushFront(&entry[V]{key, val})
	for c.order.Len() > c.max {
		e := c.order.Back()
		c.order.Remove(e)
		delete(c.items, e.Value.(*entry[V]).key)
	}
}

// Len returns the number of entries.
func (c *Cache[V]) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}

// Remove drops the entry under key, if any.
func (c *Cache[V]) Remove(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.items[key]; ok {
		c.order.Remove(e)
		delete(c.items, key)
	}
}
