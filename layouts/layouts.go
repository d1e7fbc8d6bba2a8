// Package layouts holds kvreshard's built-in layouts (builtin.kvl) and the
// kernels kvlc generated for every pair of them. Import it for its side
// effect of registering those kernels:
//
//	import _ "github.com/kvreshard/kvreshard/layouts"
//
// It links no .kvl parser: the layouts are read from their orders with the
// IR's own order parser (a test keeps them equal to builtin.kvl).
package layouts

import (
	_ "embed"
	"fmt"
	"strings"
	"sync"

	"github.com/kvreshard/kvreshard/compiler/ir"
)

//go:generate go run github.com/kvreshard/kvreshard/cmd/kvlc -o builtin_kvl.go -pkg layouts builtin.kvl

// Builtin is the text of builtin.kvl.
//
//go:embed builtin.kvl
var Builtin []byte

// decls are the declarations of builtin.kvl, in its order.
var decls = []struct {
	kind             ir.Kind
	name, doc, order string
}{
	{ir.Part, "PLHD", "token-major; SGLang page_first", "C T L H D"},
	{ir.Part, "LPHD", "layer-major; SGLang page_first_direct and layer_first", "C L T H D"},
	{ir.Part, "HPLD", "head-major; SGLang page_head", "C H T L D"},
	{ir.Pool, "page_first", "", "C S T L H D"},
	{ir.Pool, "page_first_direct", "", "C S L T H D"},
	{ir.Pool, "layer_first", "", "C L S T H D"},
	{ir.Pool, "page_head", "", "C S H T L D"},
}

var (
	once    sync.Once
	builtin map[string]*ir.Layout
	names   []string
)

func load() {
	builtin = map[string]*ir.Layout{}
	for _, d := range decls {
		l, err := ir.ParseLayout(d.kind, d.name, d.order)
		if err != nil {
			panic("layouts: a built-in layout does not parse: " + err.Error())
		}
		l.Doc = d.doc
		builtin[l.Name] = l
		names = append(names, l.Name)
	}
}

// Get returns the built-in layout called name.
func Get(name string) (*ir.Layout, error) {
	once.Do(load)
	if l, ok := builtin[name]; ok {
		return l, nil
	}
	return nil, fmt.Errorf("unknown layout %q; built-in layouts are %s", name, strings.Join(names, ", "))
}

// Names lists the built-in layouts in declaration order.
func Names() []string {
	once.Do(load)
	return append([]string(nil), names...)
}
