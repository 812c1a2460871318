// Package gcdefaults sets the Go collector's defaults of the request-serving
// binaries whose allocations die with their request.
//
// Their live heap is a few MB, so Go's default (a collection each time the
// heap doubles) collects thousands of times a minute under load: CPU taken
// from PostgreSQL and the other processes on the same machine. Collecting at
// 5× the live heap does a quarter of that work; the memory limit bounds the
// heap all the same (the collector works harder as it nears the limit).
package gcdefaults

import "runtime/debug"

// The defaults, used unless GOGC or GOMEMLIMIT are set.
const (
	GCPercent   = 400
	MemoryLimit = 100 << 20
)

// Apply sets the defaults the environment (read through getenv) leaves
// unset.
func Apply(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(GCPercent)
	}
	if getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(MemoryLimit)
	}
}
