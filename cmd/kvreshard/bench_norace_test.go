//go:build !race

package main

// benchRace: under the race detector the benchmark suite takes half a
// minute and its figures mean nothing, so its test is skipped.
const benchRace = false
