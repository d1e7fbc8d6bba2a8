package dsl

import (
	"strconv"
	"strings"

	"github.com/alecthomas/participle/v2/lexer"
)

// File is a parsed .kvl file: its layout declarations in file order.
type File struct {
	Pos   lexer.Position
	Decls []*Decl `parser:"@@*"`
}

// Decl is one layout declaration:
//
//	part PLHD "token-major" { order C T L H D }
//	pool page_first { order C S T L H D writes PLHD }
type Decl struct {
	Pos lexer.Position
	// Kind is "part" (how one Part is laid out in the store) or "pool"
	// (how a host pool holds many pages; it has the slot axis S).
	Kind string `parser:"@('part' | 'pool')"`
	// Name identifies the layout; names are unique within a file.
	Name string `parser:"@Ident"`
	// Doc is the unquoted doc string, "" if none.
	Doc string `parser:"@String?"`
	// Order lists the modes, outermost first.
	Order []*Mode `parser:"'{' 'order' @@+"`
	// Writes, in a pool layout, names the part layout that writers of such
	// a pool store their pages in when they name none; nil if none.
	Writes *Ref `parser:"('writes' @@)? '}'"`
}

// Ref is a layout name that refers to another declaration.
type Ref struct {
	Pos  lexer.Position
	Name string `parser:"@Ident"`
}

// WritesName returns the name Writes refers to, or "".
func (l *Decl) WritesName() string {
	if l.Writes == nil {
		return ""
	}
	return l.Writes.Name
}

// Mode is one entry of a layout's order: a whole axis ("D"), the outer
// quotient of a split axis ("D/8": D/8 blocks), or the inner remainder of a
// split axis ("D%8": 8 elements).
type Mode struct {
	Pos lexer.Position
	// Axis is one of "C", "S", "T", "L", "H", "D" once checked.
	Axis string `parser:"@Ident"`
	// Op is "" for a whole axis, "/" for the outer half, "%" for the inner half.
	Op string `parser:"( @('/' | '%')"`
	// Factor is the split factor; 0 when Op is "".
	Factor int `parser:"  @Int )?"`
}

// String returns the mode in source form: "D", "D/8" or "D%8".
func (m *Mode) String() string {
	if m.Op == "" {
		return m.Axis
	}
	return m.Axis + m.Op + strconv.Itoa(m.Factor)
}

// OrderString returns the canonical order: the modes joined by one space,
// for example "C L H D/8 T D%8". It is the form ParseOrder reads back.
func (l *Decl) OrderString() string {
	var b strings.Builder
	for i, m := range l.Order {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(m.String())
	}
	return b.String()
}

// String returns the canonical one-line declaration, for example
//
//	part PLHD "token-major" { order C T L H D }
//
// The doc string is omitted when empty and quoted with Go escapes otherwise.
func (l *Decl) String() string {
	var b strings.Builder
	b.WriteString(l.Kind)
	b.WriteByte(' ')
	b.WriteString(l.Name)
	if l.Doc != "" {
		b.WriteByte(' ')
		b.WriteString(strconv.Quote(l.Doc))
	}
	b.WriteString(" { order ")
	b.WriteString(l.OrderString())
	if l.Writes != nil {
		b.WriteString(" writes ")
		b.WriteString(l.Writes.Name)
	}
	b.WriteString(" }")
	return b.String()
}

// String returns the canonical form of the file: one declaration per line,
// in file order, each line ending in a newline. Parsing it gives back an
// equal AST (positions aside).
func (f *File) String() string {
	var b strings.Builder
	for _, l := range f.Decls {
		b.WriteString(l.String())
		b.WriteByte('\n')
	}
	return b.String()
}
