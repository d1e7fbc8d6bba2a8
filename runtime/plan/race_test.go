//go:build race

package plan_test

// raceEnabled scales down the random tests under the race detector.
const raceEnabled = true
