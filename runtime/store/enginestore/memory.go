package enginestore

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// memory is what a store knows of the memory registered with its engine:
// the callers' (Register), and its own mappings (Alloc, and the bounce
// buffers of reads into memory it may not read into).
type memory struct {
	e       Engine
	timeout time.Duration // Options.ReadTimeout

	mu     sync.Mutex
	spans  []span             // registered, sorted by start
	owned  map[uintptr]*owned // the store's own mappings, by start
	bounce [][]byte           // free bounce buffers
	closed bool
}

// span is registered memory [lo, hi).
type span struct{ lo, hi uintptr }

// owned is a mapping of the store's: busy counts the engine reads in
// flight into it; freed says it is to be unmapped once none is.
type owned struct {
	b     []byte
	busy  int
	freed bool
}

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// bounceBytes is the size of a bounce buffer: a read into memory that the
// store may not read into goes through one, bounceBytes at a time.
const bounceBytes = 4 << 20

// Register implements store.Registrar.
func (s *Store) Register(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if err := s.e.Register(b); err != nil {
		return fmt.Errorf("%s: register %d bytes: %w", s.name, len(b), err)
	}
	s.mem.add(b)
	return nil
}

// Unregister implements store.Registrar.
func (s *Store) Unregister(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	s.mem.remove(b)
	if err := s.e.Unregister(b); err != nil {
		return fmt.Errorf("%s: unregister %d bytes: %w", s.name, len(b), err)
	}
	return nil
}

// Alloc implements store.Allocator: n bytes mapped by the store (zeroed)
// and registered with the engine.
func (s *Store) Alloc(n int) ([]byte, error) {
	b, err := s.mem.alloc(n)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.name, err)
	}
	return b, nil
}

// Free implements store.Allocator. Memory that an engine read that did not
// return in time may still write into is unmapped once that read returns.
func (s *Store) Free(b []byte) { s.mem.free(b) }

func cmpLo(s span, lo uintptr) int {
	switch {
	case s.lo < lo:
		return -1
	case s.lo > lo:
		return 1
	}
	return 0
}

func (m *memory) add(b []byte) {
	lo := addr(b)
	m.mu.Lock()
	defer m.mu.Unlock()
	i, _ := slices.BinarySearchFunc(m.spans, lo, cmpLo)
	m.spans = slices.Insert(m.spans, i, span{lo, lo + uintptr(len(b))})
}

func (m *memory) remove(b []byte) {
	lo, hi := addr(b), addr(b)+uintptr(len(b))
	m.mu.Lock()
	defer m.mu.Unlock()
	m.spans = slices.DeleteFunc(m.spans, func(s span) bool { return s.lo == lo && s.hi == hi })
}

// where says what memory b lies in: registered by a caller, one of the
// store's own mappings (o set), or neither. m.mu held.
func (m *memory) where(b []byte) (registered bool, o *owned) {
	if len(b) == 0 {
		return true, nil
	}
	lo, hi := addr(b), addr(b)+uintptr(len(b))
	i, found := slices.BinarySearchFunc(m.spans, lo, cmpLo)
	if !found {
		i--
	}
	if i < 0 || m.spans[i].lo > lo || hi > m.spans[i].hi {
		return false, nil
	}
	return true, m.owned[m.spans[i].lo]
}

// alloc maps n bytes and registers them.
func (m *memory) alloc(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("alloc %d bytes", n)
	}
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	if closed {
		return nil, errClosed
	}
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("map %d bytes: %w", n, err)
	}
	if err := m.e.Register(b); err != nil {
		unix.Munmap(b)
		return nil, fmt.Errorf("register %d bytes: %w", n, err)
	}
	m.add(b)
	m.mu.Lock()
	if m.owned == nil {
		m.owned = map[uintptr]*owned{}
	}
	m.owned[addr(b)] = &owned{b: b}
	m.mu.Unlock()
	return b, nil
}

// free unregisters and unmaps a mapping of alloc, or, while an engine
// read into it is in flight, marks it to be once the read returns.
func (m *memory) free(b []byte) {
	if len(b) == 0 {
		return
	}
	m.mu.Lock()
	o := m.owned[addr(b)]
	if o == nil || o.freed {
		m.mu.Unlock()
		return
	}
	o.freed = true
	busy := o.busy > 0
	if !busy {
		delete(m.owned, addr(b))
	}
	m.mu.Unlock()
	if !busy {
		m.unmap(o.b)
	}
}

func (m *memory) unmap(b []byte) {
	m.remove(b)
	m.e.Unregister(b)
	unix.Munmap(b)
}

// close frees every mapping of the store's that no read is in flight into.
func (m *memory) close() {
	m.mu.Lock()
	m.closed = true
	var free [][]byte
	for lo, o := range m.owned {
		o.freed = true
		if o.busy == 0 {
			free = append(free, o.b)
			delete(m.owned, lo)
		}
	}
	m.bounce = nil
	m.mu.Unlock()
	for _, b := range free {
		m.unmap(b)
	}
}

// getBounce returns a bounce buffer, mapping one if none is free.
func (m *memory) getBounce() ([]byte, error) {
	m.mu.Lock()
	if n := len(m.bounce); n > 0 {
		b := m.bounce[n-1]
		m.bounce = m.bounce[:n-1]
		m.mu.Unlock()
		return b, nil
	}
	m.mu.Unlock()
	return m.alloc(bounceBytes)
}

// putBounce keeps a bounce buffer for the next read, or frees it: when
// there are enough, or when a read that did not return in time may still
// write into it.
func (m *memory) putBounce(b []byte) {
	m.mu.Lock()
	if o := m.owned[addr(b)]; !m.closed && len(m.bounce) < 4 && o != nil && o.busy == 0 {
		m.bounce = append(m.bounce, b)
		m.mu.Unlock()
		return
	}
	m.mu.Unlock()
	m.free(b)
}

// read reads rs with e and returns the leading ranges read in full and why
// the next was not. A range into memory the store may not read into goes
// through bounce buffers: memory that is not registered, and with a read
// timeout memory that is not the store's own (a caller's pool), since a
// read that did not return in time may still write into its memory later.
func (m *memory) read(ctx context.Context, e Engine, rs []Range) (int, error) {
	if len(rs) == 0 {
		return 0, nil
	}
	direct := func(b []byte) bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		registered, o := m.where(b)
		return registered && (m.timeout == 0 || o != nil || len(b) == 0)
	}
	all := true
	for _, r := range rs {
		if !direct(r.Dst) {
			all = false
			break
		}
	}
	if all {
		return m.call(ctx, e, rs)
	}
	// The others are split into pieces of at most a bounce buffer, read in
	// rounds of a buffer each, and copied out.
	type piece struct {
		r   int    // the range of rs
		dst []byte // where the bounced bytes go; nil: read in place
	}
	var batch []Range
	var pieces []piece
	var b []byte
	done := 0 // ranges of rs read in full
	flush := func() error {
		n, err := m.call(ctx, e, batch)
		if n == len(batch) {
			for k, p := range pieces {
				if p.dst != nil {
					copy(p.dst, batch[k].Dst)
				}
			}
			batch, pieces = batch[:0], pieces[:0]
			return nil
		}
		// The ranges before the failed piece's were read in full: copy
		// what they bounced.
		done = pieces[n].r
		for k, p := range pieces[:n] {
			if p.dst != nil && p.r < done {
				copy(p.dst, batch[k].Dst)
			}
		}
		if err == nil {
			err = fmt.Errorf("engine read %d of %d ranges", n, len(batch))
		}
		return err
	}
	defer func() {
		if b != nil {
			m.putBounce(b)
		}
	}()
	used := 0
	for i, r := range rs {
		if direct(r.Dst) {
			batch = append(batch, r)
			pieces = append(pieces, piece{r: i})
			continue
		}
		for at := 0; at < len(r.Dst); {
			if b == nil {
				var err error
				if b, err = m.getBounce(); err != nil {
					return done, err
				}
			}
			if used == len(b) {
				if err := flush(); err != nil {
					return done, err
				}
				used = 0
			}
			n := min(len(r.Dst)-at, len(b)-used)
			batch = append(batch, Range{Key: r.Key, Off: r.Off + int64(at), Dst: b[used : used+n], Whole: r.Whole && n == len(r.Dst)})
			pieces = append(pieces, piece{r: i, dst: r.Dst[at : at+n]})
			used += n
			at += n
		}
	}
	if err := flush(); err != nil {
		return done, err
	}
	return len(rs), nil
}

// call runs one engine read of rs, whose memory is registered. With a
// read timeout, it runs it on a goroutine and waits for it at most the
// timeout: when it does not return in time, call returns an error, and the
// store's mappings the read writes into stay mapped until it returns (they
// are busy: a bounce buffer is not reused, a freed mapping is unmapped
// only then).
func (m *memory) call(ctx context.Context, e Engine, rs []Range) (int, error) {
	if m.timeout == 0 {
		return e.Read(ctx, rs)
	}
	m.mu.Lock()
	var busy []*owned
	for _, r := range rs {
		if _, o := m.where(r.Dst); o != nil && !slices.Contains(busy, o) {
			o.busy++
			busy = append(busy, o)
		}
	}
	m.mu.Unlock()
	type result struct {
		n   int
		err error
	}
	out := make(chan result, 1)
	go func() {
		n, err := e.Read(ctx, rs)
		out <- result{n, err}
		var free [][]byte
		m.mu.Lock()
		for _, o := range busy {
			if o.busy--; o.busy == 0 && o.freed {
				delete(m.owned, addr(o.b))
				free = append(free, o.b)
			}
		}
		m.mu.Unlock()
		for _, b := range free {
			m.unmap(b)
		}
	}()
	t := time.NewTimer(m.timeout)
	defer t.Stop()
	select {
	case r := <-out:
		return r.n, r.err
	case <-t.C:
		return 0, fmt.Errorf("the engine's read of %d ranges did not return within %v", len(rs), m.timeout)
	}
}
