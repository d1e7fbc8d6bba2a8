package compiler_test

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/dsl"
)

// TestOrderParsersAgree: the IR's own order parser, which the runtime
// uses, accepts exactly the orders the .kvl parser accepts, reads the same
// modes, and fails with the same message, on random orders made of the
// language's tokens and of characters it has none for.
func TestOrderParsersAgree(t *testing.T) {
	pieces := []string{"C", "S", "T", "L", "H", "D", "X", "Tx", "/", "%", "2", "4", "8", "0", "1", "007",
		"2097152", "99999999999999999999", " ", " ", " ", "\n", "\t", "{", "}", "order", "part", "partX",
		`"s"`, `"b\q"`, `"open`, "// note\n", "@", "\xff", "é", "\v"}
	kinds := []string{"part", "part", "pool", "slab"}
	names := []string{"x", "x", "page_first", "order", "a b", ""}
	r := rand.New(rand.NewPCG(29, 31))
	accepted, n := 0, 20000
	if testing.Short() {
		n = 5000
	}
	for i := range n {
		var b strings.Builder
		if i%2 == 0 {
			// Mostly valid orders with a few changes, so that the checks
			// past the syntax run too.
			axes := []string{"C", "T", "L", "H", "D"}
			if r.IntN(2) == 0 {
				axes = append(axes, "S")
			}
			r.Shuffle(len(axes), func(i, j int) { axes[i], axes[j] = axes[j], axes[i] })
			for _, a := range axes {
				if (a == "T" || a == "D") && r.IntN(3) == 0 {
					f := []string{"2", "4", "1", "0"}[r.IntN(4)]
					a = a + "/" + f + " " + a + "%" + []string{"2", "4"}[r.IntN(2)]
				}
				b.WriteString(a + " ")
				if r.IntN(12) == 0 {
					b.WriteString(pieces[r.IntN(len(pieces))])
				}
			}
		} else {
			for range r.IntN(12) {
				b.WriteString(pieces[r.IntN(len(pieces))])
			}
		}
		kind, name, order := kinds[r.IntN(len(kinds))], names[r.IntN(len(names))], b.String()
		want, werr := dsl.ParseOrder(kind, name, order)
		got, gerr := ir.ParseOrder(kind, name, order)
		if werr != nil {
			require.Error(t, gerr, "%s %s %q", kind, name, order)
			require.Equal(t, werr.Error(), gerr.Error(), "%s %s %q", kind, name, order)
			continue
		}
		require.NoError(t, gerr, "%s %s %q", kind, name, order)
		require.Equal(t, want.OrderString(), got.OrderString())
		accepted++
	}
	require.Greater(t, accepted, n/40)
}

// TestOrderErrorsAreKvlcs: an order text that ParseOrder refuses (what
// define_layout from C and Python runs) fails with the errors kvlc gives
// for the same layout in a .kvl file, in the same order; only positions
// differ (columns of the order against lines and columns of the file).
func TestOrderErrorsAreKvlcs(t *testing.T) {
	firstAt := regexp.MustCompile(`first at [0-9]+:[0-9]+`)
	for _, c := range []struct{ kind, order string }{
		{"part", "C T T H D"}, {"part", "C S T L H D"}, {"part", "C T L H"}, {"part", "C L H D/8 T D%4"},
		{"part", "C T L H Q"}, {"part", "C T L H D%8 D/8"}, {"part", "C T L H D D"}, {"part", "C T L H D/0 D%0"},
		{"part", "c t l h d"}, {"part", "C T L H D extra"}, {"part", "C T/1 T%1 L H D"}, {"part", "C L/2 L%2 T H D"},
		{"pool", "C T T H D"}, {"pool", "C T L H D"}, {"pool", "C S S T L H D"}, {"pool", "S C T L H D/8"},
	} {
		kvl := fmt.Sprintf("%s x {\n\torder %s\n}\n", c.kind, c.order)
		_, err := dsl.Parse("x.kvl", []byte(kvl))
		var list dsl.ErrorList
		require.ErrorAs(t, err, &list, kvl)
		var want []string
		for _, e := range list {
			want = append(want, firstAt.ReplaceAllString(e.Msg, "first at P"))
		}
		_, err = ir.ParseOrder(c.kind, "x", c.order)
		var oe *ir.OrderError
		require.ErrorAs(t, err, &oe, c.order)
		var got []string
		for _, e := range oe.Errs {
			got = append(got, firstAt.ReplaceAllString(e.Msg, "first at P"))
		}
		require.Equal(t, want, got, "%s %q", c.kind, c.order)
	}
}

// FuzzOrderParsersAgree: on any text, the IR's order parser and the .kvl
// parser agree: both accept with the same modes, or both refuse with the
// same message. Neither panics.
func FuzzOrderParsersAgree(f *testing.F) {
	for _, s := range []string{"C T L H D", "C S T L H D", "C L H D/8 T D%8", "T/4 C T%4 L H D", "S", "C C", "D/0", "T/99999999999999999999", "\xff"} {
		f.Add("part", s)
		f.Add("pool", s)
	}
	f.Fuzz(func(t *testing.T, kind, order string) {
		want, werr := dsl.ParseOrder(kind, "x", order)
		got, gerr := ir.ParseOrder(kind, "x", order)
		if werr != nil {
			if gerr == nil || werr.Error() != gerr.Error() {
				t.Fatalf("%s %q: the .kvl parser says %v, the IR's %v", kind, order, werr, gerr)
			}
			return
		}
		if gerr != nil {
			t.Fatalf("%s %q: the .kvl parser accepts, the IR's says %v", kind, order, gerr)
		}
		if want.OrderString() != got.OrderString() {
			t.Fatalf("%s %q: %s against %s", kind, order, want.OrderString(), got.OrderString())
		}
	})
}
