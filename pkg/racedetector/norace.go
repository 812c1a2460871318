//go:build !race

// Package racedetector tells whether the race detector is on (go test -race, as
// GOTEST_FLAGS=-race make test runs it). Tests that count allocations skip
// then: the detector's instrumentation allocates, and sync.Pool drops what
// is put back at random, so the counts say nothing of the code. The
// standard library's tests do the same (internal/race). pkg/rawio's
// sockets read and write through net's own calls under it.
package racedetector

// Enabled: this binary was built with -race.
const Enabled = false
