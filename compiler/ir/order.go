package ir

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxFactor is the largest split factor an order may use.
const MaxFactor = 1 << 20

// MaxName bounds the length of a layout's name: names are in every message
// about a layout, and in the names of generated kernels.
const MaxName = 128

// quoteName quotes a layout's name for a message: its first 20 characters
// and "..." when it is longer than MaxName.
func quoteName(name string) string {
	if len(name) > MaxName {
		return fmt.Sprintf("%.20q...", name)
	}
	return strconv.Quote(name)
}

// Pos is a position in an order text: line and column from 1, the column
// counted in characters; the zero Pos is no position.
type Pos struct {
	Line, Column int
}

// OrderMode is one entry of an order as written: a whole axis ("D"), the
// outer quotient of a split axis ("D/8") or its inner remainder ("D%8").
type OrderMode struct {
	Pos    Pos
	Axis   string // "C", "S", "T", "L", "H" or "D" once checked
	Op     string // "", "/" or "%"
	Factor int    // the split factor; 0 when Op is ""
}

// String returns the mode as written: "D", "D/8" or "D%8".
func (m *OrderMode) String() string {
	if m.Op == "" {
		return m.Axis
	}
	return m.Axis + m.Op + strconv.Itoa(m.Factor)
}

// OrderDecl is a layout's order declaration: its kind ("part" or "pool"),
// its name and its modes as written, read from an order text by ParseOrder
// or converted from a .kvl declaration by package dsl. Pos is where the
// declaration starts; CheckOrder reports the errors about the whole layout
// there, or at no position when Pos is zero (as ParseOrder leaves it).
type OrderDecl struct {
	Pos        Pos
	Kind, Name string
	Order      []*OrderMode
}

// OrderString returns the canonical order: the modes joined by one space.
func (d *OrderDecl) OrderString() string {
	s := make([]string, len(d.Order))
	for i, m := range d.Order {
		s[i] = m.String()
	}
	return strings.Join(s, " ")
}

// Layout returns the checked declaration as an IR layout.
func (d *OrderDecl) Layout() *Layout {
	l := &Layout{Name: d.Name, Kind: Part}
	if d.Kind == "pool" {
		l.Kind = Pool
	}
	for _, m := range d.Order {
		mode := Mode{Axis: Axis(m.Axis[0]), Factor: m.Factor}
		switch m.Op {
		case "/":
			mode.Split = Outer
		case "%":
			mode.Split = Inner
		}
		l.Modes = append(l.Modes, mode)
	}
	return l
}

// OrderErr is one error of an order: a message, at a position or about the
// whole layout.
type OrderErr struct {
	Pos Pos
	Msg string
}

func (e *OrderErr) Error() string {
	if e.Pos.Line == 0 {
		return e.Msg
	}
	return fmt.Sprintf("%d:%d: %s", e.Pos.Line, e.Pos.Column, e.Msg)
}

// OrderError is the error of ParseOrder: the layout, its order, and every
// error found in it, in the order kvlc gives them for the same layout in a
// .kvl file (those about the whole layout first).
type OrderError struct {
	Kind, Name, Order string
	Errs              []*OrderErr
}

// maxOrderErrs bounds the errors an OrderError's message lists.
const maxOrderErrs = 4

// Error returns one line: the layout, the order, and its errors, each as
// kvlc words it, at a column of the order where it has one, separated by
// "; ", the first maxOrderErrs of them and how many more there are.
func (e *OrderError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "layout %s: order %q: ", quoteName(e.Name), e.Order)
	if len(e.Errs) == 0 {
		b.WriteString("invalid")
		return b.String()
	}
	for i, err := range e.Errs {
		if i == maxOrderErrs {
			if n := len(e.Errs) - i; n == 1 {
				b.WriteString(" (and 1 more error)")
			} else {
				fmt.Fprintf(&b, " (and %d more errors)", n)
			}
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		switch {
		case err.Pos.Line == 1:
			fmt.Fprintf(&b, "column %d: ", err.Pos.Column)
		case err.Pos.Line > 1:
			fmt.Fprintf(&b, "line %d, column %d: ", err.Pos.Line, err.Pos.Column)
		}
		b.WriteString(err.Msg)
	}
	return b.String()
}

// ParseLayout parses and checks one layout from its order text, as a
// manifest stores it.
func ParseLayout(kind Kind, name, order string) (*Layout, error) {
	d, err := ParseOrder(kind.String(), name, order)
	if err != nil {
		return nil, err
	}
	return d.Layout(), nil
}

// ParseOrder parses the order of one layout, given as text such as
// "C L H D/8 T D%8", and checks the layout it makes with kind and name by
// CheckOrder, the checker of .kvl files too. It is the small parser the
// runtime needs: no .kvl file, no parser library. Errors are an
// *OrderError.
func ParseOrder(kind, name, order string) (*OrderDecl, error) {
	fail := func(errs ...*OrderErr) error {
		return &OrderError{Kind: kind, Name: name, Order: order, Errs: errs}
	}
	toks, err := lex(order)
	if err != nil {
		return nil, fail(err)
	}
	d := &OrderDecl{Kind: kind, Name: name}
	for i := 0; i < len(toks); {
		t := toks[i]
		if t.kind != tIdent {
			return nil, fail(t.unexpected("an axis"))
		}
		m := &OrderMode{Pos: t.pos, Axis: t.text}
		i++
		if i < len(toks) && toks[i].kind == tPunct && (toks[i].text == "/" || toks[i].text == "%") {
			m.Op = toks[i].text
			i++
			if i == len(toks) {
				return nil, fail(&OrderErr{Pos: endPos(order), Msg: "unexpected end of input; expected a split factor"})
			}
			if toks[i].kind != tInt {
				return nil, fail(toks[i].unexpected("a split factor"))
			}
			m.Factor = toks[i].n
			i++
		}
		d.Order = append(d.Order, m)
	}
	if len(d.Order) == 0 {
		return nil, fail(&OrderErr{Msg: "order is empty"})
	}
	if errs := CheckOrder(d); len(errs) > 0 {
		return nil, fail(errs...)
	}
	return d, nil
}

type tokKind uint8

const (
	tIdent tokKind = iota
	tInt
	tPunct   // { } / %
	tKeyword // part, pool, order
	tString
)

type token struct {
	kind tokKind
	text string // the token's value: a string unquoted, an int in decimal
	n    int    // an int's value
	pos  Pos
}

func (t token) unexpected(want string) *OrderErr {
	return &OrderErr{Pos: t.pos, Msg: fmt.Sprintf("unexpected %q; expected %s", t.text, want)}
}

// The tokens of the .kvl language, tried in this order at each position,
// as package dsl's lexer does.
var (
	reComment   = regexp.MustCompile(`^//[^\n]*`)
	reKeyword   = regexp.MustCompile(`^(?:part|pool|order)\b`)
	reString    = regexp.MustCompile(`^"(?:\\.|[^"\\\n])*"`)
	reBadString = regexp.MustCompile(`^"(?:\\.|[^"\\\n])*\\?`)
	reInt       = regexp.MustCompile(`^[0-9]+`)
	reIdent     = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*`)
	rePunct     = regexp.MustCompile(`^[{}/%]`)
	reSpace     = regexp.MustCompile(`^[ \t\r\n]+`)
)

// advance returns the position after text that starts at p.
func advance(p Pos, text string) Pos {
	if i := strings.LastIndexByte(text, '\n'); i >= 0 {
		return Pos{Line: p.Line + strings.Count(text, "\n"), Column: utf8.RuneCountInString(text[i:])}
	}
	return Pos{Line: p.Line, Column: p.Column + utf8.RuneCountInString(text)}
}

func endPos(s string) Pos { return advance(Pos{Line: 1, Column: 1}, s) }

// lex splits an order into tokens, without comments and white space, or
// returns the first error: invalid UTF-8, a character no token starts with,
// a string that does not end on its line or has a bad escape, or a number
// too large.
func lex(s string) ([]token, *OrderErr) {
	if !utf8.ValidString(s) {
		p := Pos{Line: 1, Column: 1}
		for i := 0; i < len(s); {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				return nil, &OrderErr{Pos: p, Msg: "invalid UTF-8 encoding"}
			}
			p = advance(p, s[i:i+size])
			i += size
		}
	}
	var toks []token
	p := Pos{Line: 1, Column: 1}
	for rest := s; rest != ""; {
		var m string
		var t token
		switch {
		case reComment.MatchString(rest):
			m = reComment.FindString(rest)
			t.kind = 255
		case reKeyword.MatchString(rest):
			m = reKeyword.FindString(rest)
			t = token{kind: tKeyword, text: m}
		case reString.MatchString(rest):
			m = reString.FindString(rest)
			v, err := strconv.Unquote(m)
			if err != nil {
				return nil, &OrderErr{Pos: p, Msg: "invalid escape sequence in string " + m}
			}
			t = token{kind: tString, text: v}
		case reBadString.MatchString(rest):
			return nil, &OrderErr{Pos: p, Msg: "string not terminated before the end of the line"}
		case reInt.MatchString(rest):
			m = reInt.FindString(rest)
			n, err := strconv.ParseInt(m, 10, strconv.IntSize)
			if err != nil {
				return nil, &OrderErr{Pos: p, Msg: fmt.Sprintf("split factor %s is out of range; the maximum is %d", m, MaxFactor)}
			}
			t = token{kind: tInt, text: strconv.FormatInt(n, 10), n: int(n)}
		case reIdent.MatchString(rest):
			m = reIdent.FindString(rest)
			t = token{kind: tIdent, text: m}
		case rePunct.MatchString(rest):
			m = rePunct.FindString(rest)
			t = token{kind: tPunct, text: m}
		case reSpace.MatchString(rest):
			m = reSpace.FindString(rest)
			t.kind = 255
		default:
			r, _ := utf8.DecodeRuneInString(rest)
			return nil, &OrderErr{Pos: p, Msg: fmt.Sprintf("unexpected character %q", r)}
		}
		if t.kind != 255 {
			t.pos = p
			toks = append(toks, t)
		}
		p = advance(p, m)
		rest = rest[len(m):]
	}
	return toks, nil
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// axisNames lists the axes in the order messages name them.
var axisNames = []string{"C", "S", "T", "L", "H", "D"}

// Splittable reports whether an axis may be split into X/n and X%n: only
// T and D may.
func Splittable(axis string) bool { return axis == "T" || axis == "D" }

// keywords are the words of the .kvl language that cannot name a layout.
var keywords = map[string]bool{"part": true, "pool": true, "order": true, "writes": true}

// CheckOrder returns every error of an order declaration by the rules of
// the .kvl language, or nil: the kind and name, each mode's axis, split and
// factor, every axis once (S in a pool only), and each split axis's two
// halves, outer first, with one factor. Errors about a mode are at its
// position, those about the whole layout at d.Pos. They are sorted by
// position, those at no position first, each group in the order found.
// It is the one checker of orders: package dsl checks .kvl layouts with it.
func CheckOrder(d *OrderDecl) []*OrderErr {
	var errs []*OrderErr
	add := func(pos Pos, format string, args ...any) {
		errs = append(errs, &OrderErr{Pos: pos, Msg: fmt.Sprintf(format, args...)})
	}
	if d.Kind != "part" && d.Kind != "pool" {
		add(d.Pos, "unknown layout kind %q; kinds are part and pool", d.Kind)
	}
	if keywords[d.Name] {
		add(d.Pos, "invalid layout name %q; part, pool, order and writes are keywords", d.Name)
	} else if len(d.Name) > MaxName {
		add(d.Pos, "invalid layout name %s; a name is at most %d characters, not %d", quoteName(d.Name), MaxName, len(d.Name))
	} else if !identRE.MatchString(d.Name) {
		add(d.Pos, "invalid layout name %q; a name is a letter or _ followed by letters, digits and _", d.Name)
	}
	type use struct {
		first, whole, outer, inner *OrderMode
		outerIdx, innerIdx         int
		repeated                   bool
	}
	uses := map[string]*use{}
	for i, m := range d.Order {
		if !strings.Contains("CSTLHD", m.Axis) || len(m.Axis) != 1 {
			add(m.Pos, "unknown axis %q; axes are C, S, T, L, H, D", m.Axis)
			continue
		}
		switch m.Op {
		case "":
			if m.Factor != 0 {
				add(m.Pos, "whole axis %s has a split factor %d", m.Axis, m.Factor)
			}
		case "/", "%":
			if !Splittable(m.Axis) {
				add(m.Pos, "axis %s cannot be split; only T and D can", m.Axis)
			}
			switch {
			case m.Factor < 1:
				add(m.Pos, "split factor of %s must be a positive integer, got %d", m.Axis, m.Factor)
			case m.Factor == 1:
				add(m.Pos, "split factor of %s must be at least 2, got 1", m.Axis)
			case m.Factor > MaxFactor:
				add(m.Pos, "split factor of %s must be at most %d, got %d", m.Axis, MaxFactor, m.Factor)
			}
		default:
			add(m.Pos, "invalid split operator %q after %s; use / or %%", m.Op, m.Axis)
			continue
		}
		u := uses[m.Axis]
		if u == nil {
			u = &use{first: m}
			uses[m.Axis] = u
		} else {
			var earlier *OrderMode
			switch {
			case m.Op == "":
				earlier = u.first
			case u.whole != nil:
				earlier = u.whole
			case m.Op == "/" && u.outer != nil:
				earlier = u.outer
			case m.Op == "%" && u.inner != nil:
				earlier = u.inner
			}
			if earlier != nil {
				add(m.Pos, "axis %s appears twice in layout %s, first at %d:%d", m.Axis, d.Name, earlier.Pos.Line, earlier.Pos.Column)
				u.repeated = true
				continue
			}
		}
		switch m.Op {
		case "":
			u.whole = m
		case "/":
			u.outer, u.outerIdx = m, i
		case "%":
			u.inner, u.innerIdx = m, i
		}
		if m.Axis == "S" && d.Kind == "part" && u.first == m {
			add(m.Pos, "part layout %s has a slot axis S; only pool layouts have one", d.Name)
		}
	}
	for _, a := range axisNames {
		u := uses[a]
		if u == nil {
			switch {
			case a != "S":
				add(d.Pos, "layout %s is missing axis %s", d.Name, a)
			case d.Kind == "pool":
				add(d.Pos, "pool layout %s has no slot axis S", d.Name)
			}
			continue
		}
		if !Splittable(a) || u.repeated || u.whole != nil {
			continue
		}
		switch {
		case u.outer != nil && u.inner == nil:
			add(u.outer.Pos, "%s has no matching %s%%%d", u.outer, a, u.outer.Factor)
		case u.inner != nil && u.outer == nil:
			add(u.inner.Pos, "%s has no matching %s/%d", u.inner, a, u.inner.Factor)
		case u.inner != nil && u.outer != nil:
			if u.outer.Factor != u.inner.Factor {
				later := u.outer
				if u.innerIdx > u.outerIdx {
					later = u.inner
				}
				add(later.Pos, "%s and %s split %s by different factors", u.outer, u.inner, a)
			}
			if u.innerIdx < u.outerIdx {
				add(u.inner.Pos, "%s must come after %s/%d", u.inner, a, u.inner.Factor)
			}
		}
	}
	// The errors about the whole layout first, where a .kvl file has its
	// declaration, before its modes; then by position; each group in the
	// order found. So an order text (ParseOrder) gives its errors in the
	// order kvlc gives them for the same layout in a file.
	sort.SliceStable(errs, func(i, j int) bool {
		a, b := errs[i].Pos, errs[j].Pos
		if (a.Line == 0) != (b.Line == 0) {
			return a.Line == 0
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Column < b.Column
	})
	return errs
}
