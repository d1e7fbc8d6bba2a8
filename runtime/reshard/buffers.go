package reshard

import (
	"sync"

	"github.com/kvreshard/kvreshard/runtime/store"
)

// buffers hands out the staging and trailer buffers of reads: made by Go,
// or for a store that is a store.Allocator taken from the store (memory
// registered with its engine, so that its reads land there without a
// copy). It keeps a few between reads. A buffer of a read that failed is
// given back to the store, not kept: an engine read that did not return in
// time may still write into it (store.Allocator.Free defers the unmap).
type buffers struct {
	alloc store.Allocator // nil: make

	mu   sync.Mutex
	free [][]byte
}

// keptBuffers bounds the buffers kept between reads.
const keptBuffers = 4

// get returns a buffer of at least n bytes.
func (b *buffers) get(n int) ([]byte, error) {
	b.mu.Lock()
	for i, f := range b.free {
		if len(f) >= n {
			b.free = append(b.free[:i], b.free[i+1:]...)
			b.mu.Unlock()
			return f, nil
		}
	}
	b.mu.Unlock()
	if b.alloc == nil {
		return make([]byte, n), nil
	}
	return b.alloc.Alloc(n)
}

// put gives back a buffer of get; failed says the read that used it failed.
func (b *buffers) put(buf []byte, failed bool) {
	if buf == nil {
		return
	}
	if !failed || b.alloc == nil {
		b.mu.Lock()
		if len(b.free) < keptBuffers {
			b.free = append(b.free, buf)
			b.mu.Unlock()
			return
		}
		// Keep the larger ones.
		for i, f := range b.free {
			if len(f) < len(buf) {
				b.free[i], buf = buf, f
				break
			}
		}
		b.mu.Unlock()
	}
	if b.alloc != nil {
		b.alloc.Free(buf)
	}
}
