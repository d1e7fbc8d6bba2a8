// Package dsl parses and checks the .kvl layout language.
//
// The full manual is being written; see Parse, Check and ParseOrder.
package dsl
