package reshard_test

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler"
	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/partsum"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/reshard"
	"github.com/kvreshard/kvreshard/runtime/store"
	"github.com/kvreshard/kvreshard/runtime/store/memstore"
)

// wide is the model of the range checks: a token's K or V row of 8 layers
// is 8 KiB, so that rank 1 of TP 1 x PP 2 (layers 4-7) reads the second
// half of each row of a TP 1 writer's part in PLHD: runs of 4 KiB, four
// checksum blocks each, 4 KiB apart. 64 KiB a page: 64 blocks.
var wide = newModel("wide", 8, 8, []int{64, 64}, "bf16", 4)

var tp1pp1 = placement.Topology{TP: 1, PP: 1}

// corruptPage writes keys as the ranks of TP 4 in part layout PLHD (four
// parts of 2304 bytes, one head each) and flips byte 0 of part 1 of
// keys[bad]: in the stored part where the backend lets a test reach it (a
// file, a Redis string), in the bytes written otherwise (after the writer
// computed the checksum).
func corruptPage(t *testing.T, b backend, keys []string, bad int) *manifest.Manifest {
	t.Helper()
	ts, tp := newTamper(b.st)
	if b.name == "mem" {
		tp.flip[partID{keys[bad], 1}] = 0
	}
	m := writeAll(t, ts, small, tp4pp1, "PLHD", keys)
	require.Equal(t, []int{2336, 2336, 2336, 2336}, partSizes(m), "2304 bytes of data, 3 block sums and the root")
	if b.name != "mem" {
		require.True(t, flipStored(t, b, keys[bad], 1, tp.written(t, keys[bad], 1).Data[0], 0))
	}
	return m
}

// flipPart writes keys of wide as TP 1 in PLHD (one part of 64 KiB) and
// flips byte off of the stored part of keys[bad] (its data, then its
// checksums from 65536 on).
func flipPart(t *testing.T, b backend, keys []string, bad, off int) *manifest.Manifest {
	t.Helper()
	ts, tp := newTamper(b.st)
	if b.name == "mem" {
		tp.flip[partID{keys[bad], 0}] = off
	}
	m := writeAll(t, ts, wide, tp1pp1, "PLHD", keys)
	require.Equal(t, []int{partsum.Size(64 << 10)}, partSizes(m))
	if b.name != "mem" {
		require.True(t, flipStored(t, b, keys[bad], 0, tp.written(t, keys[bad], 0).Data[0], off))
	}
	return m
}

// TestWriterTrailers: every part a writer writes is its data, as the pool
// holds it, then the trailer of its checksums (partsum), bound to the page
// key, the manifest key and the part number; every backend stores the
// whole of it.
func TestWriterTrailers(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		keys := content.PageKeys("trailers", small.Domain(), 3)
		ts, tp := newTamper(b.st)
		m := writeAll(t, ts, small, tp2pp2, "PLHD", keys)
		ctx := context.Background()
		for _, k := range keys {
			for p := range m.Parts {
				n := m.PartBytes(p)
				got := make([]byte, partsum.Size(n))
				done, err := b.st.ReadRanges(ctx, []store.Range{{Key: k, Part: p, Dst: [][]byte{got}, Manifest: m.Key()}})
				require.NoError(t, err)
				require.Equal(t, 1, done)
				require.Equal(t, tp.written(t, k, p).Data[0], got, "page %s part %d", k, p)
				data, trailer := got[:n], got[n:]
				require.Equal(t, partsum.Trailer(k, m.Key(), p, [][]byte{data}), trailer)
				require.NoError(t, partsum.CheckTrailer(k, m.Key(), p, n, trailer))
				require.NoError(t, partsum.CheckBlocks(p, n, trailer[:len(trailer)-8], 0, data))
				other := keys[(slicesIndex(keys, k)+1)%len(keys)]
				require.EqualError(t, partsum.CheckTrailer(other, m.Key(), p, n, trailer), fmt.Sprintf("part %d: root: part checksum mismatch", p), "bound to the page")
			}
		}
	})
}

func slicesIndex(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// checkedStrategies are the planner options the range checks read with.
func checkedStrategies() []struct {
	name string
	opts plan.Options
} {
	file, redis := plan.FileTransport(), plan.RedisTransport()
	return []struct {
		name string
		opts plan.Options
	}{
		{"direct", plan.Options{}},
		{"scatter", plan.Options{Strategy: plan.Scatter, MaxSegments: 3}},
		{"staged", plan.Options{Strategy: plan.Staged}},
		{"staged no gap", plan.Options{Strategy: plan.Staged, MaxGap: -1}},
		{"auto memory", plan.Options{Strategy: plan.Auto}},
		{"auto file", plan.Options{Strategy: plan.Auto, Transport: &file}},
		{"auto redis", plan.Options{Strategy: plan.Auto, Transport: &redis}},
	}
}

// TestCheckedRangeReads: rank 1 of TP 1 x PP 2 reads half of each part of
// four pages, the third with a byte flipped in its stored part, with every
// strategy and one and four copy workers. Checked, a flipped byte in the
// blocks it reads, in their sums or in the root stops the read at the third
// page with its first two pages read and nothing of the third in the pool;
// a flipped byte in a block it does not read changes nothing it reads,
// but where the store lends whole parts (mem), which are checked whole.
// Unchecked, the read takes the corrupt page as a hit.
func TestCheckedRangeReads(t *testing.T) {
	const n = 64 << 10
	block := func(i int) string {
		return fmt.Sprintf("part 0: block %d (bytes %d-%d): part checksum mismatch", i, i*partsum.Block, (i+1)*partsum.Block)
	}
	for _, flip := range []struct {
		name string
		off  int
		err  string // "" when the rank never reads the byte
	}{
		{"data read", 4<<10 + 5, block(4)},
		{"data read, last block", n - 1, block(63)},
		{"data not read", 5, ""},
		{"sum of a block read", n + 8*4 + 1, "part 0: root: part checksum mismatch"},
		{"sum of a block not read", n + 8*1, "part 0: root: part checksum mismatch"},
		{"root", n + 8*64 + 2, "part 0: root: part checksum mismatch"},
	} {
		t.Run(flip.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				keys := content.PageKeys("range-"+strings.ReplaceAll(flip.name, " ", "-"), wide.Domain(), 4)
				flipPart(t, b, keys, 2, flip.off)
				slots := []int{3, 1, 0, 2}
				rank := placement.Rank{PP: 1}
				want := flip.err
				if want == "" && b.name == "mem" {
					// A lent part is checked whole.
					want = block(flip.off / partsum.Block)
				}
				for _, s := range checkedStrategies() {
					for _, workers := range []int{1, 4} {
						t.Run(fmt.Sprintf("%s %d workers", s.name, workers), func(t *testing.T) {
							opts := reshard.ReaderOptions{Plan: s.opts, CheckParts: true, CopyWorkers: workers}
							rd, regions := newReader(t, b.st, wide, tp1pp2, rank, "page_first", 4, opts)
							before := clone(regions)
							res, err := rd.Read(context.Background(), keys, slots, regions)
							require.NoError(t, err)
							if want == "" {
								require.NoError(t, res.Stop)
								checkPool(t, rd.Geometry(), before, regions, keys, slots, 4)
								require.Equal(t, int64(4), rd.Stats().PartsChecked)
								return
							}
							require.EqualError(t, res.Stop, fmt.Sprintf("page %s: %s", keys[2], want))
							require.Equal(t, reshard.StopChecksum, reshard.Classify(res.Stop))
							require.Equal(t, 2, res.Hit)
							checkPool(t, rd.Geometry(), before, regions, keys, slots, 2)
							st := rd.Stats()
							require.Equal(t, int64(3), st.PartsChecked, "the part of pages 0-2")
							require.Equal(t, int64(1), st.ChecksumErrors)
						})
					}
				}
				// Unchecked: the corrupt page is a hit; only a byte the rank
				// reads shows.
				rd, regions := newReader(t, b.st, wide, tp1pp2, rank, "page_first", 4, reshard.ReaderOptions{})
				res, err := rd.Read(context.Background(), keys, slots, regions)
				require.NoError(t, err)
				require.NoError(t, res.Stop)
				require.Equal(t, 4, res.Hit)
				if flip.off < n && flip.err != "" {
					require.Error(t, verifyPage(rd, regions, slots[2], keys[2]))
				} else {
					require.NoError(t, verifyPage(rd, regions, slots[2], keys[2]))
				}
				require.Zero(t, rd.Stats().PartsChecked)
			})
		})
	}
}

// tp1pp2 is TP 1 x PP 2: rank 1 holds the second half of the layers.
var tp1pp2 = placement.Topology{TP: 1, PP: 2}

// TestCheckedReadPlans: a checked read reads whole checksum blocks of what
// the rank needs, and each part's trailer once a page, whatever the
// strategy; a rank that needs half the blocks reads half.
func TestCheckedReadPlans(t *testing.T) {
	const n = 64 << 10
	st := memstore.New()
	keys := content.PageKeys("plans", wide.Domain(), 2)
	m := writeAll(t, st, wide, tp1pp1, "PLHD", keys)
	for _, s := range checkedStrategies() {
		t.Run(s.name, func(t *testing.T) {
			sp := newSpy(st) // a spy does not lend parts: every byte is read
			var ranges []string
			sp.readRanges = func(ctx context.Context, rs []store.Range) (int, error) {
				for _, r := range rs {
					ranges = append(ranges, fmt.Sprintf("%d [%d,%d)", slicesIndex(keys, r.Key), r.Off, r.Off+r.Len()))
					require.Equal(t, m.Key(), r.Manifest)
				}
				return st.ReadRanges(ctx, rs)
			}
			rd, regions := newReader(t, sp, wide, tp1pp2, placement.Rank{PP: 1}, "page_first", 2, reshard.ReaderOptions{Plan: s.opts, CheckParts: true})
			res := readAll(t, rd, keys, []int{1, 0}, regions)
			tpl, err := rd.Planner().Template(m)
			require.NoError(t, err)
			pl, err := rd.Planner().Checked(tpl)
			require.NoError(t, err)
			require.True(t, pl.Checked)
			require.Equal(t, plan.Staged, pl.Strategy)
			require.Equal(t, []plan.Read{{Part: 0, Src: n, Len: partsum.TrailerLen(n)}}, pl.Trailers)
			require.Equal(t, 2*(len(pl.Reads)+1), res.Ops)
			// Each page: its trailer, then reads of whole blocks holding
			// layers 4-7 of each token row, and blocks checked: 32 of 64.
			trailers, checked := 0, 0
			for _, r := range ranges {
				if strings.HasSuffix(r, fmt.Sprintf("[%d,%d)", n, n+partsum.TrailerLen(n))) {
					trailers++
				}
			}
			require.Equal(t, 2, trailers, "%v", ranges)
			for i := range pl.Reads {
				r := pl.Reads[i]
				require.Zero(t, r.Src%partsum.Block)
				require.True(t, (r.Src+r.Len)%partsum.Block == 0 || r.Src+r.Len == n)
				for _, c := range pl.ReadChecks(i) {
					checked += c.N
				}
			}
			require.Equal(t, 32, checked)
			require.Equal(t, int64(2), rd.Stats().PartsChecked)
		})
	}
}

// copyStored writes the stored bytes of part part of key from (found by
// the bytes fromData the test wrote) over those of key to (toData), as a
// copy of a part file or of a Redis string would.
func copyStored(t *testing.T, b backend, from, to string, part int, fromData, toData []byte) {
	t.Helper()
	switch b.name {
	case "file":
		find := func(data []byte) string {
			var found []string
			require.NoError(t, filepath.WalkDir(b.dir, func(path string, d fs.DirEntry, err error) error {
				if err != nil || !d.Type().IsRegular() || !strings.HasPrefix(d.Name(), "part-") {
					return err
				}
				f, err := os.ReadFile(path)
				if err == nil && bytes.Equal(f, data) {
					found = append(found, path)
				}
				return err
			}))
			require.Len(t, found, 1)
			return found[0]
		}
		require.NoError(t, os.WriteFile(find(toData), fromData, 0o666))
	case "redis":
		c := redisClient(t, b.srv)
		ctx := context.Background()
		k := func(key string) string { return "{" + key + "}:3:p:" + strconv.Itoa(part) }
		v, err := c.Do(ctx, c.B().Get().Key(k(from)).Build()).AsBytes()
		require.NoError(t, err)
		require.Equal(t, fromData, v)
		require.NoError(t, c.Do(ctx, c.B().Set().Key(k(to)).Value(string(v)).Build()).Error())
	default:
		t.Fatalf("copyStored: %s", b.name)
	}
}

// TestPartCopiedFromAnotherPage (issue 18, defect 1): part 0 of page 0
// stored over part 0 of page 1 (same manifest, same part number, same
// size) is read as a hit unchecked, and fails the root check checked,
// whether the rank reads the whole part or half of it, on every backend;
// on Redis, so does a copy of the page's state hash with its parts.
func TestPartCopiedFromAnotherPage(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		for _, copyState := range []bool{false, true} {
			if copyState && b.name != "redis" {
				continue
			}
			name := map[bool]string{false: "part", true: "state and parts"}[copyState]
			t.Run(name, func(t *testing.T) {
				keys := content.PageKeys("copied-"+strings.ReplaceAll(name, " ", "-"), wide.Domain(), 4)
				ts, tp := newTamper(b.st)
				if b.name == "mem" {
					tp.copyFrom[partID{keys[1], 0}] = keys[0]
				}
				writeAll(t, ts, wide, tp1pp1, "PLHD", keys)
				switch {
				case copyState:
					copyRedisPage(t, b, keys[0], keys[1], 1)
				case b.name != "mem":
					copyStored(t, b, keys[0], keys[1], 0, tp.written(t, keys[0], 0).Data[0], tp.written(t, keys[1], 0).Data[0])
				}
				for _, c := range []struct {
					name string
					topo placement.Topology
					rank placement.Rank
				}{{"whole part", tp1pp1, placement.Rank{}}, {"half a part", tp1pp2, placement.Rank{PP: 1}}} {
					t.Run(c.name, func(t *testing.T) {
						slots := []int{0, 1, 2, 3}
						rd, regions := newReader(t, b.st, wide, c.topo, c.rank, "page_first", 4, reshard.ReaderOptions{CheckParts: true})
						before := clone(regions)
						res, err := rd.Read(context.Background(), keys, slots, regions)
						require.NoError(t, err)
						require.EqualError(t, res.Stop, fmt.Sprintf("page %s: part 0: root: part checksum mismatch", keys[1]))
						require.Equal(t, reshard.StopChecksum, reshard.Classify(res.Stop))
						require.Equal(t, 1, res.Hit)
						checkPool(t, rd.Geometry(), before, regions, keys, slots, 1)

						rd, regions = newReader(t, b.st, wide, c.topo, c.rank, "page_first", 4, reshard.ReaderOptions{})
						res, err = rd.Read(context.Background(), keys, slots, regions)
						require.NoError(t, err)
						require.NoError(t, res.Stop)
						require.Equal(t, 4, res.Hit, "unchecked, page 0's bytes are served as page 1")
						require.Error(t, verifyPage(rd, regions, 1, keys[1]))
						require.NoError(t, verifyPage(rd, regions, 1, keys[0]))
					})
				}
			})
		}
	})
}

// copyRedisPage copies the Redis keys of page from (its state hash and its
// parts parts) over those of page to.
func copyRedisPage(t *testing.T, b backend, from, to string, parts int) {
	t.Helper()
	c := redisClient(t, b.srv)
	ctx := context.Background()
	tag := func(key string) string { return "{" + key + "}:3:" }
	h, err := c.Do(ctx, c.B().Hgetall().Key(tag(from)+"meta").Build()).AsStrMap()
	require.NoError(t, err)
	require.NoError(t, c.Do(ctx, c.B().Del().Key(tag(to)+"meta").Build()).Error())
	for f, v := range h {
		require.NoError(t, c.Do(ctx, c.B().Hset().Key(tag(to)+"meta").FieldValue().FieldValue(f, v).Build()).Error())
	}
	for p := range parts {
		v, err := c.Do(ctx, c.B().Get().Key(tag(from)+"p:"+strconv.Itoa(p)).Build()).ToString()
		require.NoError(t, err)
		require.NoError(t, c.Do(ctx, c.B().Set().Key(tag(to)+"p:"+strconv.Itoa(p)).Value(v).Build()).Error())
	}
}

// TestClaimOfAnotherManifest: a page whose claim names another manifest
// with the same part sizes (PLHD and LPHD parts of one topology hold the
// same bytes in another order) reads without an error unless the parts are
// checked; checked, the roots, bound to the manifest the parts were
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
		require.EqualError(t, res.Stop, fmt.Sprintf("page %s: part 0: root: part checksum mismatch", keys[1]))
		require.ErrorIs(t, res.Stop, partsum.ErrMismatch)
		require.Equal(t, 1, res.Hit)
		checkPool(t, rd.Geometry(), before, regions, keys, slots, 1)

		// Unchecked, the forged claim is served as a hit of wrong bytes.
		rd, regions = newReader(t, b.st, small, tp2pp2, placement.Rank{PP: 1}, "page_first", 3, reshard.ReaderOptions{})
		res, err = rd.Read(context.Background(), keys, slots, regions)
		require.NoError(t, err)
		require.NoError(t, res.Stop)
		require.Equal(t, 3, res.Hit)
		require.Error(t, verifyPage(rd, regions, slots[1], keys[1]))
	})
}

// TestCheckPartsStrategies reads pages of four part layouts, one of them
// run by the interpreter, with CheckParts and every planner strategy:
// every byte of the pool is right, each part's trailer is read once a page,
// and every other read holds whole checksum blocks.
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
			{"staged small bound", plan.Options{Strategy: plan.Staged, StageBytes: 4000, MaxGap: 64}},
			{"auto memory", plan.Options{Strategy: plan.Auto}},
			{"auto redis", plan.Options{Strategy: plan.Auto, Transport: &redis}},
		} {
			t.Run(c.name, func(t *testing.T) {
				sp := newViewSpy(b.st)
				var st store.Store = sp
				if _, ok := b.st.(store.Viewer); !ok {
					st = sp.spy
				}
				trailers := map[string]int{}
				sp.readRanges = func(ctx context.Context, rs []store.Range) (int, error) {
					for _, r := range rs {
						i := slicesIndex(keys, r.Key)
						pb := mans[i].PartBytes(r.Part)
						switch {
						case r.Off == pb:
							require.Equal(t, partsum.TrailerLen(pb), r.Len())
							trailers[fmt.Sprintf("%d/%d", i, r.Part)]++
						default:
							require.Zero(t, r.Off%partsum.Block, "%s part %d [%d,+%d)", r.Key, r.Part, r.Off, r.Len())
							end := r.Off + r.Len()
							require.True(t, end%partsum.Block == 0 || end == pb, "%s part %d [%d,%d) of %d", r.Key, r.Part, r.Off, end, pb)
						}
					}
					return b.st.ReadRanges(ctx, rs)
				}
				// Rank 1/1 of TP 2 x PP 2: heads 2-3, layers 3-5, in parts
				// 1 and 2 of TP 1 x PP 3.
				rd, regions := newReader(t, st, small, tp2pp2, placement.Rank{TP: 1, PP: 1}, "page_first", len(slots), reshard.ReaderOptions{Plan: c.opts, CheckParts: true})
				readAll(t, rd, keys, slots, regions)
				require.Equal(t, int64(2*len(keys)), rd.Stats().PartsChecked)
				if st == sp {
					require.Equal(t, 2*len(keys), sp.Calls("ViewPart"), "a store that lends its parts lends each needed part once")
					require.Empty(t, trailers)
					return
				}
				want := map[string]int{}
				for i := range keys {
					want[fmt.Sprintf("%d/1", i)], want[fmt.Sprintf("%d/2", i)] = 1, 1
				}
				require.Equal(t, want, trailers)
			})
		}
	})
}

// TestLentPartsCheckedOnce: a reader checks a part a store lends it the
// first time it sees it (lent bytes never change); a part that failed is
// checked, and fails, again; another reader checks for itself. Page 3 has
// a flipped byte in part 1.
func TestLentPartsCheckedOnce(t *testing.T) {
	b := backend{name: "mem", st: memstore.New()}
	keys := content.PageKeys("lent", small.Domain(), 4)
	corruptPage(t, b, keys, 3)
	opts := reshard.ReaderOptions{Plan: plan.Options{Strategy: plan.Staged, MaxGap: 1 << 20}, CheckParts: true}
	for range 2 {
		rd, regions := newReader(t, b.st, small, tp2pp2, placement.Rank{}, "page_first", 4, opts)
		for n := 1; n <= 3; n++ {
			before := clone(regions)
			res, err := rd.Read(context.Background(), keys, iota(4), regions)
			require.NoError(t, err)
			require.EqualError(t, res.Stop, fmt.Sprintf("page %s: part 1: block 0 (bytes 0-1024): part checksum mismatch", keys[3]))
			require.Equal(t, 3, res.Hit)
			checkPool(t, rd.Geometry(), before, regions, keys, iota(4), 3)
			st := rd.Stats()
			// Pages 0-2 and part 0 of page 3 once, the bad part 1 each time.
			require.Equal(t, int64(3*2+1+n), st.PartsChecked, "read %d", n)
			require.Equal(t, int64(n), st.ChecksumErrors)
		}
	}
}
