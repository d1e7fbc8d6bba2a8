// Package layouts holds kvreshard's built-in layouts (builtin.kvl) and the
// kernels kvlc generated for every pair of them. Import it for its side
// effect of registering the layouts by name and their kernels:
//
//	import _ "github.com/kvreshard/kvreshard/layouts"
//
// and find them with kernel.LayoutNamed. It links no .kvl parser.
package layouts

import _ "embed"

//go:generate go run github.com/kvreshard/kvreshard/cmd/kvlc -o builtin_kvl.go -pkg layouts builtin.kvl

// Builtin is the text of builtin.kvl.
//
//go:embed builtin.kvl
var Builtin []byte
