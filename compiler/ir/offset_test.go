package ir_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler/ir"
)

// TestElementOffset: the dense offset of an element is the order's mixed
// radix, split axes by their quotient and remainder.
func TestElementOffset(t *testing.T) {
	l, err := ir.ParseLayout(ir.Part, "x", "C L H D/8 T D%8")
	require.NoError(t, err)
	size := map[ir.Axis]int{ir.C: 2, ir.L: 3, ir.H: 4, ir.T: 5, ir.D: 16}
	extent := func(m ir.Mode) int {
		switch m.Split {
		case ir.Outer:
			return size[m.Axis] / m.Factor
		case ir.Inner:
			return m.Factor
		}
		return size[m.Axis]
	}
	at := map[ir.Axis]int{ir.C: 1, ir.L: 2, ir.H: 3, ir.T: 4, ir.D: 13}
	got := l.ElementOffset(extent, func(a ir.Axis) int { return at[a] })
	// C L H D/8 T D%8 with extents 2 3 4 2 5 8 at 1 2 3 1 4 5.
	want := ((((1*3+2)*4+3)*2+1)*5+4)*8 + 5
	require.Equal(t, want, got)
	require.Equal(t, 0, l.ElementOffset(extent, func(ir.Axis) int { return 0 }))
}
