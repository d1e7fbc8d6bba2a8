// Package reshard writes KV pages from a rank's pool into a store and reads
// them back into any other rank's pool, whatever the writer's and the
// reader's TP, PP and memory layouts.
//
// A Writer publishes its topology's manifest, then for each batch of
// pages skips the complete ones and writes its own part of the others
// straight from its pool (fragments, no gather copy), followed by its
// checksums (package partsum), bound to the page key, manifest key and part
// number; before it reports a page stored it stores the manifest again, in
// case the store lost it (evicted). A Reader finds the leading run of
// complete pages (querying in batches), validates their manifests, plans
// each layout once (templates) and reads exactly the bytes its rank needs
// straight into its pool, reporting only the pages it read in full. With ReaderOptions.CheckParts
// it checks every byte it copies into the pool against its part's
// checksums first.
package reshard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/partsum"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/store"
)

// Status is what happened to one page of a write.
type Status uint8

const (
	Written  Status = iota // this rank's part was written
	Complete               // the page was already complete: skipped, stored layout kept
	Refused                // the page is being written in another layout
	Replica                // this rank holds a replica; another rank writes the part
	Failed                 // the write failed; see the error
)

func (s Status) String() string {
	return [...]string{"written", "complete", "refused", "replica", "failed"}[s]
}

// PageResult is the outcome of writing one page.
type PageResult struct {
	Key    string
	Status Status
	Err    error
}

// Writer writes one rank's part of pages. It is safe for concurrent use.
type Writer struct {
	st     store.Store
	man    *manifest.Manifest
	enc    []byte // man.Encode(), which Write stores again
	plan   *plan.WritePlan
	writes bool

	requests, pages, bytes atomic.Int64
	status                 [Failed + 1]atomic.Int64 // pages by status
}

// WriterStats are a writer's counters.
type WriterStats struct {
	Requests int64 // Write calls with valid arguments
	Pages    int64 // pages of those calls
	// Pages by status; a batch whose query failed counts as Failed.
	Written, Complete, Refused, Replica, Failed int64
	Bytes                                       int64 // bytes of the parts written, from the pool (their checksums not counted)
}

// Stats returns the writer's counters.
func (w *Writer) Stats() WriterStats {
	return WriterStats{
		Requests: w.requests.Load(), Pages: w.pages.Load(),
		Written: w.status[Written].Load(), Complete: w.status[Complete].Load(), Refused: w.status[Refused].Load(),
		Replica: w.status[Replica].Load(), Failed: w.status[Failed].Load(), Bytes: w.bytes.Load(),
	}
}

// NewWriter returns a writer of part `part` of manifest m, from a pool
// bound as b. When writes is false the rank holds a replica of a part that
// another rank writes, and Write reports every page as Replica.
func NewWriter(st store.Store, m *manifest.Manifest, part int, writes bool, b plan.Binding) (*Writer, error) {
	wp, err := plan.NewWritePlan(m, part, b, false)
	if err != nil {
		return nil, err
	}
	return &Writer{st: st, man: m, enc: m.Encode(), plan: wp, writes: writes}, nil
}

// Geometry returns the writer's pool geometry.
func (w *Writer) Geometry() *plan.Geometry { return w.plan.Geometry() }

// Publish stores the manifest as a pinned metadata object, reads it back
// and compares: a store that returns other bytes is an error.
func (w *Writer) Publish(ctx context.Context) error {
	return Publish(ctx, w.st, w.man)
}

// Publish stores manifest m in st and checks it reads back unchanged.
func Publish(ctx context.Context, st store.Store, m *manifest.Manifest) error {
	enc := m.Encode()
	if err := st.PutMeta(ctx, m.Key(), enc); err != nil {
		return fmt.Errorf("publish manifest %s: %w", m.Key(), err)
	}
	back, err := st.GetMeta(ctx, m.Key())
	if err != nil {
		return fmt.Errorf("read back manifest %s: %w", m.Key(), err)
	}
	if !bytes.Equal(back, enc) {
		return fmt.Errorf("manifest %s reads back as other bytes", m.Key())
	}
	return nil
}

// Write writes this rank's part of the pages keys[i], held at slots[i] of
// the pool regions. It checks existence first and skips complete pages.
// Each part is written with its checksums (partsum.Trailer), computed over
// the fragments in the pool, after its bytes. The error is for the batch as a whole
// (bad arguments, or the query failed); page failures are in the results.
//
// A store may lose the manifest after Publish (Redis evicts it under an
// allkeys-* maxmemory policy; an operator deletes it), and then no new
// reader can read a page of the layout: it is a miss. So before Write
// reports a page Written, or Complete where the store may hold it under
// this writer's manifest (the query says so, or a part write found the
// page completed since the query, by a layout it does not name), it stores
// the manifest again with one PutMeta, after the part writes: a no-op when
// the manifest is there, and when it was lost, every page of the layout,
// old and new, reads again. That costs one PutMeta a call that has such
// pages (none for a batch that is all Refused, Failed, Replica or
// Complete under other manifests): a round trip on Redis (a GET and a
// compare on the server, a SET only when it is missing), an lstat and a
// read of the manifest's file on the file store, a map look-up in memory. PutMeta
// compares with the stored bytes itself, so Write does not read them back
// as Publish does. When it fails, those pages are Failed with its error
// (publish manifest <key>: ...): their parts are stored, but no reader may
// be able to use them.
func (w *Writer) Write(ctx context.Context, keys []string, slots []int, regions [][]byte) ([]PageResult, error) {
	if len(slots) != len(keys) {
		return nil, fmt.Errorf("%d keys but %d slots", len(keys), len(slots))
	}
	g := w.plan.Geometry()
	if err := g.CheckRegions(regions); err != nil {
		return nil, err
	}
	res := make([]PageResult, len(keys))
	for i, k := range keys {
		res[i].Key = k
		if s := slots[i]; s < 0 || s >= g.Slots {
			return nil, fmt.Errorf("slot %d of page %d is outside the pool's %d slots", s, i, g.Slots)
		}
	}
	w.requests.Add(1)
	w.pages.Add(int64(len(keys)))
	if !w.writes {
		for i := range res {
			res[i].Status = Replica
		}
		w.status[Replica].Add(int64(len(keys)))
		return res, nil
	}
	objs, err := query(ctx, w.st, keys)
	if err != nil {
		w.status[Failed].Add(int64(len(keys)))
		return nil, err
	}
	defer func() {
		for _, r := range res {
			w.status[r.Status].Add(1)
		}
	}()
	var ws []store.PartWrite
	var idx []int
	// ours marks the pages whose status depends on the manifest being
	// stored: Written, or Complete perhaps under this writer's manifest.
	ours := make([]bool, len(keys))
	for i, o := range objs {
		if o.Complete {
			res[i].Status = Complete
			ours[i] = o.Manifest == w.man.Key()
			continue
		}
		data := w.plan.Data(regions, slots[i], nil)
		data = append(data, partsum.Trailer(keys[i], w.man.Key(), w.plan.Part, data))
		ws = append(ws, store.PartWrite{
			Key:      keys[i],
			Part:     w.plan.Part,
			Parts:    len(w.man.Parts),
			Manifest: w.man.Key(),
			Data:     data,
		})
		idx = append(idx, i)
	}
	if len(ws) > 0 {
		for j, err := range w.st.WriteParts(ctx, ws) {
			i := idx[j]
			r := &res[i]
			switch {
			case err == nil:
				r.Status, ours[i] = Written, true
			case errors.Is(err, store.ErrComplete):
				// Completed since the query, perhaps by a writer of
				// this layout: its manifest is not known.
				r.Status, ours[i] = Complete, true
			case errors.Is(err, store.ErrLayoutConflict):
				r.Status, r.Err = Refused, err
			default:
				r.Status, r.Err = Failed, err
			}
		}
	}
	w.republish(ctx, res, ours)
	for _, r := range res {
		if r.Status == Written {
			w.bytes.Add(int64(w.man.PartBytes(w.plan.Part)))
		}
	}
	return res, nil
}

// republish stores the manifest again when any page marked in ours is to be
// reported, and fails those pages when it cannot (see Write).
func (w *Writer) republish(ctx context.Context, res []PageResult, ours []bool) {
	need := false
	for i := range res {
		need = need || ours[i]
	}
	if !need {
		return
	}
	err := w.st.PutMeta(ctx, w.man.Key(), w.enc)
	if err == nil {
		return
	}
	err = fmt.Errorf("publish manifest %s: %w", w.man.Key(), err)
	for i := range res {
		if ours[i] {
			res[i].Status, res[i].Err = Failed, err
		}
	}
}
