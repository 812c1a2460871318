// Package gcdefaults sets the Go collector's defaults of the request-serving
// binaries whose allocations die with their request.
//
// Their live heap is a few MB, so Go's default (a collection each time the
// heap doubles) collects thousands of times a minute under load: CPU taken
// from PostgreSQL and the other processes on the same machine. Collecting at
// 5× the live heap does a quarter of that work; the memory limit bounds the
// heap all the same (the collector works harder as it nears the limit).
package gcdefaults

import (
	"fmt"
	"log/slog"
	"math"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/coinexport/export/pkg/envconfig"
)

// The defaults, used unless GOGC or GOMEMLIMIT are set.
const (
	GCPercent   = 400
	MemoryLimit = 100 << 20
)

// Settings are GOGC and GOMEMLIMIT as the environment gives them, empty
// where unset. The runtime applies what is set by itself; Apply adds the
// defaults for the rest. A binary's Config holds them, so that its start-up
// log shows them.
type Settings struct {
	GOGC, GOMEMLIMIT string
}

// Names are the variables Read reads, for a binary's list of settings
// (envconfig.Misspelt).
var Names = []string{"GOGC", "GOMEMLIMIT"}

// Read takes the settings from the environment.
func Read(getenv func(string) string) Settings {
	return Settings{GOGC: getenv("GOGC"), GOMEMLIMIT: getenv("GOMEMLIMIT")}
}

// GOGCProblem says what is wrong with GOGC, "" if nothing: the runtime
// reads "off" or a whole number, and takes anything else as 100 without a
// word, neither the value meant nor this package's default. (A malformed
// GOMEMLIMIT needs no check here: the runtime stops the binary with
// "malformed GOMEMLIMIT" before main runs.)
func (s Settings) GOGCProblem() string {
	if s.GOGC == "" || s.GOGC == "off" {
		return ""
	}
	if n, err := strconv.ParseInt(s.GOGC, 10, 32); err != nil || n < 0 {
		return fmt.Sprintf("GOGC must be off or a whole number (the heap growth in percent, e.g. 400) (got %s)", envconfig.Shown(s.GOGC))
	}
	return ""
}

// MinMemoryLimit is the smallest GOMEMLIMIT accepted: a gateway at rest
// holds 12 MB from the system, under a limit below that the collector runs
// without pause.
const MinMemoryLimit = 16 << 20

// GOMEMLIMITProblem says what is wrong with GOMEMLIMIT, "" if nothing. The
// runtime reads any byte count, 0 included, and this project's settings
// read 0 as off: with GOMEMLIMIT=0, 300 requests to a gateway made 1,053
// collections and 2.08 s of CPU (none and 0.15 s with the default).
func (s Settings) GOMEMLIMITProblem() string {
	if s.GOMEMLIMIT == "" || s.GOMEMLIMIT == "off" {
		return ""
	}
	if n, ok := byteCount(s.GOMEMLIMIT); ok && n >= MinMemoryLimit {
		return ""
	}
	return fmt.Sprintf("GOMEMLIMIT must be off or at least 16MiB, a number of bytes with B, KiB, MiB, GiB or TiB (e.g. 100MiB): under what the runtime itself holds the collector runs without pause, and 0 is such a limit, not off (got %s)", envconfig.Shown(s.GOMEMLIMIT))
}

// byteCount reads a byte count as the runtime reads GOMEMLIMIT.
func byteCount(v string) (int64, bool) {
	shift := 0
	for _, unit := range []struct {
		suffix string
		shift  int
	}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}} {
		if rest, ok := strings.CutSuffix(v, unit.suffix); ok {
			v, shift = rest, unit.shift
			break
		}
	}
	n, err := strconv.ParseUint(v, 10, 63)
	if err != nil || n > math.MaxInt64>>shift {
		return 0, false
	}
	return int64(n) << shift, true
}

// Check records the settings' problems with the binary's others: a
// binary that keeps Go's own defaults (no Apply) checks them all the same,
// as the runtime reads a bad GOGC as 100 and a GOMEMLIMIT of 0 as a limit.
func (s Settings) Check(r *envconfig.Reader) {
	r.Check(s.GOGCProblem() == "", s.GOGCProblem())
	r.Check(s.GOMEMLIMITProblem() == "", s.GOMEMLIMITProblem())
}

// Apply sets the defaults the environment left unset.
func (s Settings) Apply() {
	if s.GOGC == "" {
		debug.SetGCPercent(GCPercent)
	}
	if s.GOMEMLIMIT == "" {
		debug.SetMemoryLimit(MemoryLimit)
	}
}

// InForce is the settings as they stand once Apply has run: each one the
// environment left unset is this package's default, written as its
// variable would be (400, 100MiB). The configuration tests compare a
// README's documented defaults with it (pkg/envdoc).
func (s Settings) InForce() Settings {
	return Settings{
		GOGC:       orDefault(s.GOGC, strconv.Itoa(GCPercent)),
		GOMEMLIMIT: orDefault(s.GOMEMLIMIT, fmt.Sprintf("%dMiB", MemoryLimit>>20)),
	}
}

// LogValue shows each setting in force, and whether it is the default.
func (s Settings) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("gogc", orDefault(s.GOGC, fmt.Sprintf("%d (default)", GCPercent))),
		slog.String("gomemlimit", orDefault(s.GOMEMLIMIT, fmt.Sprintf("%dMiB (default)", MemoryLimit>>20))))
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
