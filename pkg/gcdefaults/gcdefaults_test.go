package gcdefaults

import (
	"math"
	"runtime/debug"
	"testing"
)

func TestApply(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))

	Apply(func(string) string { return "" })
	if got := debug.SetGCPercent(100); got != GCPercent {
		t.Errorf("GC percent = %d, want %d", got, GCPercent)
	}
	if got := debug.SetMemoryLimit(math.MaxInt64); got != MemoryLimit {
		t.Errorf("memory limit = %d, want %d", got, MemoryLimit)
	}

	// Set by the operator: the runtime already applied them; leave them be.
	Apply(func(string) string { return "set" })
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("GC percent with GOGC set = %d, want untouched 100", got)
	}
	if got := debug.SetMemoryLimit(math.MaxInt64); got != math.MaxInt64 {
		t.Errorf("memory limit with GOMEMLIMIT set = %d, want untouched", got)
	}
}
