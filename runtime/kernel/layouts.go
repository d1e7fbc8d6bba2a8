package kernel

import (
	"fmt"
	"strings"
	"sync"

	"github.com/kvreshard/kvreshard/compiler/ir"
)

// LayoutDecl is a layout as its declaration gives it: what a generated file
// registers for each layout of its .kvl files, and what a program defines
// at run time (from the C library or Python).
type LayoutDecl struct {
	Kind   string // "part" or "pool"
	Name   string
	Order  string // the order text, as "C L H D/8 T D%8"
	Doc    string
	Writes string // a pool's default part layout, "" for none (see ir.Layout.Writes)
	Origin string // where it was declared: "builtin.kvl:5:1", "defined at run time"
}

// layouts holds the registered layouts by name, in registration order.
var layouts struct {
	sync.RWMutex
	byName map[string]*ir.Layout
	names  []string
}

// RegisterLayout checks d by the rules of the .kvl language (the messages
// kvlc gives, see ir.ParseOrder) and registers it under its name, so that
// LayoutNamed finds it. Registering a name again with the same kind, order
// and default part returns the layout registered first; anything else under
// a registered name is an error naming both. A layout needs no kernels:
// pairs without generated ones run on the interpreter. Safe for concurrent
// use.
func RegisterLayout(d LayoutDecl) (*ir.Layout, error) {
	od, err := ir.ParseOrder(d.Kind, d.Name, d.Order)
	if err != nil {
		return nil, err
	}
	l := od.Layout()
	l.Doc, l.Writes, l.Pos = d.Doc, d.Writes, d.Origin
	if d.Writes != "" && l.Kind != ir.Pool {
		return nil, fmt.Errorf("layout %q: a part layout writes no part layout (writes %q)", d.Name, d.Writes)
	}
	layouts.Lock()
	defer layouts.Unlock()
	if old, ok := layouts.byName[l.Name]; ok {
		if old.Identity() == l.Identity() && old.Writes == l.Writes {
			return old, nil
		}
		return nil, fmt.Errorf("layout %q is already %s (%s); %s declares it %s",
			l.Name, describe(old), origin(old), origin(l), describe(l))
	}
	if layouts.byName == nil {
		layouts.byName = map[string]*ir.Layout{}
	}
	layouts.byName[l.Name] = l
	layouts.names = append(layouts.names, l.Name)
	return l, nil
}

func describe(l *ir.Layout) string {
	if l.Writes != "" {
		return l.Identity() + " writing " + l.Writes
	}
	return l.Identity()
}

func origin(l *ir.Layout) string {
	if l.Pos == "" {
		return "unknown origin"
	}
	return l.Pos
}

// MustRegisterLayout is RegisterLayout for init functions.
func MustRegisterLayout(d LayoutDecl) {
	if _, err := RegisterLayout(d); err != nil {
		panic("kernel: " + err.Error())
	}
}

// LayoutNamed returns the layout registered under name. The layout is
// shared: callers must not change it.
func LayoutNamed(name string) (*ir.Layout, error) {
	layouts.RLock()
	l, ok := layouts.byName[name]
	layouts.RUnlock()
	if !ok {
		return nil, fmt.Errorf("unknown layout %q; layouts are %s", name, ListNames(LayoutNames()))
	}
	return l, nil
}

// Layouts returns the registered layouts in registration order: within a
// generated file, the order of its declarations.
func Layouts() []*ir.Layout {
	layouts.RLock()
	defer layouts.RUnlock()
	out := make([]*ir.Layout, len(layouts.names))
	for i, n := range layouts.names {
		out[i] = layouts.byName[n]
	}
	return out
}

// LayoutNames returns the names of Layouts.
func LayoutNames() []string {
	layouts.RLock()
	defer layouts.RUnlock()
	return append([]string(nil), layouts.names...)
}

// maxListed bounds the names ListNames shows.
const maxListed = 16

// ListNames joins names for a message: the first maxListed of them, then
// how many more there are, so that a process that registered many layouts
// keeps its messages short.
func ListNames(names []string) string {
	if len(names) <= maxListed {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:maxListed], ", "), len(names)-maxListed)
}

// LayoutsOf returns the names of the registered layouts of kind k.
func LayoutsOf(k ir.Kind) []string {
	var out []string
	for _, l := range Layouts() {
		if l.Kind == k {
			out = append(out, l.Name)
		}
	}
	return out
}

// DefaultPart returns the part layout a writer of pool layout pool stores
// its pages in when it names none: the part layout pool's declaration
// writes. It is an error when the pool names none or the one it names is
// not registered.
func DefaultPart(pool *ir.Layout) (*ir.Layout, error) {
	if pool.Writes == "" {
		return nil, fmt.Errorf("pool layout %s names no part layout to write (writes); name one (%s)",
			pool.Name, ListNames(LayoutsOf(ir.Part)))
	}
	l, err := LayoutNamed(pool.Writes)
	if err != nil {
		return nil, fmt.Errorf("pool layout %s writes %s, which is not registered", pool.Name, pool.Writes)
	}
	if l.Kind != ir.Part {
		return nil, fmt.Errorf("pool layout %s writes %s, a pool layout", pool.Name, pool.Writes)
	}
	return l, nil
}

// PoolWriting returns the first registered pool layout that writes part
// layout part, or nil.
func PoolWriting(part *ir.Layout) *ir.Layout {
	for _, l := range Layouts() {
		if l.Kind == ir.Pool && l.Writes == part.Name {
			return l
		}
	}
	return nil
}
