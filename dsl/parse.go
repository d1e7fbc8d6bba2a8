package dsl

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/alecthomas/participle/v2"
	"github.com/alecthomas/participle/v2/lexer"

	"github.com/kvreshard/kvreshard/compiler/ir"
)

// kvlLexer splits .kvl text into tokens. BadString catches a string that is
// not closed on its line, so that it gets its own message. Keywords are their
// own token type, so that a layout missing its "}" is reported at the next
// declaration rather than after reading its keyword and name as axes.
var kvlLexer = lexer.MustSimple([]lexer.SimpleRule{
	{Name: "Comment", Pattern: `//[^\n]*`},
	{Name: "Keyword", Pattern: `(?:part|pool|order|writes)\b`},
	{Name: "String", Pattern: `"(?:\\.|[^"\\\n])*"`},
	{Name: "BadString", Pattern: `"(?:\\.|[^"\\\n])*\\?`},
	{Name: "Int", Pattern: `[0-9]+`},
	{Name: "Ident", Pattern: `[A-Za-z_][A-Za-z0-9_]*`},
	{Name: "Punct", Pattern: `[{}/%]`},
	{Name: "Whitespace", Pattern: `[ \t\r\n]+`},
})

var options = []participle.Option{
	participle.Lexer(kvlLexer),
	participle.Elide("Comment", "Whitespace"),
	participle.Map(unquoteString, "String"),
	participle.Map(badString, "BadString"),
	participle.Map(decimalInt, "Int"),
	// Without a lookahead limit, a syntax error is reported at the token
	// where parsing got furthest (D/x fails at x, not at /).
	participle.UseLookahead(-1),
}

var (
	fileParser  = participle.MustBuild[File](options...)
	orderParser = participle.MustBuild[orderBody](options...)
)

// orderBody is what ParseOrder reads: the modes of one order, nothing else.
type orderBody struct {
	Modes []*Mode `parser:"@@*"`
}

// unquoteString turns a String token into the string it denotes (Go escapes).
func unquoteString(t lexer.Token) (lexer.Token, error) {
	s, err := strconv.Unquote(t.Value)
	if err != nil {
		return t, participle.Errorf(t.Pos, "invalid escape sequence in string %s", t.Value)
	}
	t.Value = s
	return t, nil
}

func badString(t lexer.Token) (lexer.Token, error) {
	return t, participle.Errorf(t.Pos, "string not terminated before the end of the line")
}

// decimalInt reads an Int token as a decimal number (leading zeros do not make
// it octal) and rejects one too large for an int.
func decimalInt(t lexer.Token) (lexer.Token, error) {
	n, err := strconv.ParseInt(t.Value, 10, strconv.IntSize)
	if err != nil {
		return t, participle.Errorf(t.Pos, "split factor %s is out of range; the maximum is %d", t.Value, MaxFactor)
	}
	t.Value = strconv.FormatInt(n, 10)
	return t, nil
}

// Parse parses and checks a .kvl file. filename is used in positions only.
// On any error it returns an ErrorList: a syntax error gives one positioned
// Error and a nil *File; semantic errors give every error found by Check,
// along with the parsed file.
func Parse(filename string, src []byte) (*File, error) {
	if err := checkUTF8(filename, src); err != nil {
		return nil, ErrorList{err}
	}
	f, err := fileParser.ParseBytes(filename, src)
	if err != nil {
		return nil, ErrorList{convertError(filename, src, err, `"part" or "pool"`)}
	}
	if errs := Check(f); len(errs) > 0 {
		return f, errs
	}
	return f, nil
}

// ParseOrder parses the order of one layout, given as text such as
// "C L H D/8 T D%8" (the form OrderString prints and a manifest stores),
// and checks the layout it makes with kind and name. The returned Layout has
// no position; its modes are positioned on line 1 of order. Errors are an
// *OrderError naming the layout.
func ParseOrder(kind, name, order string) (*Decl, error) {
	fail := func(errs ErrorList) error {
		return &OrderError{Kind: kind, Name: name, Order: order, Errs: errs}
	}
	if err := checkUTF8("", []byte(order)); err != nil {
		return nil, fail(ErrorList{err})
	}
	body, err := orderParser.ParseString("", order)
	if err != nil {
		return nil, fail(ErrorList{convertError("", []byte(order), err, "an axis")})
	}
	if len(body.Modes) == 0 {
		return nil, fail(ErrorList{{Msg: "order is empty"}})
	}
	l := &Decl{Kind: kind, Name: name, Order: body.Modes}
	// The errors come in kvlc's order for the same layout in a file: those
	// about the whole layout (at its declaration) first.
	if errs := checkLayout(l); len(errs) > 0 {
		return nil, fail(errs)
	}
	return l, nil
}

// OrderError is the error of ParseOrder: what was parsed, and why it failed.
type OrderError struct {
	Kind, Name, Order string
	// Errs are the errors, positioned in Order (line 1, column counted from
	// 1), or without position when they are about the whole layout.
	Errs ErrorList
}

// Error returns one line: the layout, the order and its errors, worded as
// the IR's order parser words them.
func (e *OrderError) Error() string {
	ie := &ir.OrderError{Kind: e.Kind, Name: e.Name, Order: e.Order}
	for _, x := range e.Errs {
		ie.Errs = append(ie.Errs, &ir.OrderErr{Pos: irPos(x.Pos), Msg: x.Msg})
	}
	return ie.Error()
}

// Unwrap returns the ErrorList.
func (e *OrderError) Unwrap() error { return e.Errs }

// convertError turns a participle or lexer error into a positioned Error.
// top names what may come where nothing more could be parsed.
func convertError(filename string, src []byte, err error, top string) *Error {
	e := &Error{Msg: err.Error()}
	var perr participle.Error
	if errors.As(err, &perr) {
		e.Pos, e.Msg = perr.Position(), perr.Message()
		var unexpected *participle.UnexpectedTokenError
		var lexErr *lexer.Error
		switch {
		case errors.As(err, &unexpected):
			e.Msg = unexpectedMessage(unexpected, top)
			if off := unexpected.Unexpected.Pos.Offset; off >= 0 && off <= len(src) && writesRE.Match(src[:off]) {
				// After "writes NAME" only the brace may come.
				e.Msg = strings.Replace(e.Msg, `expected an axis or "}"`, `expected "}"`, 1)
			}
		case errors.As(err, &lexErr) && lexErr.Pos.Offset >= 0 && lexErr.Pos.Offset < len(src):
			r, _ := utf8.DecodeRune(src[lexErr.Pos.Offset:])
			e.Msg = fmt.Sprintf("unexpected character %q", r)
		}
	}
	e.Pos.Filename = filename
	if e.Pos.Line < 1 {
		e.Pos.Line = 1
	}
	if e.Pos.Column < 1 {
		e.Pos.Column = 1
	}
	return e
}

// writesRE matches text that ends in a writes clause's name.
var writesRE = regexp.MustCompile(`\bwrites\s+[A-Za-z_][A-Za-z0-9_]*\s*$`)

// unexpectedMessage words an unexpected-token error in the language's terms:
// what was found, and the first thing the grammar would have accepted there.
func unexpectedMessage(u *participle.UnexpectedTokenError, top string) string {
	got := fmt.Sprintf("%q", u.Unexpected.Value)
	if u.Unexpected.EOF() {
		got = "end of input"
	}
	return "unexpected " + got + "; expected " + expectedWhat(u.Message(), top)
}

// expectedWhat reads participle's "(expected ...)" suffix and names its
// first element.
func expectedWhat(msg, top string) string {
	const marker = " (expected "
	i := strings.LastIndex(msg, marker)
	if i < 0 {
		return top
	}
	want := strings.TrimSuffix(msg[i+len(marker):], ")")
	first, _, _ := strings.Cut(want, " ")
	switch {
	case first == "<ident>":
		return "a layout name"
	case first == "<int>":
		return "a split factor"
	case first == "<string>?":
		return `a doc string or "{"`
	case first == "Ref":
		return "a part layout name"
	case strings.HasPrefix(first, "Mode"):
		return "an axis"
	case first == `"}"`:
		// Only an order is closed by a brace.
		return `an axis or "}"`
	case first == "":
		return top
	}
	return first
}

// checkUTF8 reports the first byte of src that is not valid UTF-8.
func checkUTF8(filename string, src []byte) *Error {
	if utf8.Valid(src) {
		return nil
	}
	pos := lexer.Position{Filename: filename, Line: 1, Column: 1}
	for len(src) > 0 {
		r, size := utf8.DecodeRune(src)
		if r == utf8.RuneError && size == 1 {
			return &Error{Pos: pos, Msg: "invalid UTF-8 encoding"}
		}
		pos.Offset += size
		if r == '\n' {
			pos.Line++
			pos.Column = 1
		} else {
			pos.Column++
		}
		src = src[size:]
	}
	return nil
}
