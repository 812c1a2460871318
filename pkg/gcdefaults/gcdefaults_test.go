package gcdefaults

import (
	"math"
	"runtime/debug"
	"testing"
)

func TestApply(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))

	Read(func(string) string { return "" }).Apply()
	if got := debug.SetGCPercent(100); got != GCPercent {
		t.Errorf("GC percent = %d, want %d", got, GCPercent)
	}
	if got := debug.SetMemoryLimit(math.MaxInt64); got != MemoryLimit {
		t.Errorf("memory limit = %d, want %d", got, MemoryLimit)
	}

	// Set by the operator: the runtime already applied them; leave them be.
	Read(func(string) string { return "set" }).Apply()
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("GC percent with GOGC set = %d, want untouched 100", got)
	}
	if got := debug.SetMemoryLimit(math.MaxInt64); got != math.MaxInt64 {
		t.Errorf("memory limit with GOMEMLIMIT set = %d, want untouched", got)
	}
}

func TestLogValueSaysWhichAreDefaults(t *testing.T) {
	tests := []struct {
		s    Settings
		want string
	}{
		{Settings{}, "[gogc=400 (default) gomemlimit=100MiB (default)]"},
		{Settings{GOGC: "off", GOMEMLIMIT: "1GiB"}, "[gogc=off gomemlimit=1GiB]"},
	}
	for _, tt := range tests {
		if got := tt.s.LogValue().String(); got != tt.want {
			t.Errorf("%+v.LogValue() = %s, want %s", tt.s, got, tt.want)
		}
	}
}

func TestGOGCProblem(t *testing.T) {
	for v, wantProblem := range map[string]bool{
		"": false, "off": false, "0": false, "400": false, "2147483647": false,
		"abc": true, "-1": true, "4e2": true, "400%": true, " 400": true, "OFF": true, "2147483648": true,
	} {
		if got := (Settings{GOGC: v}).GOGCProblem(); (got != "") != wantProblem {
			t.Errorf("GOGCProblem(GOGC=%q) = %q, want a problem: %v", v, got, wantProblem)
		}
	}
}

// InForce writes each default as its variable would be, and keeps what is set.
func TestInForce(t *testing.T) {
	if got, want := (Settings{}).InForce(), (Settings{GOGC: "400", GOMEMLIMIT: "100MiB"}); got != want {
		t.Errorf("Settings{}.InForce() = %+v, want %+v", got, want)
	}
	set := Settings{GOGC: "off", GOMEMLIMIT: "1GiB"}
	if got := set.InForce(); got != set {
		t.Errorf("%+v.InForce() = %+v, want it unchanged", set, got)
	}
}

// GOMEMLIMIT is a byte count of at least MinMemoryLimit, or off: 0, which
// other settings read as off, is a limit the collector would chase without
// pause.
func TestGOMEMLIMITProblem(t *testing.T) {
	for v, wantProblem := range map[string]bool{
		"": false, "off": false, "100MiB": false, "16MiB": false, "16777216": false, "1GiB": false, "8TiB": false,
		"0": true, "1": true, "15MiB": true, "1024KiB": true, "100MB": true, "100mib": true, "-1": true, " 100MiB": true,
		"99999999TiB": true,
	} {
		if got := (Settings{GOMEMLIMIT: v}).GOMEMLIMITProblem(); (got != "") != wantProblem {
			t.Errorf("GOMEMLIMITProblem(GOMEMLIMIT=%q) = %q, want a problem: %v", v, got, wantProblem)
		}
	}
}
