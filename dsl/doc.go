// Package dsl parses and checks the .kvl layout language, in which physical
// KV-cache layouts are declared. This comment is the language's manual.
//
// # Example
//
//	// Store parts: no slot axis.
//	part PLHD "token-major; SGLang page_first" { order C T L H D }
//	part LPHD "layer-major"                   { order C L T H D }
//	part HPLD "head-major; SGLang page_head"  { order C H T L D }
//
//	// Host pools: S is the page slot. A writer of such a pool stores its
//	// pages in the part layout the pool writes, unless it names another.
//	pool page_first        { order C S T L H D writes PLHD }
//	pool page_first_direct { order C S L T H D writes LPHD }
//	pool layer_first       { order C L S T H D writes LPHD }
//	pool page_head         { order C S H T L D writes HPLD }
//
//	// vLLM x-blocked key cache: D split into D/8 blocks of 8 elements.
//	part vllm_xblock "vLLM x-blocked" { order C L H D/8 T D%8 }
//
// # Axes
//
//	C  component: K and V (or one latent for MLA)
//	S  page slot of a host pool
//	T  token within a page
//	L  layer
//	H  KV head
//	D  element within one head
//
// A layout is an order of axes, outermost first. Shapes come from the model
// and the placement and strides are derived (dense), so an order is all a
// layout declares.
//
// # Grammar
//
//	File   = { Decl } .
//	Decl   = Kind Name [ Doc ] "{" "order" Mode { Mode } [ "writes" Name ] "}" .
//	Kind   = "part" | "pool" .
//	Mode   = Axis [ ( "/" | "%" ) Factor ] .
//	Axis   = Ident .   (one of C S T L H D; checked, not parsed)
//	Name   = Ident .   (not a keyword)
//	Ident  = ( letter | "_" ) { letter | digit | "_" } .   (ASCII letters)
//	Factor = digit { digit } .   (decimal; leading zeros do not mean octal)
//	Doc    = a double-quoted string on one line, with Go's escapes .
//
// Comments run from // to the end of the line. Spaces, tabs and line breaks
// separate tokens and are otherwise insignificant; a declaration may span
// lines. Source text must be UTF-8. An empty file (or one holding only
// comments) is valid and declares nothing. The keywords part, pool, order
// and writes are reserved: they cannot name a layout.
//
// A part layout says how one Part (one writer rank's share of a page) is laid
// out in the store. A pool layout says how a rank's host pool holds many
// pages; its S axis is the page slot. A pool layout may name, after its
// order, the part layout that writers of such a pool store their pages in
// by default (writes PLHD): the runtime's writers use it when they are
// given none. The name must be a part layout compiled with it (the
// compiler checks; it may be in another file of the unit).
//
// # Split axes
//
// A mode is a whole axis or one half of a split axis. X/n is the outer half
// (X/n blocks) and X%n the inner half (n elements), so that element x of X
// sits at block x/n, offset x%n. The split of vLLM's x-blocked key cache is
// written "D/8 ... D%8". Only T and D may be split, each at most once.
// Different layouts may split an axis by different factors: the compiler
// joins any two of them (see package compiler/ir).
//
// # Rules
//
// Check enforces these rules; each broken rule is one error, positioned at
// the offending node (a mode, or the layout when the rule is about the whole
// layout), and every error in a file is reported, sorted by position:
//
//   - Every axis is one of C, S, T, L, H, D:
//     unknown axis "Q"; axes are C, S, T, L, H, D
//   - Every axis appears exactly once, whole or as its two halves. A repeated
//     axis, a repeated half, or a whole axis beside a half of it is reported
//     at the later mode, citing the earlier one:
//     axis T appears twice in layout PLHD, first at 3:21
//   - Every axis but S appears:
//     layout PLHD is missing axis H
//   - S appears in pool layouts and only there:
//     part layout PLHD has a slot axis S; only pool layouts have one
//     pool layout page_first has no slot axis S
//   - Layout names are unique in a file:
//     duplicate layout "PLHD", first defined at 2:1
//   - Only a pool layout writes a part layout:
//     part layout x writes PLHD; only a pool layout names the part layout it writes
//     (and, checked by the compiler across the unit's files:
//     pool layout p writes unknown layout "z"; part layouts are PLHD, LPHD, HPLD
//     pool layout q writes p, a pool layout; it writes a part layout)
//   - A split factor is an integer from 2 to MaxFactor:
//     split factor of D must be a positive integer, got 0
//     split factor of D must be at least 2, got 1
//     split factor of D must be at most 1048576, got 2097152
//     (a literal too large for an int is a syntax error:
//     split factor 99999999999999999999 is out of range; the maximum is 1048576)
//   - Only T and D may be split:
//     axis L cannot be split; only T and D can
//   - A split axis has both halves, with the same factor, the outer first:
//     D/8 has no matching D%8
//     D%8 has no matching D/8
//     D/8 and D%4 split D by different factors   (at the later half)
//     D%8 must come after D/8
//
// Rules about what bytes a layout can hold at run time (whether K and V head
// dims may differ, whether a factor divides a dimension) are checked where
// the shapes are known, not here.
//
// A syntax error stops parsing and is reported alone, as one error naming
// what was found and what was expected:
//
//	layout.kvl:3:27: unexpected "}"; expected a split factor
//
// # API
//
// Parse parses and checks a file; Check checks a File built in memory.
// File.String prints the canonical form, one declaration per line, which
// parses back to an equal AST. ParseOrder reads just an order, as
// Decl.OrderString prints it and a manifest stores it, and checks it as
// the layout of the given kind and name.
package dsl
