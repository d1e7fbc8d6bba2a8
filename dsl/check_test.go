package dsl

import (
	"errors"
	"testing"

	"github.com/alecthomas/participle/v2/lexer"
	"github.com/stretchr/testify/require"
)

func TestParseBuiltins(t *testing.T) {
	f, err := Parse("builtin.kvl", []byte(builtins))
	require.NoError(t, err)
	require.Len(t, f.Decls, 10)
	x := f.Decls[7]
	require.Equal(t, "part", x.Kind)
	require.Equal(t, "vllm_xblock", x.Name)
	require.Equal(t, "vLLM x-blocked", x.Doc)
	require.Equal(t, "C L H D/8 T D%8", x.OrderString())
	require.Equal(t, &Mode{Pos: x.Order[3].Pos, Axis: "D", Op: "/", Factor: 8}, x.Order[3])
	require.Equal(t, lexer.Position{Filename: "builtin.kvl", Offset: x.Order[3].Pos.Offset, Line: 13, Column: 49}, x.Order[3].Pos)
	require.Equal(t, 13, x.Pos.Line)
	require.Equal(t, 1, x.Pos.Column)
	require.Equal(t, "", f.Decls[3].Doc)
	require.Equal(t, "pool", f.Decls[3].Kind)
	require.Equal(t, `part PLHD "token-major; SGLang page_first" { order C T L H D }`, f.Decls[0].String())
	require.Equal(t, `pool page_first { order C S T L H D }`, f.Decls[3].String())
}

func TestModeString(t *testing.T) {
	require.Equal(t, "D", (&Mode{Axis: "D"}).String())
	require.Equal(t, "D/8", (&Mode{Axis: "D", Op: "/", Factor: 8}).String())
	require.Equal(t, "T%16", (&Mode{Axis: "T", Op: "%", Factor: 16}).String())
}

func TestEmptyFile(t *testing.T) {
	for _, src := range []string{"", "\n\n", "// nothing here\n", "  \t\r\n// a\n// b"} {
		f, err := Parse("e.kvl", []byte(src))
		require.NoError(t, err, "%q", src)
		require.Empty(t, f.Decls)
		require.Equal(t, "", f.String())
	}
}

// TestErrors asserts the exact error list of each check, as Parse reports it
// for a file without a name.
func TestErrors(t *testing.T) {
	tests := []struct {
		name, src, want string
	}{
		{"unknown axis", `part X { order C T L H Q D }`,
			`1:24: unknown axis "Q"; axes are C, S, T, L, H, D`},
		{"unknown axis lower case", `part X { order C t L H D T }`,
			`1:18: unknown axis "t"; axes are C, S, T, L, H, D`},
		{"repeated axis", "part PLHD {\n  order C T L H D\n  T }",
			"3:3: axis T appears twice in layout PLHD, first at 2:11"},
		{"repeated axis three times", `part X { order C T L H D C C }`,
			"1:26: axis C appears twice in layout X, first at 1:16\n" +
				"1:28: axis C appears twice in layout X, first at 1:16"},
		{"repeated half", `part X { order C T L H D/8 D%8 D/8 }`,
			"1:32: axis D appears twice in layout X, first at 1:24"},
		{"whole after half", `part X { order C T L H D/8 D D%8 }`,
			"1:28: axis D appears twice in layout X, first at 1:24"},
		{"half after whole", `part X { order C T L H D D/8 D%8 }`,
			"1:26: axis D appears twice in layout X, first at 1:24\n" +
				"1:30: axis D appears twice in layout X, first at 1:24"},
		{"missing axis", `part PLHD { order C T L D }`,
			"1:1: layout PLHD is missing axis H"},
		{"missing several", `part X { order T }`,
			"1:1: layout X is missing axis C\n" +
				"1:1: layout X is missing axis L\n" +
				"1:1: layout X is missing axis H\n" +
				"1:1: layout X is missing axis D"},
		{"S in part", `part PLHD { order C S T L H D }`,
			"1:21: part layout PLHD has a slot axis S; only pool layouts have one"},
		{"S twice in part", `part X { order C S T L H D S }`,
			"1:18: part layout X has a slot axis S; only pool layouts have one\n" +
				"1:28: axis S appears twice in layout X, first at 1:18"},
		{"no S in pool", `pool page_first { order C T L H D }`,
			"1:1: pool layout page_first has no slot axis S"},
		{"duplicate name", "part PLHD { order C T L H D }\npart PLHD { order C L T H D }",
			`2:1: duplicate layout "PLHD", first defined at 1:1`},
		{"duplicate name across kinds", "part A { order C T L H D }\npart B { order C T L H D }\n  pool A { order C S T L H D }\npool B { order C S T L H D }",
			"3:3: duplicate layout \"A\", first defined at 1:1\n" +
				"4:1: duplicate layout \"B\", first defined at 2:1"},
		{"factor 0", `part X { order C T L H D/0 D%0 }`,
			"1:24: split factor of D must be a positive integer, got 0\n" +
				"1:28: split factor of D must be a positive integer, got 0"},
		{"factor 1", `part X { order C T L H D/1 D%1 }`,
			"1:24: split factor of D must be at least 2, got 1\n" +
				"1:28: split factor of D must be at least 2, got 1"},
		{"factor too large", `part X { order C T L H D/2097152 D%2097152 }`,
			"1:24: split factor of D must be at most 1048576, got 2097152\n" +
				"1:34: split factor of D must be at most 1048576, got 2097152"},
		{"factor at the maximum", `part X { order C T L H D/1048576 D%1048576 }`, ""},
		{"factor overflows", `part X { order C T L H D/99999999999999999999 D%8 }`,
			"1:26: split factor 99999999999999999999 is out of range; the maximum is 1048576"},
		{"leading zeros are decimal", `part X { order C T L H D/010 D%10 }`, ""},
		{"split L", `part X { order C T L/2 H D L%2 }`,
			"1:20: axis L cannot be split; only T and D can\n" +
				"1:28: axis L cannot be split; only T and D can"},
		{"split S", `pool X { order C S/2 T L H D }`,
			"1:18: axis S cannot be split; only T and D can"},
		{"outer without inner", `part X { order C T L H D/8 }`,
			"1:24: D/8 has no matching D%8"},
		{"inner without outer", `part X { order C T%16 L H D }`,
			"1:18: T%16 has no matching T/16"},
		{"different factors", `part X { order C L H D/8 T D%4 }`,
			"1:28: D/8 and D%4 split D by different factors"},
		{"inner before outer", `part X { order C L H D%8 T D/8 }`,
			"1:22: D%8 must come after D/8"},
		{"inner before outer, different factors", `part X { order C L H D%4 T D/8 }`,
			"1:22: D%4 must come after D/4\n" +
				"1:28: D/8 and D%4 split D by different factors"},
		{"both split", `part X { order C T/4 L H D/8 T%4 D%8 }`, ""},
		{"many errors in one file", "// header\n" +
			"part PLHD { order C T L H D }\n" +
			"part PLHD { order C S T L H Q }\n" +
			"pool P { order C T T L H D/4 }\n" +
			"part Z { order C T L H D%2 L/3 }\n",
			"3:1: layout PLHD is missing axis D\n" +
				"3:1: duplicate layout \"PLHD\", first defined at 2:1\n" +
				"3:21: part layout PLHD has a slot axis S; only pool layouts have one\n" +
				"3:29: unknown axis \"Q\"; axes are C, S, T, L, H, D\n" +
				"4:1: pool layout P has no slot axis S\n" +
				"4:20: axis T appears twice in layout P, first at 4:18\n" +
				"4:26: D/4 has no matching D%4\n" +
				"5:24: D%2 has no matching D/2\n" +
				"5:28: axis L cannot be split; only T and D can\n" +
				"5:28: axis L appears twice in layout Z, first at 5:20"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("", []byte(tt.src))
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			var list ErrorList
			require.True(t, errors.As(err, &list))
			require.Equal(t, tt.want, err.Error())
		})
	}
}

func TestSyntaxErrors(t *testing.T) {
	tests := []struct{ src, want string }{
		{"part X { order C T L H D", `1:25: unexpected end of input; expected an axis or "}"`},
		{"pool X { order C S T L H D writes }", `1:35: unexpected "}"; expected a part layout name`},
		{"pool X { order C S T L H D writes A B }", `1:37: unexpected "B"; expected "}"`},
		{"pool X { order C S T L H D writes A", `1:36: unexpected end of input; expected "}"`},
		{"pool X { order C S T L H D writes A order C }", `1:37: unexpected "order"; expected "}"`},
		{"pool X { writes A order C S T L H D }", `1:10: unexpected "writes"; expected "order"`},
		{"part writes { order C T L H D }", `1:6: unexpected "writes"; expected a layout name`},
		{"part X { order }", `1:16: unexpected "}"; expected an axis`},
		{"part X { order C T L H D/x }", `1:26: unexpected "x"; expected a split factor`},
		{"part X { order C T L H D/-3 }", `1:26: unexpected character '-'`},
		{"part X { order C T L H D% }", `1:27: unexpected "}"; expected a split factor`},
		{"part X { order C T L H 7 }", `1:24: unexpected "7"; expected an axis or "}"`},
		{"part X { C T L H D }", `1:10: unexpected "C"; expected "order"`},
		{"part X order C T L H D }", `1:8: unexpected "order"; expected "{"`},
		{"part { order C T L H D }", `1:6: unexpected "{"; expected a layout name`},
		{"layout X { order C T L H D }", `1:1: unexpected "layout"; expected "part" or "pool"`},
		{"part X { order C T L H D } }", `1:28: unexpected "}"; expected "part" or "pool"`},
		{"part X \"doc { order C T L H D }", `1:8: string not terminated before the end of the line`},
		{"part X \"doc\n\" { order C T L H D }", `1:8: string not terminated before the end of the line`},
		{`part X "\q" { order C T L H D }`, `1:8: invalid escape sequence in string "\q"`},
		{"part pool { order C T L H D }", `1:6: unexpected "pool"; expected a layout name`},
		{"partX { order C T L H D }", `1:1: unexpected "partX"; expected "part" or "pool"`},
		{"part X { order C T L H D } # x", `1:28: unexpected character '#'`},
		{"part X { order C T \xff L H D }", `1:20: invalid UTF-8 encoding`},
	}
	for _, tt := range tests {
		f, err := Parse("", []byte(tt.src))
		require.Nil(t, f, "%q", tt.src)
		require.EqualError(t, err, tt.want, "%q", tt.src)
		var list ErrorList
		require.True(t, errors.As(err, &list))
		require.Len(t, list, 1)
	}
}

// TestWrites: a pool layout may name the part layout it writes; a part
// layout may not. Whether the name is declared is the compiler's check (it
// may be in another file of the unit).
func TestWrites(t *testing.T) {
	f, err := Parse("w.kvl", []byte("pool p { order C S T L H D\n  writes PLHD }\npool q { order C S T L H D writes elsewhere }"))
	require.NoError(t, err)
	require.Equal(t, "PLHD", f.Decls[0].WritesName())
	require.Equal(t, lexer.Position{Filename: "w.kvl", Offset: 36, Line: 2, Column: 10}, f.Decls[0].Writes.Pos)
	require.Equal(t, "pool p { order C S T L H D writes PLHD }\npool q { order C S T L H D writes elsewhere }\n", f.String())
	require.Equal(t, "", (&Decl{}).WritesName())

	_, err = Parse("w.kvl", []byte("part x { order C T L H D writes PLHD }"))
	require.EqualError(t, err, "w.kvl:1:33: part layout x writes PLHD; only a pool layout names the part layout it writes")
}

func TestParseReturnsFileWithSemanticErrors(t *testing.T) {
	f, err := Parse("a.kvl", []byte("part X { order C T L H }"))
	require.EqualError(t, err, "a.kvl:1:1: layout X is missing axis D")
	require.NotNil(t, f)
	require.Equal(t, "C T L H", f.Decls[0].OrderString())
}

// TestCheckBuilt covers what only an AST built in memory can get wrong.
func TestCheckBuilt(t *testing.T) {
	modes := func(extra ...*Mode) []*Mode {
		ms := []*Mode{{Axis: "C"}, {Axis: "T"}, {Axis: "L"}, {Axis: "H"}}
		return append(ms, extra...)
	}
	f := &File{Decls: []*Decl{
		{Kind: "slab", Name: "A", Order: modes(&Mode{Axis: "D"})},
		{Kind: "part", Name: "has space", Order: modes(&Mode{Axis: "D"})},
		{Kind: "pool", Name: "order", Order: modes(&Mode{Axis: "S"}, &Mode{Axis: "D"})},
		{Kind: "part", Name: "B", Order: modes(&Mode{Axis: "D", Op: "*", Factor: 2})},
		{Kind: "part", Name: "C", Order: modes(&Mode{Axis: "D", Factor: 2})},
		{Kind: "part", Name: "D", Order: modes(&Mode{Axis: "D", Op: "/", Factor: -3}, &Mode{Axis: "D", Op: "%", Factor: -3})},
		nil,
		{Kind: "pool", Name: "E", Order: nil},
	}}
	require.Equal(t, ""+
		`unknown layout kind "slab"; kinds are part and pool`+"\n"+
		`invalid layout name "has space"; a name is a letter or _ followed by letters, digits and _`+"\n"+
		`invalid layout name "order"; part, pool, order and writes are keywords`+"\n"+
		`invalid split operator "*" after D; use / or %`+"\n"+
		`layout B is missing axis D`+"\n"+
		`whole axis D has a split factor 2`+"\n"+
		`split factor of D must be a positive integer, got -3`+"\n"+
		`split factor of D must be a positive integer, got -3`+"\n"+
		`layout E is missing axis C`+"\n"+
		`pool layout E has no slot axis S`+"\n"+
		`layout E is missing axis T`+"\n"+
		`layout E is missing axis L`+"\n"+
		`layout E is missing axis H`+"\n"+
		`layout E is missing axis D`,
		Check(f).Error())
	require.Nil(t, Check(nil))
	require.Nil(t, Check(&File{}))
}

func TestErrorFormat(t *testing.T) {
	e := &Error{Pos: lexer.Position{Filename: "a.kvl", Line: 3, Column: 7}, Msg: "boom"}
	require.Equal(t, "a.kvl:3:7: boom", e.Error())
	e.Pos.Filename = ""
	require.Equal(t, "3:7: boom", e.Error())
	e.Pos.Line = 0
	require.Equal(t, "boom", e.Error())
	l := ErrorList{{Pos: lexer.Position{Line: 1, Column: 2}, Msg: "a"}, {Pos: lexer.Position{Line: 2, Column: 1}, Msg: "b"}}
	require.Equal(t, "1:2: a\n2:1: b", l.Error())
	require.NoError(t, ErrorList(nil).Err())
	require.Equal(t, l, l.Err())
}

func TestParseOrder(t *testing.T) {
	l, err := ParseOrder("part", "vllm_xblock", "C L H D/8 T D%8")
	require.NoError(t, err)
	require.Equal(t, "part", l.Kind)
	require.Equal(t, "vllm_xblock", l.Name)
	require.Equal(t, "", l.Doc)
	require.Equal(t, "C L H D/8 T D%8", l.OrderString())
	require.Equal(t, 7, l.Order[3].Pos.Column)
	require.Equal(t, "part vllm_xblock { order C L H D/8 T D%8 }", l.String())

	l, err = ParseOrder("pool", "page_first", "  C S\tT\nL H D ")
	require.NoError(t, err)
	require.Equal(t, "C S T L H D", l.OrderString())

	tests := []struct{ kind, name, order, want string }{
		{"part", "X", "C T L H Q", `layout "X": order "C T L H Q": layout X is missing axis D; column 9: unknown axis "Q"; axes are C, S, T, L, H, D`},
		{"part", "X", "C T L H", `layout "X": order "C T L H": layout X is missing axis D`},
		{"part", "X", "C S T", `layout "X": order "C S T": layout X is missing axis L; layout X is missing axis H; layout X is missing axis D; column 3: part layout X has a slot axis S; only pool layouts have one`},
		{"part", "X", "c t l h d", `layout "X": order "c t l h d": layout X is missing axis C; layout X is missing axis T; layout X is missing axis L; layout X is missing axis H (and 6 more errors)`},
		{"pool", "X", "C T L H D", `layout "X": order "C T L H D": pool layout X has no slot axis S`},
		{"part", "X", "", `layout "X": order "": order is empty`},
		{"part", "X", "  // just a comment", `layout "X": order "  // just a comment": order is empty`},
		{"part", "X", "C T L H D }", `layout "X": order "C T L H D }": column 11: unexpected "}"; expected an axis`},
		{"part", "X", "{ order C T L H D }", `layout "X": order "{ order C T L H D }": column 1: unexpected "{"; expected an axis`},
		{"part", "X", "C T L H D/", `layout "X": order "C T L H D/": column 11: unexpected end of input; expected a split factor`},
		{"part", "X", "C T L H D/99999999999999999999 D%8", `layout "X": order "C T L H D/99999999999999999999 D%8": column 11: split factor 99999999999999999999 is out of range; the maximum is 1048576`},
		{"part", "X", "C T L H D/8 D%4", `layout "X": order "C T L H D/8 D%4": column 13: D/8 and D%4 split D by different factors`},
		{"part", "X", "C T T L H D", `layout "X": order "C T T L H D": column 5: axis T appears twice in layout X, first at 1:3`},
		{"part", "X", "C T L H D \xff", `layout "X": order "C T L H D \xff": column 11: invalid UTF-8 encoding`},
		{"part", "X", "C T L\nH D Q", `layout "X": order "C T L\nH D Q": line 2, column 5: unknown axis "Q"; axes are C, S, T, L, H, D`},
		{"slab", "X", "C T L H D", `layout "X": order "C T L H D": unknown layout kind "slab"; kinds are part and pool`},
		{"part", "", "C T L H D", `layout "": order "C T L H D": invalid layout name ""; a name is a letter or _ followed by letters, digits and _`},
	}
	for _, tt := range tests {
		l, err := ParseOrder(tt.kind, tt.name, tt.order)
		require.Nil(t, l, "%q", tt.order)
		require.EqualError(t, err, tt.want)
		var oe *OrderError
		require.True(t, errors.As(err, &oe))
		require.Equal(t, tt.order, oe.Order)
		var list ErrorList
		require.True(t, errors.As(err, &list))
		require.NotEmpty(t, list)
	}
}

func TestParseOrderAgreesWithParse(t *testing.T) {
	f, err := Parse("builtin.kvl", []byte(builtins))
	require.NoError(t, err)
	for _, l := range f.Decls {
		got, err := ParseOrder(l.Kind, l.Name, l.OrderString())
		require.NoError(t, err)
		want := layoutNoPos(l)
		want.Doc = ""
		require.Equal(t, want, layoutNoPos(got))
	}
}

func TestNamesThatLookLikeKeywords(t *testing.T) {
	f, err := Parse("", []byte("part parts { order C T L H D }\npool pool_a { order C S T L H D }\npart orders { order C T L H D }"))
	require.NoError(t, err)
	require.Equal(t, "parts", f.Decls[0].Name)
	require.Equal(t, "pool_a", f.Decls[1].Name)
}
