// Package enginetest is an in-memory object engine (enginestore.Engine) for
// tests of the store that maps pages onto an engine's objects: first
// writer wins, objects that can be evicted at will, and a record of the
// memory registered with it, so that a test can require every read to be
// into registered memory, as Mooncake's range reads must be. It is a fake for unit tests
// of the mapping; the store is tested against a real Mooncake Store too.
package enginetest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"github.com/kvreshard/kvreshard/runtime/store/enginestore"
)

// Engine is an in-memory engine. Its zero value is not usable; call New.
type Engine struct {
	// RequireRegistered makes a Read into memory that is not registered
	// an error, as Mooncake's range reads are.
	RequireRegistered bool

	mu         sync.Mutex
	objs       map[string][]byte
	registered map[uintptr]int // start: length
	calls      map[string]int
	closed     bool
	// Hook, when set, runs at the start of each call with its name
	// (Put, Get, Exists, Sizes, Read, Remove); a non-nil error fails the
	// call.
	Hook func(call string, keys []string) error
}

var _ enginestore.Engine = (*Engine)(nil)

// New returns an empty engine.
func New() *Engine {
	return &Engine{objs: map[string][]byte{}, registered: map[uintptr]int{}, calls: map[string]int{}}
}

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

func (e *Engine) enter(call string, keys []string) error {
	e.mu.Lock()
	e.calls[call]++
	closed, hook := e.closed, e.Hook
	e.mu.Unlock()
	if closed {
		return fmt.Errorf("engine is closed")
	}
	if hook != nil {
		return hook(call, keys)
	}
	return nil
}

// Calls returns how many times call was made.
func (e *Engine) Calls(call string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls[call]
}

// isRegistered reports whether b lies in registered memory; e.mu held.
func (e *Engine) isRegistered(b []byte) bool {
	if len(b) == 0 {
		return true
	}
	lo := addr(b)
	for start, n := range e.registered {
		if start <= lo && lo+uintptr(len(b)) <= start+uintptr(n) {
			return true
		}
	}
	return false
}

// Put implements enginestore.Engine.
func (e *Engine) Put(ctx context.Context, keys []string, data [][][]byte) []error {
	errs := make([]error, len(keys))
	if err := e.enter("Put", keys); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, k := range keys {
		if _, ok := e.objs[k]; ok {
			continue
		}
		var v []byte
		for _, f := range data[i] {
			v = append(v, f...)
		}
		if v == nil {
			v = []byte{}
		}
		e.objs[k] = v
	}
	return errs
}

// Get implements enginestore.Engine.
func (e *Engine) Get(ctx context.Context, keys []string, limit int) ([][]byte, error) {
	if err := e.enter("Get", keys); err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([][]byte, len(keys))
	for i, k := range keys {
		if v, ok := e.objs[k]; ok {
			if len(v) > limit {
				return nil, fmt.Errorf("get %s: %d bytes, more than %d", k, len(v), limit)
			}
			out[i] = slices.Clone(v)
			if out[i] == nil {
				out[i] = []byte{}
			}
		}
	}
	return out, nil
}

// Exists implements enginestore.Engine.
func (e *Engine) Exists(ctx context.Context, keys []string) ([]bool, error) {
	if err := e.enter("Exists", keys); err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]bool, len(keys))
	for i, k := range keys {
		_, out[i] = e.objs[k]
	}
	return out, nil
}

// Sizes implements enginestore.Engine.
func (e *Engine) Sizes(ctx context.Context, keys []string) ([]int64, error) {
	if err := e.enter("Sizes", keys); err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]int64, len(keys))
	for i, k := range keys {
		out[i] = -1
		if v, ok := e.objs[k]; ok {
			out[i] = int64(len(v))
		}
	}
	return out, nil
}

// Read implements enginestore.Engine.
func (e *Engine) Read(ctx context.Context, rs []enginestore.Range) (int, error) {
	keys := make([]string, len(rs))
	for i, r := range rs {
		keys[i] = r.Key
	}
	if err := e.enter("Read", keys); err != nil {
		return 0, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, r := range rs {
		v, ok := e.objs[r.Key]
		switch {
		case !ok:
			return i, fmt.Errorf("read %s: %w", r.Key, enginestore.ErrNotFound)
		case r.Off < 0 || r.Off+int64(len(r.Dst)) > int64(len(v)):
			return i, fmt.Errorf("read %s [%d,%d): past the end (%d bytes)", r.Key, r.Off, r.Off+int64(len(r.Dst)), len(v))
		case e.RequireRegistered && !e.isRegistered(r.Dst):
			return i, fmt.Errorf("read %s: into %d bytes of memory that is not registered", r.Key, len(r.Dst))
		}
		copy(r.Dst, v[r.Off:])
	}
	return len(rs), nil
}

// Remove implements enginestore.Engine.
func (e *Engine) Remove(ctx context.Context, keys []string) error {
	if err := e.enter("Remove", keys); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, k := range keys {
		delete(e.objs, k)
	}
	return nil
}

// Register implements enginestore.Engine.
func (e *Engine) Register(b []byte) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.registered[addr(b)] = len(b)
	return nil
}

// Unregister implements enginestore.Engine.
func (e *Engine) Unregister(b []byte) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.registered[addr(b)]; !ok {
		return fmt.Errorf("unregister: %d bytes that are not registered", len(b))
	}
	delete(e.registered, addr(b))
	return nil
}

// Registered returns the bytes of memory registered now.
func (e *Engine) Registered() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, l := range e.registered {
		n += l
	}
	return n
}

// Close implements enginestore.Engine.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	return nil
}

// Keys returns the keys of the objects that hold substring sub, sorted.
func (e *Engine) Keys(sub string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for k := range e.objs {
		if strings.Contains(k, sub) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// Evict drops the objects of keys, as an engine's eviction would.
func (e *Engine) Evict(keys ...string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, k := range keys {
		delete(e.objs, k)
	}
}

// Set replaces an object's value, as a corrupt or hostile engine would.
func (e *Engine) Set(key string, v []byte) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.objs[key] = slices.Clone(v)
}

// Value returns an object's value, nil when it is missing.
func (e *Engine) Value(key string) []byte {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.objs[key])
}
