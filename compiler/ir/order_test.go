package ir_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler/ir"
)

// TestCheckOrderAtDeclaration: CheckOrder reports the errors about the
// whole layout at the declaration's position, sorted with those about a
// mode by line and column, and finds what only a declaration built in
// memory can get wrong (a whole axis with a factor, an unknown operator).
func TestCheckOrderAtDeclaration(t *testing.T) {
	d := &ir.OrderDecl{Pos: ir.Pos{Line: 2, Column: 1}, Kind: "pool", Name: "x", Order: []*ir.OrderMode{
		{Pos: ir.Pos{Line: 2, Column: 20}, Axis: "C", Factor: 4},
		{Pos: ir.Pos{Line: 2, Column: 22}, Axis: "T", Op: "*", Factor: 2},
		{Pos: ir.Pos{Line: 3, Column: 1}, Axis: "L"},
		{Pos: ir.Pos{Line: 3, Column: 3}, Axis: "L", Op: "/", Factor: 2},
		{Pos: ir.Pos{Line: 3, Column: 7}, Axis: "D", Op: "%", Factor: 8},
		{Pos: ir.Pos{Line: 3, Column: 11}, Axis: "D", Op: "/", Factor: 8},
	}}
	var got []string
	for _, e := range ir.CheckOrder(d) {
		got = append(got, e.Error())
	}
	require.Equal(t, []string{
		"2:1: pool layout x has no slot axis S",
		"2:1: layout x is missing axis T",
		"2:1: layout x is missing axis H",
		"2:20: whole axis C has a split factor 4",
		`2:22: invalid split operator "*" after T; use / or %`,
		"3:3: axis L cannot be split; only T and D can",
		"3:3: axis L appears twice in layout x, first at 3:1",
		"3:7: D%8 must come after D/8",
	}, got)
	// At no position (an order text's), they still come first, as a
	// declaration comes before its modes in a .kvl file.
	d.Pos = ir.Pos{}
	require.Equal(t, "pool layout x has no slot axis S", ir.CheckOrder(d)[0].Error())
	require.Equal(t, "2:20: whole axis C has a split factor 4", ir.CheckOrder(d)[3].Error())
	require.True(t, ir.Splittable("T") && ir.Splittable("D") && !ir.Splittable("L"))
}

// TestLongNames: a layout's name is at most MaxName characters, and a
// longer one is cut in the messages that show it.
func TestLongNames(t *testing.T) {
	name := strings.Repeat("n", ir.MaxName)
	_, err := ir.ParseOrder("part", name, "C T L H D")
	require.NoError(t, err)
	long := strings.Repeat("x", 5000)
	_, err = ir.ParseOrder("part", long, "C T L H D")
	require.EqualError(t, err, `layout "xxxxxxxxxxxxxxxxxxxx"...: order "C T L H D": invalid layout name "xxxxxxxxxxxxxxxxxxxx"...; a name is at most 128 characters, not 5000`)
}
