package plan

import (
	"fmt"
	"time"

	"github.com/kvreshard/kvreshard/runtime/partsum"
)

// BlockRange is a run of checksum blocks (partsum.Block bytes each) of a
// part that a read of a checked plan holds: blocks [First, First+N), whose
// bytes start at offset First*partsum.Block-Src of the read.
type BlockRange struct {
	First, N int
}

// Checked returns the checked plan of template tpl: a staged plan of the
// same runs whose reads hold the whole checksum blocks of every run, and
// which also reads the trailer (sums and root, package partsum) of every
// part it takes runs from, into memory of its own: trailer i at offset
// Trailers[i].Stage of the page's trailers, one after the other. A reader checks each part's root and each block
// a run takes (Plan.ReadChecks) before it copies the run out of staging,
// so that no byte reaches the pool unchecked. Its reads follow the
// planner's staging bound and gap, as a staged template does; a part read
// whole is copied by the pair's kernel.
func (p *Planner) Checked(tpl *Plan) (*Plan, error) {
	m := tpl.Manifest
	k, err := p.kernelsFor(m)
	if err != nil {
		return nil, err
	}
	pl := p.staged(m, k, tpl, sourceOrder(tpl.Ops), true)
	pl.Checked, pl.TokenLists = true, tpl.TokenLists
	pl.checkAt = make([]int, 0, len(pl.Reads)+1)
	at := 0 // where the next trailer goes in the page's trailer memory
	for i := range pl.Reads {
		r := &pl.Reads[i]
		pl.checkAt = append(pl.checkAt, len(pl.Checks))
		for _, op := range pl.Ops[r.First : r.First+r.N] {
			first := op.Src / partsum.Block
			end := (op.Src + op.Len + partsum.Block - 1) / partsum.Block
			if n := len(pl.Checks); n > pl.checkAt[i] && pl.Checks[n-1].First+pl.Checks[n-1].N >= first {
				c := &pl.Checks[n-1]
				c.N = max(c.N, end-c.First)
				continue
			}
			pl.Checks = append(pl.Checks, BlockRange{First: first, N: end - first})
		}
		if i == 0 || pl.Reads[i-1].Part != r.Part {
			size := m.PartBytes(int(r.Part))
			n := partsum.TrailerLen(size)
			pl.Trailers = append(pl.Trailers, Read{Part: r.Part, Src: size, Len: n, Stage: at})
			pl.ReadBytes += n
			at += n
		}
	}
	pl.checkAt = append(pl.checkAt, len(pl.Checks))
	if err := p.Verify(pl); err != nil {
		return nil, err
	}
	pl.Estimate = p.opts.Transport.Estimate(pl)
	pl.Estimates = [Auto]time.Duration{Staged: pl.Estimate}
	return pl, nil
}

// ReadChecks returns the checksum blocks that read i of a checked plan
// holds and its reader checks: those of its runs.
func (pl *Plan) ReadChecks(i int) []BlockRange {
	if !pl.Checked {
		return nil
	}
	return pl.Checks[pl.checkAt[i]:pl.checkAt[i+1]]
}

// Trailer returns the index in Trailers of the trailer of part part of a
// checked plan, or -1 when the plan reads nothing of that part.
func (pl *Plan) Trailer(part int32) int {
	lo, hi := 0, len(pl.Trailers)
	for lo < hi {
		mid := (lo + hi) / 2
		switch t := pl.Trailers[mid].Part; {
		case t == part:
			return mid
		case t < part:
			lo = mid + 1
		default:
			hi = mid
		}
	}
	return -1
}

// verifyChecked proves what a checked plan adds to a staged one: exactly
// one trailer read per part it reads, each the whole trailer of its part,
// in part order, placed one after the other; and checks that lie within
// their reads and cover every byte of every run.
func verifyChecked(pl *Plan, partBytes []int) error {
	if !pl.Checked {
		if pl.Trailers != nil || pl.Checks != nil {
			return fmt.Errorf("%w: a plan that is not checked has checks", ErrStrategy)
		}
		return nil
	}
	if pl.Strategy != Staged || len(pl.checkAt) != len(pl.Reads)+1 {
		return fmt.Errorf("%w: a checked plan is staged, with the checks of each read", ErrStrategy)
	}
	t, at := 0, 0
	for i, r := range pl.Reads {
		if i == 0 || pl.Reads[i-1].Part != r.Part {
			if t >= len(pl.Trailers) || pl.Trailers[t].Part != r.Part {
				return fmt.Errorf("%w: part %d, read by read %d, has no trailer read", ErrCoverage, r.Part, i)
			}
			n := partBytes[r.Part]
			if tr := pl.Trailers[t]; tr.Src != n || tr.Len != partsum.TrailerLen(n) || tr.Stage != at {
				return fmt.Errorf("%w: trailer read %d reads [%d,%d) of part %d to %d, not its trailer [%d,%d) to %d", ErrCoverage, t, tr.Src, tr.Src+tr.Len, r.Part, tr.Stage, n, n+partsum.TrailerLen(n), at)
			}
			at += pl.Trailers[t].Len
			t++
		} else if pl.Reads[i-1].Part > r.Part {
			return fmt.Errorf("%w: read %d reads part %d after part %d", ErrStrategy, i, r.Part, pl.Reads[i-1].Part)
		}
		n := partBytes[r.Part]
		checks := pl.ReadChecks(i)
		c := 0
		for j, op := range pl.Ops[r.First : r.First+r.N] {
			for at := op.Src; at < op.Src+op.Len; {
				for c < len(checks) && (checks[c].First+checks[c].N)*partsum.Block <= at {
					c++
				}
				if c == len(checks) || checks[c].First*partsum.Block > at {
					return fmt.Errorf("%w: byte %d of op %d (part %d) is in no checked block of read %d", ErrCoverage, at, r.First+j, op.Part, i)
				}
				at = (checks[c].First + checks[c].N) * partsum.Block
			}
		}
		for _, b := range checks {
			lo, hi := b.First*partsum.Block, min((b.First+b.N)*partsum.Block, n)
			if b.N < 1 || b.First+b.N > partsum.Blocks(n) || lo < r.Src || hi > r.Src+r.Len {
				return fmt.Errorf("%w: read %d ([%d,%d) of part %d) checks blocks [%d,%d), outside it", ErrBounds, i, r.Src, r.Src+r.Len, r.Part, b.First, b.First+b.N)
			}
		}
	}
	if t != len(pl.Trailers) {
		return fmt.Errorf("%w: %d trailer reads for the %d parts read", ErrCoverage, len(pl.Trailers), t)
	}
	return nil
}
