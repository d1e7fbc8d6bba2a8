package dsl

import (
	"errors"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"
)

func FuzzParse(f *testing.F) {
	f.Add([]byte(builtins))
	f.Add([]byte(""))
	f.Add([]byte("part X { order C T/4 L H D/8 T%4 D%8 }"))
	f.Add([]byte("pool X \"a\\\"b\\x00\" { order C S T L H D }"))
	f.Add([]byte("part X { order C T L H D/99999999999999999999 D%8 }"))
	f.Add([]byte("part X \"\\"))
	dirs, _ := filepath.Glob(filepath.Join("testdata", "errors", "*", "layout.kvl"))
	for _, p := range dirs {
		src, err := os.ReadFile(p)
		require.NoError(f, err)
		f.Add(src)
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		file, err := Parse("fuzz.kvl", src)
		if err != nil {
			var list ErrorList
			require.True(t, errors.As(err, &list), "%T", err)
			require.NotEmpty(t, list)
			for _, e := range list {
				require.GreaterOrEqual(t, e.Pos.Line, 1, "%v", e)
				require.GreaterOrEqual(t, e.Pos.Column, 1, "%v", e)
				require.Equal(t, "fuzz.kvl", e.Pos.Filename)
				require.NotEmpty(t, e.Msg)
			}
			require.True(t, sort.SliceIsSorted(list, func(i, j int) bool {
				a, b := list[i].Pos, list[j].Pos
				return a.Line < b.Line || a.Line == b.Line && a.Column < b.Column
			}), "%v", err)
			if file == nil {
				return
			}
			// A file with semantic errors still prints to an equal AST.
			g, err2 := Parse("fuzz.kvl", []byte(file.String()))
			require.Error(t, err2)
			require.Equal(t, noPos(file), noPos(g))
			require.Equal(t, len(list), len(err2.(ErrorList)))
			return
		}
		text := file.String()
		g, err := Parse("fuzz.kvl", []byte(text))
		require.NoError(t, err, "%q", text)
		require.Equal(t, noPos(file), noPos(g))
		require.Equal(t, text, g.String())
		for _, l := range file.Decls {
			o, err := ParseOrder(l.Kind, l.Name, l.OrderString())
			require.NoError(t, err)
			require.Equal(t, l.OrderString(), o.OrderString())
		}
	})
}

func FuzzOrder(f *testing.F) {
	f.Add("part", "PLHD", "C T L H D")
	f.Add("pool", "x", "C S L H D/8 T D%8")
	f.Add("part", "x", "C T L H D/")
	f.Add("slab", "", "")
	f.Fuzz(func(t *testing.T, kind, name, order string) {
		l, err := ParseOrder(kind, name, order)
		if err != nil {
			require.Nil(t, l)
			var oe *OrderError
			require.True(t, errors.As(err, &oe))
			require.NotEmpty(t, oe.Errs)
			require.NotEmpty(t, err.Error())
			return
		}
		again, err := ParseOrder(kind, name, l.OrderString())
		require.NoError(t, err)
		require.Equal(t, layoutNoPos(l).Order, layoutNoPos(again).Order)
	})
}
