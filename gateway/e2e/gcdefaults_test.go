package e2e

import (
	"maps"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/coinexport/export/pkg/envdoc"
	"github.com/coinexport/export/pkg/testenv"
	dto "github.com/prometheus/client_model/go"
)

// readmeOf is each binary's README, from this folder.
var readmeOf = map[string]string{
	"gateway":       "../README.md",
	"export-reader": "../../services/export-reader/README.md",
	"sales-writer":  "../../services/sales-writer/README.md",
	"shop-schema":   "../../services/shop-schema/README.md",
}

// Each binary started with neither GOGC nor GOMEMLIMIT set runs its
// collector as its README's table says: the gateway and sales-writer with
// gcdefaults' 400 and 100MiB, export-reader and shop-schema with Go's own,
// 100 and no limit (a default cell of "—"). The settings tests cannot tell:
// they compare Configs, and the Config of a service that keeps Go's
// defaults holds no collector setting, so any default written in its row
// passed. The runtime reports what is in force (go_gc_gogc_percent,
// go_gc_gomemlimit_bytes on /metrics).
func TestEachBinaryRunsWithTheCollectorDefaultsOfItsTable(t *testing.T) {
	pool := testenv.Postgres(t)
	s := startStack(t, dsnOf(t, pool), testenv.RedisURL(t))
	families := s.metricFamilies(t)
	for _, name := range slices.Sorted(maps.Keys(binaries)) {
		gogc, memlimit := documentedCollector(t, name)
		if got := gaugeOf(t, families[name], name, "go_gc_gogc_percent"); got != float64(gogc) {
			t.Errorf("%s runs with GOGC %v, its README's table says %d", name, got, gogc)
		}
		if got := gaugeOf(t, families[name], name, "go_gc_gomemlimit_bytes"); got != float64(memlimit) {
			t.Errorf("%s runs with GOMEMLIMIT %v bytes, its README's table says %d", name, got, memlimit)
		}
	}
}

// documentedCollector is the GOGC and GOMEMLIMIT (bytes) the binary's
// README table gives as defaults, Go's own (100, no limit) where its row
// gives none.
func documentedCollector(t *testing.T, name string) (gogc, memlimit int64) {
	t.Helper()
	settings, err := envdoc.ReadTable(filepath.FromSlash(readmeOf[name]))
	if err != nil {
		t.Fatal(err)
	}
	gogc, memlimit = 100, math.MaxInt64
	for _, s := range settings {
		switch {
		case s.Default == "":
		case s.Name == "GOGC":
			if gogc, err = strconv.ParseInt(s.Default, 10, 64); err != nil {
				t.Fatalf("%s: GOGC's default %q: %v", readmeOf[name], s.Default, err)
			}
		case s.Name == "GOMEMLIMIT":
			mib, ok := strings.CutSuffix(s.Default, "MiB")
			n, err := strconv.ParseInt(mib, 10, 64)
			if !ok || err != nil {
				t.Fatalf("%s: GOMEMLIMIT's default %q: want N MiB", readmeOf[name], s.Default)
			}
			memlimit = n << 20
		}
	}
	return gogc, memlimit
}

// gaugeOf is the value of the one series of the gauge the binary exposes.
func gaugeOf(t *testing.T, families map[string]*dto.MetricFamily, binary, metric string) float64 {
	t.Helper()
	f, ok := families[metric]
	if !ok || len(f.GetMetric()) != 1 {
		t.Fatalf("%s's /metrics has no single series %s", binary, metric)
	}
	return f.GetMetric()[0].GetGauge().GetValue()
}
