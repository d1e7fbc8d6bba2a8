package plan_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/runtime/partsum"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
)

// TestCheckedByteExact builds the checked plan of random cases' templates,
// every strategy, with random staging bounds and gaps: it is staged and
// verifies; its reads hold whole checksum blocks of every run; it reads
// one trailer per part it reads; run as a reader runs it, checking each
// read's blocks against the parts' real sums before copying, every element
// of the page is right; and a byte flipped in any block a read checks is
// caught.
func TestCheckedByteExact(t *testing.T) {
	n := 120
	if testing.Short() {
		n = 30
	}
	r := rand.New(rand.NewPCG(8, 8))
	for i := range n {
		c := randomStratCase(t, r)
		seed := r.Uint64()
		m, direct := c.planner(t, plan.Options{})
		parts := fillParts(t, m, seed)
		trailers := make([][]byte, len(parts))
		for p, data := range parts {
			trailers[p] = partsum.Trailer("page", m.Key(), p, [][]byte{data})
		}
		want := direct.Geometry().NewRegions()
		dtpl, err := direct.Template(m)
		require.NoError(t, err)
		apply(direct, dtpl, c.slot, parts, want)
		s := []plan.Strategy{plan.Direct, plan.Scatter, plan.Staged, plan.Auto}[r.IntN(4)]
		tr := []func() plan.Transport{plan.MemoryTransport, plan.FileTransport, plan.RedisTransport}[r.IntN(3)]()
		opts := plan.Options{Strategy: s, Transport: &tr,
			StageBytes: []int{4 << 10, 16 << 10, 1 << 20}[r.IntN(3)],
			MaxGap:     []int{-1, 0, 16, 1 << 20}[r.IntN(4)]}
		_, p := c.planner(t, opts)
		tpl, err := p.Template(m)
		require.NoError(t, err, "case %d: %s", i, c.String())
		pl, err := p.Checked(tpl)
		require.NoError(t, err, "case %d: %s", i, c.String())
		name := fmt.Sprintf("case %d (%s from %s): %s", i, s, tpl.Strategy, c.String())
		require.True(t, pl.Checked, name)
		require.Equal(t, plan.Staged, pl.Strategy, name)
		require.NoError(t, p.Verify(pl), name)
		require.Equal(t, tpl.Bytes, pl.Bytes, name)
		checkBounds(t, pl, 0, opts.StageBytes)

		// One trailer per part read, in part order, placed one after the
		// other.
		var read []int32
		for _, rd := range pl.Reads {
			if len(read) == 0 || read[len(read)-1] != rd.Part {
				read = append(read, rd.Part)
			}
		}
		at := 0
		require.Len(t, pl.Trailers, len(read), name)
		for k, tr := range pl.Trailers {
			n := m.PartBytes(int(read[k]))
			require.Equal(t, plan.Read{Part: read[k], Src: n, Len: partsum.TrailerLen(n), Stage: at}, tr, name)
			require.Equal(t, k, pl.Trailer(tr.Part), name)
			at += tr.Len
		}
		require.Equal(t, -1, pl.Trailer(int32(len(m.Parts))), name)

		// Run it: check each read's blocks, then copy.
		got := p.Geometry().NewRegions()
		stage := make([]byte, pl.StageBytes)
		for k, rd := range pl.Reads {
			require.Zero(t, rd.Src%partsum.Block, name)
			n := m.PartBytes(int(rd.Part))
			require.True(t, (rd.Src+rd.Len)%partsum.Block == 0 || rd.Src+rd.Len == n, name)
			b := stage[rd.Stage : rd.Stage+rd.Len]
			copy(b, parts[rd.Part][rd.Src:rd.Src+rd.Len])
			sums := trailers[rd.Part][:len(trailers[rd.Part])-8]
			for _, bc := range pl.ReadChecks(k) {
				lo, hi := bc.First*partsum.Block-rd.Src, min((bc.First+bc.N)*partsum.Block, n)-rd.Src
				require.NoError(t, partsum.CheckBlocks(int(rd.Part), n, sums, bc.First, b[lo:hi]), name)
				// A flipped byte of a checked block is caught.
				at := lo + r.IntN(hi-lo)
				b[at] ^= 1
				require.ErrorIs(t, partsum.CheckBlocks(int(rd.Part), n, sums, bc.First, b[lo:hi]), partsum.ErrMismatch, name)
				b[at] ^= 1
			}
			p.CopyStaged(pl, k, b, got, c.slot)
		}
		require.NoError(t, content.Verify(p.Geometry(), got, c.slot, seed), name)
		require.Equal(t, want, got, name)
	}
}

// TestCheckedVerify: the proof of a checked plan refuses checks that do
// not cover a run, checks outside their read, a missing or misplaced
// trailer, and checks on a plan that is not checked.
func TestCheckedVerify(t *testing.T) {
	// Two parts of 256 bytes (TP 2), read whole by one TP 1 rank.
	s := scenario{d: desc(2, 2, []int{8, 8}, "fp16", 4), src: placement.Topology{TP: 2, PP: 1}, srcL: builtin(t, "PLHD"),
		dst: placement.Topology{TP: 1, PP: 1}, dstL: builtin(t, "layer_first"), slots: 2, opts: plan.Options{Strategy: plan.Staged}}
	m, p := s.build(t)
	tpl, err := p.Template(m)
	require.NoError(t, err)
	pl, err := p.Checked(tpl)
	require.NoError(t, err)
	require.NoError(t, p.Verify(pl))
	require.Len(t, pl.Reads, 2)
	n := m.PartBytes(int(pl.Reads[0].Part))
	for _, c := range []struct {
		name   string
		change func(pl *plan.Plan)
		err    string
	}{
		{"a run not checked", func(pl *plan.Plan) {
			pl.Checks = slices.Clone(pl.Checks)
			pl.Checks[0].First++
			pl.Checks[0].N--
		}, "plan does not cover the requirement: byte 0 of op 0 (part 0) is in no checked block of read 0"},
		{"a check outside its read", func(pl *plan.Plan) {
			pl.Checks = slices.Clone(pl.Checks)
			pl.Checks[0].N += 100
		}, fmt.Sprintf("plan op out of bounds: read 0 ([0,%d) of part 0) checks blocks [0,%d), outside it", pl.Reads[0].Len, pl.Checks[0].N+100)},
		{"no trailer", func(pl *plan.Plan) {
			pl.ReadBytes -= pl.Trailers[1].Len
			pl.Trailers = pl.Trailers[:1]
		},
			fmt.Sprintf("plan does not cover the requirement: part %d, read by read 1, has no trailer read", pl.Reads[1].Part)},
		{"a trailer too short", func(pl *plan.Plan) {
			pl.Trailers = slices.Clone(pl.Trailers)
			pl.Trailers[0].Len--
			pl.ReadBytes--
		}, fmt.Sprintf("plan does not cover the requirement: trailer read 0 reads [%d,%d) of part 0 to 0, not its trailer [%d,%d) to 0", n, n+partsum.TrailerLen(n)-1, n, n+partsum.TrailerLen(n))},
		{"trailers overlap", func(pl *plan.Plan) {
			pl.Trailers = slices.Clone(pl.Trailers)
			pl.Trailers[1].Stage = 0
		}, fmt.Sprintf("plan does not cover the requirement: trailer read 1 reads [%d,%d) of part 1 to 0, not its trailer [%d,%d) to %d", n, n+partsum.TrailerLen(n), n, n+partsum.TrailerLen(n), partsum.TrailerLen(n))},
		{"read bytes without the trailers", func(pl *plan.Plan) { pl.ReadBytes -= pl.Trailers[0].Len },
			fmt.Sprintf("plan does not cover the requirement: the plan says its reads move %d bytes but they move %d", pl.ReadBytes-pl.Trailers[0].Len, pl.ReadBytes)},
		{"checks on a plan not checked", func(pl *plan.Plan) { pl.Checked = false },
			"plan reads do not fit its strategy: a plan that is not checked has checks"},
	} {
		t.Run(c.name, func(t *testing.T) {
			bad := *pl
			c.change(&bad)
			require.EqualError(t, p.Verify(&bad), c.err)
		})
	}
}
