package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLayoutsText: the built-ins come first, one tab-separated line each
// (kind, name, order, what a pool writes). The C program defines layouts
// (a process of its own: the registry is the process's).
func TestLayoutsText(t *testing.T) {
	require.True(t, strings.HasPrefix(layoutsText(), "part\tPLHD\tC T L H D\t\n"+
		"part\tLPHD\tC L T H D\t\n"+
		"part\tHPLD\tC H T L D\t\n"+
		"pool\tpage_first\tC S T L H D\tPLHD\n"+
		"pool\tpage_first_direct\tC S L T H D\tLPHD\n"+
		"pool\tlayer_first\tC L S T H D\tLPHD\n"+
		"pool\tpage_head\tC S H T L D\tHPLD\n"), "%s", layoutsText())
}

// TestDefineLayoutErrors: what defineLayout refuses registers nothing.
func TestDefineLayoutErrors(t *testing.T) {
	before := layoutsText()
	for _, c := range []struct{ kind, name, order, writes, msg string }{
		{"part", "x", "C T T H D", "", `layout "x": order "C T T H D": layout x is missing axis L; column 5: axis T appears twice in layout x, first at 1:3`},
		{"pool", "x", "C S T L H D", "nope", `layout "x": writes "nope", which is not a registered part layout (PLHD, LPHD, HPLD)`},
		{"pool", "x", "C S T L H D", "layer_first", `layout "x": writes layer_first, a pool layout; a pool writes a part layout (PLHD, LPHD, HPLD)`},
		{"part", "x", "C T L H D", "PLHD", `layout "x": a part layout writes no part layout (writes "PLHD")`},
		{"pool", "page_first", "C S T L H D", "LPHD", `layout "page_first" is already pool(C S T L H D) writing PLHD (builtin.kvl:12:1); defined at run time declares it pool(C S T L H D) writing LPHD`},
	} {
		err := defineLayout(c.kind, c.name, c.order, c.writes)
		require.EqualError(t, err, c.msg)
		require.Equal(t, kvrEInval, codeOf(err))
	}
	require.NoError(t, defineLayout("pool", "page_first", "C S T L H D", "PLHD"), "a built-in declared again as it is")
	require.Equal(t, before, layoutsText())
}
