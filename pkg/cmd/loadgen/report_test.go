package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func fullRecords() records {
	f := func(kv ...any) map[string]float64 {
		m := map[string]float64{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1].(float64)
		}
		return m
	}
	rs := records{
		"scan":              {Figures: f("items", 1000.0, "seconds", 1.0, "items_per_s", 100000.0)},
		"sync_gateway":      {Figures: f("items", 1000.0, "seconds", 1.5, "items_per_s", 75000.0)},
		"sync_reader":       {Figures: f("items", 1000.0, "seconds", 1.4, "items_per_s", 70000.0)},
		"sales":             {Figures: f("pairs_per_s", 2500.0, "p50_ms", 5.0, "p99_ms", 30.0, "errors", 0.0)},
		"incremental":       {Figures: f("items", 10.0, "seconds", 0.015)},
		"rss_gateway_256":   {Figures: f("peak_rss_mb", 80.0)},
		"rss_export_reader": {Figures: f("peak_rss_mb", 60.0)},
	}
	for _, c := range []string{"64", "256"} {
		rs["get_nginx_"+c] = Record{Figures: f("rps", 20000.0, "p50_ms", 2.0, "p99_ms", 9.0, "errors", 0.0)}
		rs["get_gateway_"+c] = Record{Figures: f("rps", 21000.0, "p50_ms", 2.0, "p99_ms", 9.0, "errors", 0.0)}
		rs["get_nolimit_"+c] = Record{Figures: f("rps", 25000.0, "p50_ms", 2.0, "p99_ms", 9.0, "errors", 0.0)}
	}
	return rs
}

func TestBuildRowsVerdicts(t *testing.T) {
	rs := fullRecords()
	rs["get_gateway_256"].Figures["errors"] = 3
	rs["get_nolimit_256"].Figures["rps"] = 21000 / 0.8496
	rs["get_plainhop_64"] = Record{Figures: map[string]float64{"rps": 16800, "p50_ms": 3, "p99_ms": 12}}
	rs["sync_nginx"] = Record{Figures: map[string]float64{"items": 1000, "seconds": 1.6, "items_per_s": 62500}}
	got := map[string][2]string{}
	for _, r := range buildRows(rs, []int{64, 256}) {
		got[r.Scenario] = [2]string{r.Ratio, r.Result}
	}
	want := map[string][2]string{
		"full sync, limit=100, ENG, via gateway":                            {"0.75×", "pass"},
		"full sync, direct to export-reader":                                {"0.70×", "**miss**"},
		"GET item by id, 64 conns, via gateway":                             {"1.05×", "pass"},
		"GET item by id, 64 conns, plain Fiber proxy hop (reference)":       {"0.84×", "—"},
		"full sync, same, via nginx → export-reader (reference)":            {"0.62×", "—"},
		"same, rate limiting on vs off (64 conns)":                          {"0.84×", "**miss**"},
		"GET item by id, 256 conns, via gateway":                            {"1.05×", "pass; get_gateway_256 had 3 failed requests"},
		"confirm + cancel pairs, distinct items, 32 platforms, via gateway": {"—", "**miss**"}, // p99 30 ms
		"incremental sync after 1% of items changed, via gateway":           {"0.010×", "—"},
		"peak RSS, gateway during the 256-connection GET runs":              {"—", "pass"},
		"peak RSS, export reader":                                           {"—", "—"},
	}
	for scenario, w := range want {
		if diff := cmp.Diff(w, got[scenario]); diff != "" {
			t.Errorf("buildRows() row %q (-want +got):\n%s", scenario, diff)
		}
	}
}

// The plain hop's row is there only when the run measured it (older
// results files have no such record).
func TestBuildRowsReferenceOnlyWhenRun(t *testing.T) {
	for _, r := range buildRows(fullRecords(), []int{64, 256}) {
		if strings.Contains(r.Scenario, "plain Fiber") || strings.Contains(r.Scenario, "nginx → export-reader (reference)") {
			t.Errorf("buildRows() without plain hop records has row %q", r.Scenario)
		}
	}
}

// The plain hop's row shows its figure and the nginx baseline as the GET
// rows do, a ratio when both ran, and no target.
func TestBuildRowsReferenceRow(t *testing.T) {
	const label = "GET item by id, 64 conns, plain Fiber proxy hop (reference)"
	plain := func(figures map[string]float64) records {
		rs := fullRecords()
		rs["get_plainhop_64"] = Record{Figures: figures}
		return rs
	}
	tests := []struct {
		name string
		rs   records
		want row
	}{
		{"measured", plain(map[string]float64{"rps": 16800, "p50_ms": 3, "p99_ms": 12.5, "errors": 0}),
			row{label, "16,800 rps, p50 3.00 ms, p99 12.5 ms", "20,000 rps, p50 2.00 ms, p99 9.00 ms", "0.84×", "—", "—"}},
		{"failed requests", plain(map[string]float64{"rps": 16800, "p50_ms": 3, "p99_ms": 12, "errors": 5}),
			row{label, "16,800 rps, p50 3.00 ms, p99 12.0 ms", "20,000 rps, p50 2.00 ms, p99 9.00 ms", "0.84×", "—", "—; get_plainhop_64 had 5 failed requests"}},
		{"no rps", plain(map[string]float64{"errors": 0}),
			row{label, "not run", "20,000 rps, p50 2.00 ms, p99 9.00 ms", "—", "—", "—"}},
		{"zero rps", plain(map[string]float64{"rps": 0, "p50_ms": 0, "p99_ms": 0}),
			row{label, "0 rps, p50 0.00 ms, p99 0.00 ms", "20,000 rps, p50 2.00 ms, p99 9.00 ms", "—", "—", "—"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got *row
			for _, r := range buildRows(tt.rs, []int{64}) {
				if r.Scenario == label {
					got = &r
				}
			}
			if got == nil {
				t.Fatalf("buildRows() has no row %q", label)
			}
			if diff := cmp.Diff(tt.want, *got); diff != "" {
				t.Errorf("buildRows() reference row (-want +got):\n%s", diff)
			}
		})
	}
}

func TestBuildRowsMissingScenario(t *testing.T) {
	rs := fullRecords()
	delete(rs, "scan")
	found := false
	for _, r := range buildRows(rs, []int{64}) {
		if r.Scenario == "full sync, limit=100, ENG, via gateway" {
			found = true
			if r.Result != "not run" || r.Baseline != "not run" {
				t.Errorf("buildRows() without scan: sync baseline, result = %q, %q, want not run", r.Baseline, r.Result)
			}
		}
	}
	if !found {
		t.Errorf("buildRows() has no gateway sync row")
	}
}

func TestMergeBlock(t *testing.T) {
	block := beginMarker + "\nnew table\n" + endMarker + "\n"
	tests := []struct {
		name, doc, want string
	}{
		{"replaces between markers, keeps the reading",
			"# Benchmarks\n\nintro\n\n" + beginMarker + "\nold table\n" + endMarker + "\n\n## Reading\n\ntext\n",
			"# Benchmarks\n\nintro\n\n" + block + "\n## Reading\n\ntext\n"},
		{"appends to a file without markers",
			"# Benchmarks\n\nintro\n",
			"# Benchmarks\n\nintro\n\n" + block},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, string(mergeBlock([]byte(tt.doc), []byte(block)))); diff != "" {
				t.Errorf("mergeBlock() mismatch (-want +got):\n%s", diff)
			}
		})
	}
	if got := string(mergeBlock(nil, []byte(block))); !strings.HasPrefix(got, "# Benchmarks\n") || !strings.HasSuffix(got, block) {
		t.Errorf("mergeBlock(empty) = %q, want a titled file ending in the block", got)
	}
}

func TestThousands(t *testing.T) {
	for in, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 1234567.6: "1,234,568", -12345: "-12,345"} {
		if got := thousands(in); got != want {
			t.Errorf("thousands(%v) = %q, want %q", in, got, want)
		}
	}
}

func TestRenderBlockListsFailures(t *testing.T) {
	var b strings.Builder
	renderBlock(&b, machine{CPUs: 2, MemoryGB: 1}, 1000, "quick", "", nil, nil, []string{"sales", "get_gateway_64#2"})
	if !strings.Contains(b.String(), "Failed in this run (no figure): sales, get_gateway_64#2.") {
		t.Errorf("renderBlock() = %q, want the failed scenarios listed", b.String())
	}
	if !strings.HasPrefix(b.String(), beginMarker) || !strings.HasSuffix(b.String(), endMarker+"\n") {
		t.Errorf("renderBlock() is not wrapped in the markers: %q", b.String())
	}
}

// The sales figure is the best round's and names the slowest round too.
func TestSalesRowShowsTheSlowestRound(t *testing.T) {
	rs := fullRecords()
	delete(rs, "sales")
	for i, pairs := range []float64{1900, 2100, 1700} {
		name := fmt.Sprintf("sales#%d", i+1)
		rs[name] = Record{Scenario: name, Figures: map[string]float64{"pairs_per_s": pairs, "p50_ms": 8, "p99_ms": 15, "errors": 0}}
	}
	rs = bestOfRounds(rs)
	for _, r := range buildRows(rs, []int{64}) {
		if !strings.HasPrefix(r.Scenario, "confirm + cancel") {
			continue
		}
		want := "2,100 pairs/s, request p50 8.00 ms, p99 15.0 ms (best of 3 rounds; the slowest 1,700 pairs/s)"
		if r.Figure != want || r.Result != "pass" {
			t.Errorf("sales row = %q, %q; want %q, pass", r.Figure, r.Result, want)
		}
		return
	}
	t.Fatal("no sales row")
}

// The machine's line of the report names its memory (procfs's meminfo).
func TestThisMachine(t *testing.T) {
	if _, err := os.Stat("/proc/meminfo"); err != nil {
		t.Skip("no /proc/meminfo here")
	}
	if m := thisMachine(time.Now()); m.MemoryGB <= 0 || m.CPUs <= 0 {
		t.Errorf("thisMachine() = %+v, want its CPUs and memory", m)
	}
}

// rss records a process's peak resident set (VmHWM) in MB: this test
// binary's is a few MB, far from its bytes or kB.
func TestRSSRecordsThePeak(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("no /proc here")
	}
	results := filepath.Join(t.TempDir(), "results.jsonl")
	args := []string{"--name", "rss_self", "--pid", strconv.Itoa(os.Getpid())}
	if err := runRSS(context.Background(), Config{Results: results}, args, io.Discard); err != nil {
		t.Fatalf("rss %v = %v", args, err)
	}
	f, err := os.Open(results)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := readRecords(f)
	if err != nil {
		t.Fatal(err)
	}
	if mb := recs["rss_self"].Figures["peak_rss_mb"]; len(recs) != 1 || mb < 1 || mb > 4096 {
		t.Errorf("records = %+v, want rss_self with a peak of a few MB", recs)
	}
}
