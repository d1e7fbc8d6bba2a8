package dsl

import (
	"fmt"
	"sort"
	"strings"

	"github.com/alecthomas/participle/v2/lexer"
)

// Error is one positioned error in a .kvl file.
type Error struct {
	Pos lexer.Position
	Msg string
}

// Error formats the error as "file:line:col: msg", or "line:col: msg" when
// the position has no file name, or just "msg" when it has no line.
func (e *Error) Error() string {
	if e.Pos.Line == 0 {
		return e.Msg
	}
	if e.Pos.Filename == "" {
		return fmt.Sprintf("%d:%d: %s", e.Pos.Line, e.Pos.Column, e.Msg)
	}
	return fmt.Sprintf("%s:%d:%d: %s", e.Pos.Filename, e.Pos.Line, e.Pos.Column, e.Msg)
}

// ErrorList is a list of errors sorted by position.
type ErrorList []*Error

// Error joins the errors' texts with newlines.
func (l ErrorList) Error() string {
	s := make([]string, len(l))
	for i, e := range l {
		s[i] = e.Error()
	}
	return strings.Join(s, "\n")
}

// Err returns l as an error, or nil when l is empty.
func (l ErrorList) Err() error {
	if len(l) == 0 {
		return nil
	}
	return l
}

// sortErrors sorts by file, line and column, keeping the order of errors at
// the same position.
func (l ErrorList) sort() {
	sort.SliceStable(l, func(i, j int) bool {
		a, b := l[i].Pos, l[j].Pos
		if a.Filename != b.Filename {
			return a.Filename < b.Filename
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Column < b.Column
	})
}

// at formats a position as "line:col", the way messages cite an earlier node.
func at(p lexer.Position) string {
	return fmt.Sprintf("%d:%d", p.Line, p.Column)
}
