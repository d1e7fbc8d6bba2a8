package compiler_test

import (
	"testing"

	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/stretchr/testify/require"
)

func TestSlotPool(t *testing.T) {
	for _, c := range []struct{ order, want string }{
		{"C T L H D", "pool(C S T L H D)"}, // PLHD's is page_first
		{"L C T H D", "pool(S L C T H D)"},
		{"C L H D/8 T D%8", "pool(C S L H D/8 T D%8)"},
	} {
		l, err := ir.ParseLayout(ir.Part, "x", c.order)
		require.NoError(t, err)
		p := l.SlotPool()
		require.Equal(t, c.want, p.Identity())
		require.Equal(t, "x_pool", p.Name)
		// A valid pool: the checker accepts its order.
		_, err = ir.ParseLayout(ir.Pool, p.Name, p.Order())
		require.NoError(t, err)
		require.Equal(t, c.order, l.Order(), "SlotPool must not change its part layout")
	}
}
