//go:build race

package rawio

// raceEnabled: see race_off.go.
const raceEnabled = true
