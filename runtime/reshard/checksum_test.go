package reshard_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler"
	"github.com/kvreshard/kvreshard/runtime/content"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/reshard"
	"github.com/kvreshard/kvreshard/runtime/store"
	"github.com/kvreshard/kvreshard/runtime/store/memstore"
)

// TestWriterChecksums: every part a writer writes carries the checksum of
// its bytes bound to its manifest key and part number, computed over the
// pool's fragments, and every backend returns it with the object.
func TestWriterChecksums(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		keys := content.PageKeys("sums", small.Domain(), 3)
		ts, tp := newTamper(b.st)
		m := writeAll(t, ts, small, tp2pp2, "PLHD", keys)
		objs, err := b.st.Query(context.Background(), keys)
		require.NoError(t, err)
		other := manifestOf(t, small, tp2pp2, builtin(t, "LPHD"))
		for i, o := range objs {
			require.True(t, o.Complete)
			require.Len(t, o.Checksums, len(m.Parts), "page %d", i)
			for p := range m.Parts {
				w := tp.written(t, keys[i], p)
				require.Len(t, w.Data[0], m.PartBytes(p))
				sum := store.PartChecksum(m.Key(), p, w.Data)
				require.NotZero(t, sum)
				require.Equal(t, sum, w.Checksum, "page %d part %d: the writer's checksum", i, p)
				require.Equal(t, sum, o.Checksums[p], "page %d part %d: the stored checksum", i, p)
				require.NotEqual(t, sum, store.PartChecksum(other.Key(), p, w.Data), "bound to the manifest")
			}
		}
	})
}

// corruptPage writes keys as the ranks of TP 4 in part layout PLHD (four
// parts of 2304 bytes, one head each) and flips byte 0 of part 1 of
// keys[bad]: in the stored part where the backend lets a test reach it (a
// file, a Redis string), in the bytes written otherwise (after the writer
// computed the checksum).
func corruptPage(t *testing.T, b backend, keys []string, bad int) *manifest.Manifest {
	t.Helper()
	ts, tp := newTamper(b.st)
	if b.name == "mem" {
		tp.flip[partID{keys[bad], 1}] = true
	}
	m := writeAll(t, ts, small, tp4pp1, "PLHD", keys)
	require.Equal(t, []int{2304, 2304, 2304, 2304}, partSizes(m))
	if b.name != "mem" {
		require.True(t, flipStored(t, b, keys[bad], 1, tp.written(t, keys[bad], 1).Data[0], 0))
	}
	return m
}

// TestPartChecks reads four pages, the third with a flipped byte in part
// 1, into rank 0/0 of TP 2 x PP 2, which needs parts 0 and 1 of each: every
// read that fetches whole parts stops at the third page, with its first two
// pages read and nothing of the third in the pool; reads of runs, and reads
// that skip the checks, take the corrupt page as read.
func TestPartChecks(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		keys := content.PageKeys("flipped", small.Domain(), 4)
		m := corruptPage(t, b, keys, 2)
		slots := []int{3, 1, 0, 2}
		whole := plan.Options{Strategy: plan.Staged, MaxGap: 1 << 20}
		for _, c := range []struct {
			name   string
			opts   reshard.ReaderOptions
			caught bool
			split  bool // checks and copies split over the workers
		}{
			{"check parts", reshard.ReaderOptions{CheckParts: true}, true, false},
			{"check parts four workers", reshard.ReaderOptions{CheckParts: true, CopyWorkers: 4}, true, true},
			{"staged whole parts four workers", reshard.ReaderOptions{Plan: whole, CopyWorkers: 4}, true, true},
			{"check parts small stage", reshard.ReaderOptions{CheckParts: true, Plan: plan.Options{Strategy: plan.Staged, StageBytes: 1000, MaxGap: 64}}, true, false},
			{"check parts one worker", reshard.ReaderOptions{CheckParts: true, CopyWorkers: 1}, true, true},
			{"staged whole parts", reshard.ReaderOptions{Plan: whole}, true, false},
			{"direct", reshard.ReaderOptions{}, false, false},
			{"staged whole parts skip checks", reshard.ReaderOptions{Plan: whole, SkipPartChecks: true}, false, false},
			{"check parts skip checks", reshard.ReaderOptions{CheckParts: true, SkipPartChecks: true}, false, false},
		} {
			t.Run(c.name, func(t *testing.T) {
				if c.split {
					workers := 0
					reshard.SetMinCopyShare(t, 0, func(w int) { workers = max(workers, w) })
					defer func() { require.Equal(t, max(1, c.opts.CopyWorkers), workers) }()
				}
				rd, regions := newReader(t, b.st, small, tp2pp2, placement.Rank{}, "page_first", 4, c.opts)
				g := rd.Geometry()
				tpl, err := rd.Planner().Template(m)
				require.NoError(t, err)
				if c.opts.Plan.Strategy == plan.Staged && c.opts.Plan.MaxGap == whole.MaxGap {
					require.Len(t, tpl.Reads, 2)
					for _, r := range tpl.Reads {
						require.True(t, r.Kernel, "read %+v holds a whole part", r)
					}
				}
				ops := tpl.OpCount()
				if c.opts.CheckParts {
					ops = 2 // parts 0 and 1, whole
				}
				before := clone(regions)
				res, err := rd.Read(context.Background(), keys, slots, regions)
				require.NoError(t, err)
				if !c.caught {
					require.NoError(t, res.Stop)
					require.Equal(t, 4, res.Hit)
					require.Error(t, verifyPage(rd, regions, slots[2], keys[2]), "the flipped byte is one this rank reads")
					for _, i := range []int{0, 1, 3} {
						require.NoError(t, verifyPage(rd, regions, slots[i], keys[i]))
					}
					require.Zero(t, rd.Stats().PartsChecked)
					return
				}
				require.EqualError(t, res.Stop, fmt.Sprintf("page %s: part 1: part checksum mismatch", keys[2]))
				require.ErrorIs(t, res.Stop, store.ErrChecksum)
				require.Equal(t, reshard.StopChecksum, reshard.Classify(res.Stop))
				require.Equal(t, reshard.Result{Hit: 2, Bytes: 2 * g.PageBytes, Ops: 2 * ops, Stop: res.Stop}, res)
				checkPool(t, g, before, regions, keys, slots, 2)
				st := rd.Stats()
				require.Equal(t, int64(2*2+2), st.PartsChecked, "both parts of pages 0 and 1, then parts 0 and 1 of page 2")
				require.Equal(t, int64(1), st.ChecksumErrors)
			})
		}
	})
}

// TestClaimOfAnotherManifest: a page whose claim names another manifest
// with the same part sizes (PLHD and LPHD parts of one topology hold the
// same bytes in another order) reads without an error unless the parts are
// checked; checked, the checksums, bound to the manifest the parts were
// written with, do not match.
func TestClaimOfAnotherManifest(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		keys := content.PageKeys("forged", small.Domain(), 3)
		a := manifestOf(t, small, tp4pp1, builtin(t, "PLHD"))
		forged := manifestOf(t, small, tp4pp1, builtin(t, "LPHD"))
		require.Equal(t, partSizes(a), partSizes(forged))
		require.NotEqual(t, a.Key(), forged.Key())
		require.NoError(t, reshard.Publish(context.Background(), b.st, forged))
		ts, tp := newTamper(b.st)
		tp.claim[keys[1]] = forged.Key()
		writeAll(t, ts, small, tp4pp1, "PLHD", keys)
		require.Equal(t, forged.Key(), query(t, b.st, keys[1:2])[0].Manifest)

		slots := []int{2, 0, 1}
		rd, regions := newReader(t, b.st, small, tp2pp2, placement.Rank{PP: 1}, "page_first", 3, reshard.ReaderOptions{CheckParts: true})
		before := clone(regions)
		res, err := rd.Read(context.Background(), keys, slots, regions)
		require.NoError(t, err)
		require.EqualError(t, res.Stop, fmt.Sprintf("page %s: part 0: part checksum mismatch", keys[1]))
		require.ErrorIs(t, res.Stop, store.ErrChecksum)
		require.Equal(t, 1, res.Hit)
		checkPool(t, rd.Geometry(), before, regions, keys, slots, 1)

		// Unchecked, the forged claim is served as a hit of wrong bytes.
		rd, regions = newReader(t, b.st, small, tp2pp2, placement.Rank{PP: 1}, "page_first", 3, reshard.ReaderOptions{CheckParts: true, SkipPartChecks: true})
		res, err = rd.Read(context.Background(), keys, slots, regions)
		require.NoError(t, err)
		require.NoError(t, res.Stop)
		require.Equal(t, 3, res.Hit)
		require.Error(t, verifyPage(rd, regions, slots[1], keys[1]))
	})
}

// TestCheckPartsStrategies reads pages of four part layouts, one of them
// run by the interpreter, with CheckParts and every planner strategy: each
// part a rank needs is read whole, once, in part order, and checked, and
// every byte of the pool is right.
func TestCheckPartsStrategies(t *testing.T) {
	f, err := compiler.Compile("custom.kvl", []byte(`part HLTD "heads, then layers, then tokens" { order C H L T D }`))
	require.NoError(t, err)
	custom := f.Layouts[0]
	forEachBackend(t, func(t *testing.T, b backend) {
		const n = 3
		var keys []string
		var mans []*manifest.Manifest
		for _, l := range []string{"PLHD", "LPHD", "HPLD", "HLTD"} {
			k := content.PageKeys("check-"+l, small.Domain(), n)
			var m *manifest.Manifest
			if l == "HLTD" {
				m = manifestOf(t, small, tp1pp3, custom)
				writeRanks(t, b.st, m, tp1pp3, tp1pp3.Ranks(), "page_first", k)
			} else {
				m = writeAll(t, b.st, small, tp1pp3, l, k)
			}
			keys = append(keys, k...)
			for range k {
				mans = append(mans, m)
			}
		}
		slots := []int{5, 0, 11, 3, 7, 1, 10, 2, 9, 4, 8, 6}
		redis := plan.RedisTransport()
		for _, c := range []struct {
			name string
			opts plan.Options
		}{
			{"direct", plan.Options{}},
			{"scatter", plan.Options{Strategy: plan.Scatter, MaxSegments: 3}},
			{"staged", plan.Options{Strategy: plan.Staged}},
			{"staged small bound", plan.Options{Strategy: plan.Staged, StageBytes: 1000, MaxGap: 64}},
			{"auto memory", plan.Options{Strategy: plan.Auto}},
			{"auto redis", plan.Options{Strategy: plan.Auto, Transport: &redis}},
		} {
			t.Run(c.name, func(t *testing.T) {
				sp := newViewSpy(b.st)
				var st store.Store = sp
				if _, ok := b.st.(store.Viewer); !ok {
					st = sp.spy
				}
				var whole []string
				sp.readRanges = func(ctx context.Context, rs []store.Range) (int, error) {
					for _, r := range rs {
						whole = append(whole, fmt.Sprintf("%s part %d [%d,%d)", r.Key, r.Part, r.Off, r.Off+r.Len()))
					}
					return b.st.ReadRanges(ctx, rs)
				}
				// Rank 1/1 of TP 2 x PP 2: heads 2-3, layers 3-5, in parts
				// 1 and 2 of TP 1 x PP 3.
				rd, regions := newReader(t, st, small, tp2pp2, placement.Rank{TP: 1, PP: 1}, "page_first", len(slots), reshard.ReaderOptions{Plan: c.opts, CheckParts: true})
				res := readAll(t, rd, keys, slots, regions)
				var want []string
				for i, k := range keys {
					for _, p := range []int{1, 2} {
						want = append(want, fmt.Sprintf("%s part %d [0,%d)", k, p, mans[i].PartBytes(p)))
					}
				}
				require.Equal(t, len(want), res.Ops)
				require.Equal(t, int64(len(want)), rd.Stats().PartsChecked)
				if st == sp {
					require.Equal(t, len(want), sp.Calls("ViewPart"), "a store that lends its parts lends each needed part once")
					require.Empty(t, whole)
				} else {
					require.Equal(t, want, whole)
				}
			})
		}
	})
}

// TestLentPartsCheckedOnce: a reader hashes a part a store lends it the
// first time it sees it (lent bytes never change); a part that failed is
// checked, and fails, again; another reader checks for itself. Page 3 has
// a flipped byte in part 1.
func TestLentPartsCheckedOnce(t *testing.T) {
	b := backend{name: "mem", st: memstore.New()}
	keys := content.PageKeys("lent", small.Domain(), 4)
	corruptPage(t, b, keys, 3)
	opts := reshard.ReaderOptions{Plan: plan.Options{Strategy: plan.Staged, MaxGap: 1 << 20}}
	for range 2 {
		rd, regions := newReader(t, b.st, small, tp2pp2, placement.Rank{}, "page_first", 4, opts)
		for n := 1; n <= 3; n++ {
			before := clone(regions)
			res, err := rd.Read(context.Background(), keys, iota(4), regions)
			require.NoError(t, err)
			require.EqualError(t, res.Stop, fmt.Sprintf("page %s: part 1: part checksum mismatch", keys[3]))
			require.Equal(t, 3, res.Hit)
			checkPool(t, rd.Geometry(), before, regions, keys, iota(4), 3)
			st := rd.Stats()
			// Pages 0-2 and part 0 of page 3 once, the bad part 1 each time.
			require.Equal(t, int64(3*2+1+n), st.PartsChecked, "read %d", n)
			require.Equal(t, int64(n), st.ChecksumErrors)
		}
	}
}
