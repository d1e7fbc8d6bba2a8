package compiler_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler"
	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/dsl"
)

func mustLayout(t *testing.T, kind ir.Kind, name, order string) *ir.Layout {
	t.Helper()
	l, err := ir.ParseLayout(kind, name, order)
	require.NoError(t, err)
	return l
}

func TestParseLayout(t *testing.T) {
	l := mustLayout(t, ir.Pool, "xpool", "C S L H D/8 T D%8")
	require.Equal(t, "pool(C S L H D/8 T D%8)", l.Identity())
	require.Equal(t, "pool xpool { order C S L H D/8 T D%8 }", l.String())
	require.Equal(t, 8, l.SplitOf(ir.D))
	require.Equal(t, 0, l.SplitOf(ir.T))
	require.True(t, l.COuter())
	require.False(t, mustLayout(t, ir.Part, "flash", "L C T H D").COuter())

	_, err := ir.ParseLayout(ir.Part, "bad", "C S T L H D")
	require.Error(t, err)
	require.Contains(t, err.Error(), "part layout bad has a slot axis S; only pool layouts have one")
}

// TestIdentityIgnoresNames: the identity, the key and the digest of a pair
// depend on the orders, never on the names, so that two files declaring
// the same layouts under other names register the same kernels.
func TestIdentityIgnoresNames(t *testing.T) {
	a, err := ir.Lower(mustLayout(t, ir.Part, "PLHD", "C T L H D"), mustLayout(t, ir.Pool, "page_head", "C S H T L D"))
	require.NoError(t, err)
	b, err := ir.Lower(mustLayout(t, ir.Part, "mine", "C T L H D"), mustLayout(t, ir.Pool, "theirs", "C S H T L D"))
	require.NoError(t, err)
	require.Equal(t, "part(C T L H D) -> pool(C S H T L D)", a.Key())
	require.Equal(t, a.Key(), b.Key())
	require.Equal(t, a.Digest(), b.Digest())
	require.Len(t, a.Digest(), 16)

	c, err := ir.Lower(mustLayout(t, ir.Part, "PLHD", "C T L H D"), mustLayout(t, ir.Pool, "page_first", "C S T L H D"))
	require.NoError(t, err)
	require.NotEqual(t, a.Digest(), c.Digest())
}

func TestLowerErrors(t *testing.T) {
	_, err := ir.Lower(mustLayout(t, ir.Pool, "a", "C S T L H D"), mustLayout(t, ir.Pool, "b", "C S H T L D"))
	require.EqualError(t, err, "no kernel from pool a to pool b: one side of a transfer is a store part")
}

// TestDifferentFactors: layouts that split an axis by different factors
// form pairs like any others, whether the factors nest or not, in one file
// or across files; each pair's loops carry the refinement.
func TestDifferentFactors(t *testing.T) {
	f, err := compiler.Compile("split.kvl", []byte(`part t4 { order C T/4 L H T%4 D }
pool t2 { order C S T/2 L H T%2 D }
pool x8 { order C S L H D/8 T D%8 }
pool x4 { order C S L H D/4 T D%4 }
part plain { order C T L H D }
part x6 { order C L H D/6 T D%6 }
`))
	require.NoError(t, err)
	// 3 parts with 6 layouts each, 3 pools with 3 parts each.
	require.Len(t, f.Ranges, 27)
	modes := map[string][]string{}
	for _, p := range f.Ranges {
		var ms []string
		for _, lp := range p.Loops {
			s := lp.Mode.String()
			if lp.IsMixed() {
				s += "*"
			}
			ms = append(ms, s)
		}
		modes[p.Src.Name+"->"+p.Dst.Name] = ms
	}
	// T/4 against T/2: blocks of 4, pairs within a block, tokens in a pair.
	require.Equal(t, []string{"C", "T/4", "L", "H", "T%4/2", "T%2", "D"}, modes["t4->t2"])
	require.Equal(t, modes["t4->t2"], modes["t2->t4"]) // both follow the part
	var t4, t2 *ir.Layout
	for _, l := range f.Layouts {
		switch l.Name {
		case "t4":
			t4 = l
		case "t2":
			t2 = l
		}
	}
	cp, err := ir.LowerIn(t4, t2, ir.Dst) // a copy follows the pool
	require.NoError(t, err)
	require.Equal(t, []ir.Axis{ir.C, ir.T, ir.T, ir.L, ir.H, ir.T, ir.D}, axes(cp))
	require.Equal(t, "T%4/2", cp.Loops[2].Mode.String())
	// D/6 against D/8: only pairs of elements are common; the other side
	// places the blocks of 2 through a Mixed.
	require.Equal(t, []string{"C", "L", "H", "D/6*", "T", "D%6/2*", "D%2"}, modes["x6->x8"])
	require.Equal(t, modes["x6->x8"], modes["x8->x6"])
	// D/4 against D/6: the same through blocks of 2.
	require.Equal(t, []string{"C", "L", "H", "D/6*", "T", "D%6/2*", "D%2"}, modes["x6->x4"])

	_, err = compiler.CompileAll(
		compiler.Source{Name: "a.kvl", Text: []byte("part x8 { order C L H D/8 T D%8 }\n")},
		compiler.Source{Name: "b.kvl", Text: []byte("pool x3 { order S L H D/3 C T D%3 }\n")},
	)
	require.NoError(t, err)
}

func TestCompileAll(t *testing.T) {
	f, err := compiler.CompileAll(
		compiler.Source{Name: "dir/a.kvl", Text: []byte("part PLHD { order C T L H D }\n")},
		compiler.Source{Name: "b.kvl", Text: []byte("pool page_head { order C S H T L D }\n")},
	)
	require.NoError(t, err)
	require.Equal(t, "a.kvl, b.kvl", f.Name)
	var pairs []string
	for _, p := range f.Ranges {
		pairs = append(pairs, p.Src.Name+" -> "+p.Dst.Name)
	}
	// Pool to pool is no pair.
	require.Equal(t, []string{"PLHD -> PLHD", "PLHD -> page_head", "page_head -> PLHD"}, pairs)
	require.Equal(t, "dir/a.kvl:1:1", f.Layouts[0].Pos) // as the file was named
	require.Equal(t, "b.kvl:1:1", f.Layouts[1].Pos)
}

func TestCompileAllErrors(t *testing.T) {
	// Names are unique across files; a duplicate cites the first by file.
	_, err := compiler.CompileAll(
		compiler.Source{Name: "a.kvl", Text: []byte("part x { order C T L H D }\n")},
		compiler.Source{Name: "b.kvl", Text: []byte("// b\npart x { order C L T H D }\n")},
	)
	require.EqualError(t, err, `b.kvl:2:1: duplicate layout "x", first defined at a.kvl:1:1`)

	// Every file's errors are reported, in the order of the files.
	_, err = compiler.CompileAll(
		compiler.Source{Name: "a.kvl", Text: []byte("part x { order C T L H }\n")},
		compiler.Source{Name: "b.kvl", Text: []byte("pool y { order C T L H D }\n")},
	)
	var list dsl.ErrorList
	require.ErrorAs(t, err, &list)
	require.EqualError(t, err, "a.kvl:1:1: layout x is missing axis D\nb.kvl:1:1: pool layout y has no slot axis S")
}

// TestWrites: a pool's writes clause names a part layout of the unit, in
// any of its files; the IR layout carries the name.
func TestWrites(t *testing.T) {
	f, err := compiler.CompileAll(
		compiler.Source{Name: "a.kvl", Text: []byte("pool p { order C S L T H D writes x }\n")},
		compiler.Source{Name: "b.kvl", Text: []byte("part x { order C L T H D }\n")},
	)
	require.NoError(t, err)
	require.Equal(t, "x", f.Layouts[0].Writes)
	require.Equal(t, "pool p { order C S L T H D writes x }", f.Layouts[0].String())

	_, err = compiler.CompileAll(
		compiler.Source{Name: "a.kvl", Text: []byte("part x { order C T L H D }\npart y { order C L T H D }\n" +
			"pool p { order C S T L H D writes z }\npool q { order C S T L H D writes p }\n")},
	)
	require.EqualError(t, err, `a.kvl:3:35: pool layout p writes unknown layout "z"; part layouts are x, y`+"\n"+
		`a.kvl:4:35: pool layout q writes p, a pool layout; it writes a part layout`)
	_, err = compiler.Compile("a.kvl", []byte("pool p { order C S T L H D writes z }\n"))
	require.EqualError(t, err, `a.kvl:1:35: pool layout p writes unknown layout "z"; no part layout is declared`)
}

func TestExpr(t *testing.T) {
	e := ir.Of(ir.SymDim).Mul(ir.Lit(4)).Mul(ir.Of(ir.SymItem)).
		Mul(ir.Expr{Const: 1, Factors: []ir.Factor{{Sym: ir.SymPage, Div: 4}}})
	require.Equal(t, "4*I*T/4*D", e.String())
	require.Equal(t, "1", ir.Lit(1).String())
	require.Equal(t, "I", ir.Of(ir.SymItem).String())
	var env ir.Env
	env[ir.SymItem], env[ir.SymPage], env[ir.SymDim] = 2, 64, 128
	require.Equal(t, 4*2*16*128, e.Eval(&env))
	require.True(t, e.Has(ir.SymPage))
	require.False(t, e.Has(ir.SymCommonHeads))
	require.True(t, e.Equal(ir.Of(ir.SymItem).Mul(ir.Lit(4)).Mul(ir.Of(ir.SymDim)).
		Mul(ir.Expr{Const: 1, Factors: []ir.Factor{{Sym: ir.SymPage, Div: 4}}})))
	require.False(t, e.Equal(ir.Of(ir.SymItem)))
}
