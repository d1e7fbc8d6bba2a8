package dsl

import (
	"fmt"
	"regexp"

	"github.com/alecthomas/participle/v2/lexer"
)

// Axes lists the axes in the order messages name them.
var Axes = []string{"C", "S", "T", "L", "H", "D"}

// MaxFactor is the largest split factor the checker accepts.
const MaxFactor = 1 << 20

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func isAxis(a string) bool {
	for _, x := range Axes {
		if a == x {
			return true
		}
	}
	return false
}

// splittable reports whether an axis may be split into X/n and X%n.
func splittable(a string) bool { return a == "T" || a == "D" }

// Check returns every semantic error in f, in position order, or nil.
func Check(f *File) ErrorList {
	if f == nil {
		return nil
	}
	var errs ErrorList
	first := map[string]*Layout{}
	for _, l := range f.Layouts {
		if l == nil {
			continue
		}
		errs = append(errs, checkLayout(l)...)
		if prev, ok := first[l.Name]; ok {
			errs = append(errs, errorf(l.Pos, "duplicate layout %q, first defined at %s", l.Name, at(prev.Pos)))
		} else {
			first[l.Name] = l
		}
	}
	errs.sort()
	return errs
}

func errorf(pos lexer.Position, format string, args ...any) *Error {
	return &Error{Pos: pos, Msg: fmt.Sprintf(format, args...)}
}

// axisUse records where one axis occurs in an order.
type axisUse struct {
	first, whole, outer, inner *Mode
	outerIdx, innerIdx         int
	repeated                   bool
}

// checkLayout returns the errors of one layout, unsorted.
func checkLayout(l *Layout) ErrorList {
	var errs ErrorList
	add := func(pos lexer.Position, format string, args ...any) {
		errs = append(errs, errorf(pos, format, args...))
	}
	if l.Kind != "part" && l.Kind != "pool" {
		add(l.Pos, "unknown layout kind %q; kinds are part and pool", l.Kind)
	}
	if l.Name == "part" || l.Name == "pool" || l.Name == "order" {
		add(l.Pos, "invalid layout name %q; part, pool and order are keywords", l.Name)
	} else if !identRE.MatchString(l.Name) {
		add(l.Pos, "invalid layout name %q; a name is a letter or _ followed by letters, digits and _", l.Name)
	}
	uses := map[string]*axisUse{}
	for i, m := range l.Order {
		if m == nil {
			continue
		}
		if !isAxis(m.Axis) {
			add(m.Pos, "unknown axis %q; axes are C, S, T, L, H, D", m.Axis)
			continue
		}
		switch m.Op {
		case "":
			if m.Factor != 0 {
				add(m.Pos, "whole axis %s has a split factor %d", m.Axis, m.Factor)
			}
		case "/", "%":
			if !splittable(m.Axis) {
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
			u = &axisUse{first: m}
			uses[m.Axis] = u
		} else {
			var earlier *Mode
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
				add(m.Pos, "axis %s appears twice in layout %s, first at %s", m.Axis, l.Name, at(earlier.Pos))
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
		if m.Axis == "S" && l.Kind == "part" && u.first == m {
			add(m.Pos, "part layout %s has a slot axis S; only pool layouts have one", l.Name)
		}
	}
	for _, a := range Axes {
		u := uses[a]
		if u == nil {
			switch {
			case a != "S":
				add(l.Pos, "layout %s is missing axis %s", l.Name, a)
			case l.Kind == "pool":
				add(l.Pos, "pool layout %s has no slot axis S", l.Name)
			}
			continue
		}
		if !splittable(a) || u.repeated || u.whole != nil {
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
	return errs
}
