// Package splitkvl holds kernels generated from split.kvl, layouts that
// split T and D by factors that nest and that do not, for the tests of
// generated kernels (token lists among them) against the interpreter and
// the element model. Nothing but its own test imports it.
package splitkvl

//go:generate go run github.com/kvreshard/kvreshard/cmd/kvlc -o split_kvl.go -pkg splitkvl split.kvl
