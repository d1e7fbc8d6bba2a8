package dsl

import (
	"github.com/alecthomas/participle/v2/lexer"
)

// builtins are kvreshard's built-in layouts with three vLLM and FlashInfer
// ones, as the language's manual shows them.
const builtins = `// Store parts: no slot axis.
part PLHD "token-major; SGLang page_first" { order C T L H D }
part LPHD "layer-major"                   { order C L T H D }
part HPLD "head-major; SGLang page_head"  { order C H T L D }

// Host pools: S is the page slot.
pool page_first        { order C S T L H D }
pool page_first_direct { order C S L T H D }
pool layer_first       { order C L S T H D }
pool page_head         { order C S H T L D }

// vLLM x-blocked key cache: D split into D/8 blocks of 8 elements
part vllm_xblock "vLLM x-blocked" { order C L H D/8 T D%8 }
part vllm_flash { order L C T H D }
part flashinfer_hnd { order L C H T D }
`

// noPos returns a copy of f with every position zeroed and empty slices
// made nil, for comparing ASTs.
func noPos(f *File) *File {
	if f == nil {
		return nil
	}
	out := &File{}
	for _, l := range f.Decls {
		out.Decls = append(out.Decls, layoutNoPos(l))
	}
	return out
}

func layoutNoPos(l *Decl) *Decl {
	c := *l
	c.Pos = lexer.Position{}
	c.Order = nil
	for _, m := range l.Order {
		mc := *m
		mc.Pos = lexer.Position{}
		c.Order = append(c.Order, &mc)
	}
	if l.Writes != nil {
		c.Writes = &Ref{Name: l.Writes.Name}
	}
	return &c
}
