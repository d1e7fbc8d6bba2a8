// Package layouts holds kvreshard's built-in layouts (builtin.kvl) and the
// kernels kvlc generated for every pair of them. Import it for its side
// effect of registering those kernels:
//
//	import _ "github.com/kvreshard/kvreshard/layouts"
package layouts

import (
	_ "embed"
	"fmt"
	"strings"
	"sync"

	"github.com/kvreshard/kvreshard/compiler"
)

//go:generate go run github.com/kvreshard/kvreshard/cmd/kvlc -o builtin_kvl.go -pkg layouts builtin.kvl

// Builtin is the text of builtin.kvl.
//
//go:embed builtin.kvl
var Builtin []byte

var (
	once    sync.Once
	builtin map[string]*compiler.Layout
	names   []string
)

func load() {
	f, err := compiler.Compile("builtin.kvl", Builtin)
	if err != nil {
		panic("layouts: builtin.kvl does not compile: " + err.Error())
	}
	builtin = map[string]*compiler.Layout{}
	for _, l := range f.Layouts {
		builtin[l.Name] = l
		names = append(names, l.Name)
	}
}

// Get returns the built-in layout called name.
func Get(name string) (*compiler.Layout, error) {
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
