//go:build race

package api

// raceEnabled: the tests run under the race detector, which makes every
// request many times slower.
const raceEnabled = true
