package reshard_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/partsum"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/reshard"
	"github.com/kvreshard/kvreshard/runtime/store"
)

// The tests in this file take the rows of the error table of docs/design.md
// section 7 in order. "Writer process gone" is tests/ (real processes).

func statuses(n int, s reshard.Status) []reshard.Status {
	out := make([]reshard.Status, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// query queries keys.
func query(t testing.TB, st store.Store, keys []string) []store.Object {
	t.Helper()
	objs, err := st.Query(context.Background(), keys)
	require.NoError(t, err)
	require.Len(t, objs, len(keys))
	return objs
}

// stored is the query result of a page complete in manifest m.
func stored(m *manifest.Manifest) store.Object {
	o := store.Object{Complete: true, Manifest: m.Key()}
	for i := range m.Parts {
		o.PartSizes = append(o.PartSizes, partsum.Size(m.PartBytes(i)))
	}
	return o
}

// Row 1: page already complete -> skip the write, keep the stored layout.
func TestCompletePageKeepsStoredLayout(t *testing.T) {
	forEachStore(t, func(t *testing.T, st store.Store) {
		keys := content.PageKeys("complete", small.Domain(), 3)
		first := writeAll(t, st, small, tp2pp2, "PLHD", keys)

		// A writer of another topology and layout finds every page complete.
		second := manifestOf(t, small, tp1pp3, builtin(t, "LPHD"))
		got := writeRanks(t, st, second, tp1pp3, tp1pp3.Ranks(), "layer_first", keys)
		require.Len(t, got, 3)
		for r, ss := range got {
			require.Equal(t, statuses(3, reshard.Complete), ss, "rank %v", r)
		}
		// So does the first writer again.
		got = writeRanks(t, st, first, tp2pp2, tp2pp2.Ranks(), "page_first", keys)
		for r, ss := range got {
			require.Equal(t, statuses(3, reshard.Complete), ss, "rank %v", r)
		}
		for i, o := range query(t, st, keys) {
			require.Equal(t, stored(first), o, "page %d", i)
		}

		// Readers of the second writer's topology read the first layout.
		for _, r := range tp1pp3.Ranks() {
			rd, regions := newReader(t, st, small, tp1pp3, r, "page_head", 4, reshard.ReaderOptions{})
			before := clone(regions)
			slots := []int{2, 0, 3}
			res, err := rd.Read(context.Background(), keys, slots, regions)
			require.NoError(t, err)
			require.NoError(t, res.Stop)
			tpl, err := rd.Planner().Template(first)
			require.NoError(t, err)
			require.Equal(t, first.ID(), tpl.ManifestID)
			require.Equal(t, reshard.Result{Hit: 3, Bytes: 3 * rd.Geometry().PageBytes, Ops: 3 * len(tpl.Ops)}, res)
			checkPool(t, rd.Geometry(), before, regions, keys, slots, 3)
		}
	})
}

// A page being written in one layout refuses writers of another: nothing of
// theirs is written, and the first layout completes it.
func TestIncompletePageRefusesOtherLayout(t *testing.T) {
	forEachStore(t, func(t *testing.T, st store.Store) {
		keys := content.PageKeys("refused", small.Domain(), 2)
		first := manifestOf(t, small, tp2pp2, builtin(t, "PLHD"))
		got := writeRanks(t, st, first, tp2pp2, []placement.Rank{{TP: 1, PP: 0}}, "page_first", keys[:1])
		require.Equal(t, []reshard.Status{reshard.Written}, got[placement.Rank{TP: 1, PP: 0}])

		second := manifestOf(t, small, tp1pp3, builtin(t, "HPLD"))
		for _, r := range tp1pp3.Ranks() {
			part, _, err := tp1pp3.Writer(&second.Descriptor, r)
			require.NoError(t, err)
			b, err := plan.BindingFor(&small.Descriptor, tp1pp3, r, builtin(t, "page_head"), 2)
			require.NoError(t, err)
			w, err := reshard.NewWriter(st, second, part, true, b)
			require.NoError(t, err)
			require.NoError(t, w.Publish(context.Background()))
			regions := w.Geometry().NewRegions()
			for i, k := range keys {
				content.Fill(w.Geometry(), regions, i, content.Seed(k))
			}
			res, err := w.Write(context.Background(), keys, []int{0, 1}, regions)
			require.NoError(t, err)
			require.Equal(t, reshard.Refused, res[0].Status, "rank %v", r)
			require.ErrorIs(t, res[0].Err, store.ErrLayoutConflict)
			require.Equal(t, reshard.Written, res[1].Status, "rank %v", r)
			require.NoError(t, res[1].Err)
		}
		require.Equal(t, []store.Object{{}, stored(second)}, query(t, st, keys))

		got = writeRanks(t, st, first, tp2pp2, tp2pp2.Ranks(), "page_first", keys[:1])
		require.Len(t, got, 4)
		for r, ss := range got {
			require.Equal(t, []reshard.Status{reshard.Written}, ss, "rank %v", r)
		}
		require.Equal(t, []store.Object{stored(first), stored(second)}, query(t, st, keys))

		// One request reads both layouts.
		rd, regions := newReader(t, st, small, tp4pp1, placement.Rank{TP: 3}, "page_first_direct", 2, reshard.ReaderOptions{})
		before := clone(regions)
		res, err := rd.Read(context.Background(), keys, []int{1, 0}, regions)
		require.NoError(t, err)
		require.NoError(t, res.Stop)
		require.Equal(t, 2, res.Hit)
		checkPool(t, rd.Geometry(), before, regions, keys, []int{1, 0}, 2)
	})
}

// Row 2: page missing or incomplete -> cache miss; never consume partial
// data. A page with one part written is a miss, nothing of it is read, no
// byte of its slot changes, and a complete page after it is not counted.
func TestIncompletePageIsMiss(t *testing.T) {
	forEachStore(t, func(t *testing.T, st store.Store) {
		keys := content.PageKeys("miss", small.Domain(), 4) // complete, one part, complete, missing
		m := writeAll(t, st, small, tp2pp2, "PLHD", []string{keys[0], keys[2]})
		got := writeRanks(t, st, m, tp2pp2, []placement.Rank{{TP: 1, PP: 1}}, "page_first", keys[1:2])
		require.Equal(t, []reshard.Status{reshard.Written}, got[placement.Rank{TP: 1, PP: 1}])
		require.Equal(t, []store.Object{stored(m), {}, stored(m), {}}, query(t, st, keys))

		for _, r := range tp1pp3.Ranks() {
			sp := newSpy(st)
			rd, regions := newReader(t, sp, small, tp1pp3, r, "page_first", 4, reshard.ReaderOptions{})
			g := rd.Geometry()
			tpl, err := rd.Planner().Template(m)
			require.NoError(t, err)
			ops := len(tpl.Ops)

			before := clone(regions)
			slots := []int{3, 0, 2, 1}
			res, err := rd.Read(context.Background(), keys, slots, regions)
			require.NoError(t, err)
			require.EqualError(t, res.Stop, "page missing or incomplete: "+keys[1])
			require.ErrorIs(t, res.Stop, reshard.ErrMiss)
			require.Equal(t, 1, res.Hit)
			require.Equal(t, g.PageBytes, res.Bytes)
			require.Equal(t, ops, res.Ops)
			require.Equal(t, ops, sp.rangesRead, "only the ranges of the first page are read")
			checkPool(t, g, before, regions, keys, slots, 1)

			// The page after the miss was complete, and only a request
			// that starts with it reads it.
			before = clone(regions)
			res, err = rd.Read(context.Background(), keys[2:3], []int{2}, regions)
			require.NoError(t, err)
			require.Equal(t, reshard.Result{Hit: 1, Bytes: g.PageBytes, Ops: ops}, res)
			checkPool(t, g, before, regions, keys[2:3], []int{2}, 1)

			// A missing first page: nothing read at all.
			before = clone(regions)
			res, err = rd.Read(context.Background(), []string{keys[3], keys[0]}, []int{1, 3}, regions)
			require.NoError(t, err)
			require.EqualError(t, res.Stop, "page missing or incomplete: "+keys[3])
			require.Equal(t, 0, res.Hit)
			require.Equal(t, 2, sp.Calls("ReadRanges"))
			checkPool(t, g, before, regions, nil, nil, 0)

			require.Equal(t, reshard.Stats{Requests: 3, Pages: 7, Hits: 2, Misses: 5, Bytes: int64(2 * g.PageBytes), Ops: int64(2 * ops)}, rd.Stats())
		}
	})
}

// writeObject writes every part of key directly, with the given manifest
// key and part sizes, and no manifest check.
func writeObject(t testing.TB, st store.Store, key, manifestKey string, sizes []int) {
	t.Helper()
	var ws []store.PartWrite
	for i, n := range sizes {
		ws = append(ws, store.PartWrite{Key: key, Part: i, Parts: len(sizes), Manifest: manifestKey, Data: [][]byte{bytes.Repeat([]byte{0x11}, n)}})
	}
	for _, err := range st.WriteParts(context.Background(), ws) {
		require.NoError(t, err)
	}
}

func partSizes(m *manifest.Manifest) []int { return stored(m).PartSizes }

// Row 3: manifest missing, corrupt, or of another model domain -> reject,
// clear error, fall back to miss.
func TestManifestRejected(t *testing.T) {
	domain := small.Domain()
	good := manifestOf(t, small, tp2pp2, builtin(t, "PLHD"))
	other := newModel("other", 6, 4, []int{16, 8}, "bf16", 8)
	foreign := manifestOf(t, other, tp2pp2, builtin(t, "PLHD"))
	zeros := "kv/" + domain + "/manifests/" + strings.Repeat("0", 64)
	enc := good.Encode()

	cases := []struct {
		name     string
		setup    func(t *testing.T, st store.Store, key string) // writes the bad page
		manifest string                                         // its manifest key
		err      string                                         // after "page <key>: manifest rejected: <manifest key>: "
	}{{
		name:     "garbage",
		manifest: zeros,
		setup: func(t *testing.T, st store.Store, key string) {
			require.NoError(t, st.PutMeta(context.Background(), zeros, []byte("\x00garbage")))
			writeObject(t, st, key, zeros, partSizes(good))
		},
		err: "manifest is not valid json: unexpected byte 0x00; want a value at byte 0",
	}, {
		name:     "truncated",
		manifest: zeros,
		setup: func(t *testing.T, st store.Store, key string) {
			require.NoError(t, st.PutMeta(context.Background(), zeros, enc[:len(enc)-1]))
			writeObject(t, st, key, zeros, partSizes(good))
		},
		err: fmt.Sprintf("manifest is not valid json: unexpected end of input; want ',' or '}' at byte %d", len(enc)-1),
	}, {
		name:     "not its key",
		manifest: zeros,
		setup: func(t *testing.T, st store.Store, key string) {
			require.NoError(t, st.PutMeta(context.Background(), zeros, enc))
			writeObject(t, st, key, zeros, partSizes(good))
		},
		err: fmt.Sprintf("manifest digest %s does not match its key %q (key digest %s)", good.Digest(), zeros, strings.Repeat("0", 64)),
	}, {
		name:     "other model domain",
		manifest: foreign.Key(),
		setup: func(t *testing.T, st store.Store, key string) {
			require.NoError(t, reshard.Publish(context.Background(), st, foreign))
			writeObject(t, st, key, foreign.Key(), partSizes(foreign))
		},
		err: fmt.Sprintf("manifest belongs to model domain %s, not %s", other.Domain(), domain),
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			forEachStore(t, func(t *testing.T, st store.Store) {
				keys := content.PageKeys("manifest", domain, 3)
				writeAll(t, st, small, tp2pp2, "PLHD", []string{keys[0], keys[2]})
				c.setup(t, st, keys[1])
				require.Equal(t, store.Object{Complete: true, Manifest: c.manifest, PartSizes: query(t, st, keys[1:2])[0].PartSizes}, query(t, st, keys[1:2])[0])

				sp := newSpy(st)
				rd, regions := newReader(t, sp, small, tp1pp3, placement.Rank{PP: 1}, "layer_first", 3, reshard.ReaderOptions{})
				g := rd.Geometry()
				tpl, err := rd.Planner().Template(good)
				require.NoError(t, err)
				want := fmt.Sprintf("page %s: manifest rejected: %s: %s", keys[1], c.manifest, c.err)
				for n := 1; n <= 2; n++ {
					before := clone(regions)
					res, err := rd.Read(context.Background(), keys, []int{1, 2, 0}, regions)
					require.NoError(t, err)
					require.EqualError(t, res.Stop, want)
					require.ErrorIs(t, res.Stop, reshard.ErrManifest)
					require.Equal(t, reshard.Result{Hit: 1, Bytes: g.PageBytes, Ops: len(tpl.Ops), Stop: res.Stop}, res)
					require.Equal(t, n*len(tpl.Ops), sp.rangesRead)
					checkPool(t, g, before, regions, keys, []int{1, 2, 0}, 1)
					// A rejected manifest is not cached: each read fetches
					// it again (the good one is cached).
					require.Equal(t, 1+n, sp.Calls("GetMeta"))
					require.Equal(t, reshard.Stats{Requests: int64(n), Pages: int64(3 * n), Hits: int64(n), Misses: int64(2 * n),
						Bytes: int64(n * g.PageBytes), Ops: int64(n * len(tpl.Ops)), ManifestsRejected: int64(n)}, rd.Stats())
				}
			})
		})
	}
}

// An object whose parts do not match its manifest (a part cut short or
// grown) is damaged: the read stops there as for a failed checksum, and the
// reader counts a checksum error, not a rejected manifest.
func TestObjectDoesNotMatchManifest(t *testing.T) {
	m := manifestOf(t, small, tp2pp2, builtin(t, "PLHD"))
	sizes := partSizes(m)
	cases := []struct {
		name  string
		sizes []int
		err   string
	}{
		{"part count", sizes[:2], fmt.Sprintf("object has 2 parts; manifest %s has 4: part checksum mismatch", m.ID())},
		{"part size", []int{sizes[0], sizes[1], sizes[2] - 2, sizes[3]}, fmt.Sprintf("object part 2 has %d bytes; manifest %s says %d, with its checksums: part checksum mismatch", sizes[2]-2, m.ID(), sizes[2])},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			forEachStore(t, func(t *testing.T, st store.Store) {
				keys := content.PageKeys("object", small.Domain(), 2)
				writeAll(t, st, small, tp2pp2, "PLHD", keys[:1])
				writeObject(t, st, keys[1], m.Key(), c.sizes)
				rd, regions := newReader(t, st, small, tp2pp2, placement.Rank{TP: 1, PP: 1}, "page_head", 2, reshard.ReaderOptions{})
				before := clone(regions)
				res, err := rd.Read(context.Background(), keys, []int{0, 1}, regions)
				require.NoError(t, err)
				require.EqualError(t, res.Stop, fmt.Sprintf("page %s: %s", keys[1], c.err))
				require.Equal(t, 1, res.Hit)
				require.Equal(t, reshard.StopChecksum, reshard.Classify(res.Stop))
				checkPool(t, rd.Geometry(), before, regions, keys, []int{0, 1}, 1)
				require.Zero(t, rd.Stats().ManifestsRejected)
				require.Equal(t, int64(1), rd.Stats().ChecksumErrors)
			})
		})
	}
}

// Row 4: target ranges out of bounds, overlapping, or not covering -> reject
// before any transfer. Slots are checked before the store is asked anything;
// plans over their limits or for another page geometry before any read.
func TestBadTargetRejectedBeforeTransfer(t *testing.T) {
	forEachStore(t, func(t *testing.T, st store.Store) {
		keys := content.PageKeys("bounds", small.Domain(), 5)
		writeAll(t, st, small, tp2pp2, "PLHD", keys)
		r := placement.Rank{TP: 0, PP: 1}
		probe, _ := newReader(t, st, small, tp2pp2, r, "page_first", 4, reshard.ReaderOptions{})
		g := probe.Geometry()
		require.Equal(t, []string{"k", "v"}, g.RegionNames)

		big := make([]int, 70)
		for i := range big {
			big[i] = 69 - i
		}
		bigDup := append([]int(nil), big...)
		bigDup[69] = big[3]
		bigOut := append([]int(nil), big...)
		bigOut[65] = 100
		manyKeys := content.PageKeys("bounds", small.Domain(), 70)
		cases := []struct {
			name    string
			slots   int // pool slots
			keys    []string
			at      []int
			regions func([][]byte) [][]byte
			err     string
		}{
			{"slot past the pool", 4, keys[:2], []int{0, 4}, nil, "slot 4 of page 1 is outside the pool's 4 slots"},
			{"negative slot", 4, keys[:1], []int{-1}, nil, "slot -1 of page 0 is outside the pool's 4 slots"},
			{"shared slot", 4, keys[:3], []int{1, 2, 1}, nil, "pages 0 and 2 both go to slot 1"},
			{"more pages than slots", 4, keys, []int{0, 1, 2, 3, 0}, nil, "5 pages do not fit in a pool of 4 slots"},
			{"shared slot of a long request", 100, manyKeys, bigDup, nil, "pages 3 and 69 both go to slot 66"},
			{"slot past the pool in a long request", 100, manyKeys, bigOut, nil, "slot 100 of page 65 is outside the pool's 100 slots"},
			{"keys and slots", 4, keys[:2], []int{0}, nil, "2 keys but 1 slots"},
			{"region count", 4, keys[:1], []int{0}, func(r [][]byte) [][]byte { return r[:1] }, "1 pool regions given; the binding has 2"},
			{"short region", 4, keys[:1], []int{0}, func(r [][]byte) [][]byte { return [][]byte{r[0], r[1][:len(r[1])-1]} },
				fmt.Sprintf("pool region v has %d bytes; the binding needs %d", g.Regions[1]-1, g.Regions[1])},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				sp := newSpy(st)
				rd, regions := newReader(t, sp, small, tp2pp2, r, "page_first", c.slots, reshard.ReaderOptions{})
				before := clone(regions)
				arg := regions
				if c.regions != nil {
					arg = c.regions(regions)
				}
				res, err := rd.Read(context.Background(), c.keys, c.at, arg)
				require.EqualError(t, err, c.err)
				require.Equal(t, reshard.Result{}, res)
				require.Empty(t, sp.calls, "the store was used")
				require.Equal(t, reshard.Stats{}, rd.Stats())
				require.Equal(t, before, regions)
			})
		}

		// Plans are proven before any read: a plan over its limits is a
		// miss with the planner's error, and nothing is read.
		tpl, err := probe.Planner().Template(manifestOf(t, small, tp2pp2, builtin(t, "PLHD")))
		require.NoError(t, err)
		limits := []struct {
			opts plan.Options
			err  string
		}{
			{plan.Options{MaxOps: len(tpl.Ops) - 1}, fmt.Sprintf("plan over its limits: %d ops; the limit is %d", len(tpl.Ops), len(tpl.Ops)-1)},
			{plan.Options{MaxBytes: g.PageBytes - 2}, fmt.Sprintf("plan over its limits: %d bytes; the limit is %d", g.PageBytes, g.PageBytes-2)},
		}
		for _, c := range limits {
			sp := newSpy(st)
			rd, regions := newReader(t, sp, small, tp2pp2, r, "page_first", 4, reshard.ReaderOptions{Plan: c.opts})
			before := clone(regions)
			res, err := rd.Read(context.Background(), keys[:2], []int{0, 1}, regions)
			require.NoError(t, err)
			require.EqualError(t, res.Stop, fmt.Sprintf("page %s: %s", keys[0], c.err))
			require.ErrorIs(t, res.Stop, plan.ErrLimit)
			require.Equal(t, 0, res.Hit)
			require.Zero(t, sp.Calls("ReadRanges"))
			require.Equal(t, before, regions)
		}
	})
}

// A manifest of this model domain that describes another page geometry (a
// forged or colliding domain) is refused by the planner before any read.
func TestManifestOfAnotherGeometry(t *testing.T) {
	forEachStore(t, func(t *testing.T, st store.Store) {
		d := small.Descriptor
		d.PageSize = 4
		odd, err := plan.ManifestFor(small.Domain(), &d, tp2pp2, builtin(t, "PLHD"))
		require.NoError(t, err)
		require.NoError(t, reshard.Publish(context.Background(), st, odd))
		key := content.PageKeys("geometry", small.Domain(), 1)[0]
		writeObject(t, st, key, odd.Key(), partSizes(odd))

		sp := newSpy(st)
		rd, regions := newReader(t, sp, small, tp2pp2, placement.Rank{}, "page_first", 1, reshard.ReaderOptions{})
		before := clone(regions)
		res, err := rd.Read(context.Background(), []string{key}, []int{0}, regions)
		require.NoError(t, err)
		require.EqualError(t, res.Stop, fmt.Sprintf("page %s: manifest does not match the reader's model: manifest %s describes another page geometry", key, odd.ID()))
		require.ErrorIs(t, res.Stop, plan.ErrIncompatible)
		require.Equal(t, 0, res.Hit)
		require.Zero(t, sp.Calls("ReadRanges"))
		require.Equal(t, before, regions)
	})
}

var errLinkDown = errors.New("link down")

// Row 5: object invalid after the query, or a read fails -> report only the
// prefix fully read. The store double fails ReadRanges at range k, after
// delivering the ranges before it and half of range k.
func TestFailedReadReportsPrefix(t *testing.T) {
	forEachStore(t, func(t *testing.T, st store.Store) {
		keys := content.PageKeys("prefix", small.Domain(), 3)
		m := writeAll(t, st, small, tp1pp3, "HPLD", keys)
		r := placement.Rank{TP: 1, PP: 0}
		probe, _ := newReader(t, st, small, tp2pp2, r, "page_first_direct", 3, reshard.ReaderOptions{})
		tpl, err := probe.Planner().Template(m)
		require.NoError(t, err)
		ops, pb := len(tpl.Ops), probe.Geometry().PageBytes
		require.Greater(t, ops, 1)
		total := 3 * ops

		for _, k := range []int{0, 1, ops - 1, ops, ops + 1, 2*ops - 1, 2 * ops, total - 1} {
			for _, withErr := range []bool{true, false} {
				t.Run(fmt.Sprintf("range %d error %v", k, withErr), func(t *testing.T) {
					sp := newSpy(st)
					sp.readRanges = func(ctx context.Context, rs []store.Range) (int, error) {
						require.Len(t, rs, total)
						n, err := st.ReadRanges(ctx, rs[:k])
						require.NoError(t, err)
						require.Equal(t, k, n)
						d := rs[k].Dst[0]
						for i := range d[:len(d)/2] {
							d[i] = 0xee
						}
						if withErr {
							return k, errLinkDown
						}
						return k, nil
					}
					rd, regions := newReader(t, sp, small, tp2pp2, r, "page_first_direct", 3, reshard.ReaderOptions{})
					slots := []int{1, 2, 0}
					res, err := rd.Read(context.Background(), keys, slots, regions)
					require.NoError(t, err)
					hit := k / ops
					want := fmt.Sprintf("page %s: link down", keys[hit])
					if !withErr {
						want = fmt.Sprintf("page %s: store read %d of %d ranges", keys[hit], k, total)
					}
					require.EqualError(t, res.Stop, want)
					require.Equal(t, reshard.Result{Hit: hit, Bytes: hit * pb, Ops: hit * ops, Stop: res.Stop}, res)
					require.Equal(t, reshard.Stats{Requests: 1, Pages: 3, Hits: int64(hit), Misses: int64(3 - hit),
						Bytes: int64(hit * pb), Ops: int64(hit * ops)}, rd.Stats())
					for i := 0; i < hit; i++ {
						require.NoError(t, verifyPage(rd, regions, slots[i], keys[i]), "page %d", i)
					}
				})
			}
		}
	})
}

// A page complete at the query but gone at the read (evicted): a miss, as
// if the query had come a moment later; the store's error says which range.
func TestObjectInvalidAfterQuery(t *testing.T) {
	forEachStore(t, func(t *testing.T, st store.Store) {
		keys := content.PageKeys("vanished", small.Domain(), 3)
		m := writeAll(t, st, small, tp2pp2, "PLHD", []string{keys[0], keys[2]})
		// keys[1] has 3 of its 4 parts: the double's query says complete,
		// as if the page had been evicted after it was queried.
		writeRanks(t, st, m, tp2pp2, tp2pp2.Ranks()[:3], "page_first", keys[1:2])
		sp := newSpy(st)
		sp.query = func(ctx context.Context, ks []string) ([]store.Object, error) {
			objs, err := st.Query(ctx, ks)
			require.Equal(t, store.Object{}, objs[1])
			objs[1] = stored(m)
			return objs, err
		}
		rd, regions := newReader(t, sp, small, tp1pp3, placement.Rank{PP: 2}, "page_first", 3, reshard.ReaderOptions{})
		tpl, err := rd.Planner().Template(m)
		require.NoError(t, err)
		op := tpl.Ops[0]
		res, err := rd.Read(context.Background(), keys, []int{0, 1, 2}, regions)
		require.NoError(t, err)
		require.EqualError(t, res.Stop, fmt.Sprintf("page missing or incomplete: %s: read %s part %d [%d,%d): not found", keys[1], keys[1], op.Part, op.Src, op.Src+op.Len))
		require.ErrorIs(t, res.Stop, reshard.ErrMiss)
		require.ErrorIs(t, res.Stop, store.ErrNotFound)
		require.Equal(t, reshard.StopMiss, reshard.Classify(res.Stop))
		var re *store.RangeError
		require.ErrorAs(t, res.Stop, &re)
		require.Equal(t, 1, res.Hit)
		require.NoError(t, verifyPage(rd, regions, 0, keys[0]))
	})
}
