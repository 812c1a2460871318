package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestCPUPartsFlag(t *testing.T) {
	var parts cpuParts
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(new(bytes.Buffer))
	fs.Var(&parts, "cpu", "")
	if err := fs.Parse([]string{"--cpu", "proxy=12", "--cpu", "postgres=34"}); err != nil {
		t.Fatal(err)
	}
	if got := parts.String(); got != "proxy=12,postgres=34" {
		t.Errorf("parts = %q, want proxy=12,postgres=34", got)
	}
	if err := parts.Set("proxy=56"); err == nil {
		t.Errorf("Set() of a part given twice accepted, want an error")
	}
	for _, bad := range []string{"proxy", "=12", "proxy=", "proxy=x", "proxy=0", "proxy=-3", "client=12"} {
		var p cpuParts
		if err := p.Set(bad); err == nil {
			t.Errorf("Set(%q) accepted, want an error", bad)
		}
	}
}

// A part is its process and every descendant, however deep.
func TestTreeTimeSumsDescendants(t *testing.T) {
	used := map[int]time.Duration{1: 1, 10: 10, 11: 100, 20: 1000, 30: 10000}
	children := map[int][]int{1: {10, 11}, 11: {20}, 99: {30}}
	if got := treeTime(1, used, children); got != 1111 {
		t.Errorf("treeTime(1) = %d, want 1111 (1 + 10 + 100 + 1000; 30 is another tree)", got)
	}
	if got := treeTime(20, used, children); got != 1000 {
		t.Errorf("treeTime(20) = %d, want 1000", got)
	}
}

// sample reads the kernel's accounting: CPU burnt in a child between two
// samples shows up in its parent's tree.
func TestSampleCountsAChildsCPU(t *testing.T) {
	child := exec.Command("sh", "-c", "while :; do :; done")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	parts := cpuParts{{"tree", os.Getpid()}, {"child", child.Process.Pid}}
	before, err := parts.sample()
	if err != nil {
		t.Fatal(err)
	}
	var after cpuSample
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if after, err = parts.sample(); err != nil {
			t.Fatal(err)
		}
		if after.used["child"]-before.used["child"] >= 50*time.Millisecond {
			break
		}
	}
	burnt := after.used["child"] - before.used["child"]
	if burnt < 50*time.Millisecond {
		t.Fatalf("child's CPU time grew by %v in 10 s of a busy loop, want at least 50ms", burnt)
	}
	if grown := after.used["tree"] - before.used["tree"]; grown < burnt {
		t.Errorf("the parent's tree grew by %v, less than its child's %v", grown, burnt)
	}
}

// A child that exits between two samples leaves its time in its parent's
// tree (as a PostgreSQL backend does under the postmaster).
func TestSampleKeepsTheTimeOfAnExitedChild(t *testing.T) {
	parts := cpuParts{{"tree", os.Getpid()}}
	window, err := parts.start()
	if err != nil {
		t.Fatal(err)
	}
	// The child spins for 300 ms of wall time, long enough for many ticks.
	child := exec.Command("sh", "-c", `end=$(( $(date +%s%N) + 300000000 )); while [ "$(date +%s%N)" -lt "$end" ]; do :; done`)
	if err := child.Run(); err != nil {
		t.Fatal(err)
	}
	used, err := window.stop()
	if err != nil {
		t.Fatal(err)
	}
	childCPU := child.ProcessState.UserTime() + child.ProcessState.SystemTime()
	if grown := used.parts["tree"]; grown < childCPU-20*time.Millisecond || grown <= 0 {
		t.Errorf("the tree grew by %v while a child used %v and exited, want at least the child's", grown, childCPU)
	}
}

func TestSampleRefusesAMissingProcess(t *testing.T) {
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	_, err := cpuParts{{"gone", gone.Process.Pid}}.sample()
	if err == nil || !strings.Contains(err.Error(), "gone") {
		t.Errorf("sample() of an exited process = %v, want an error naming it", err)
	}
}

func TestRecord(t *testing.T) {
	u := cpuUsage{parts: map[string]time.Duration{"proxy": 2 * time.Second, "postgres": time.Second, "redis": -time.Second}}
	figures := map[string]float64{}
	leftOut := u.record(500*time.Millisecond, 1000, figures)
	want := map[string]float64{"cpu_us.proxy": 2000, "cpu_us.postgres": 1000, "cpu_us.client": 500}
	if len(figures) != len(want) {
		t.Errorf("figures = %v, want %v", figures, want)
	}
	for k, v := range want {
		if figures[k] != v {
			t.Errorf("%s = %v, want %v", k, figures[k], v)
		}
	}
	if len(leftOut) != 1 || leftOut[0] != "redis" {
		t.Errorf("left out %v, want [redis] (its time went down)", leftOut)
	}
	empty := map[string]float64{}
	u.record(time.Second, 0, empty)
	if len(empty) != 0 {
		t.Errorf("record() with no units recorded %v, want nothing", empty)
	}
}

// A pid that another process has taken since the window opened gives an
// error, not a figure of some other process.
func TestStopRefusesAReusedPID(t *testing.T) {
	w := &cpuWindow{parts: cpuParts{{"tree", os.Getpid()}},
		before: cpuSample{used: map[string]time.Duration{"tree": 0}, started: map[string]uint64{"tree": 1}}}
	if _, err := w.stop(); err == nil || !strings.Contains(err.Error(), "another process") {
		t.Errorf("stop() after the pid changed hands = %v, want an error", err)
	}
}

func TestCPUTable(t *testing.T) {
	rs := records{
		"get_nginx_64":   {Figures: map[string]float64{"rps": 10000, "cpu_us.proxy": 30, "cpu_us.service": 70, "cpu_us.postgres": 80, "cpu_us.client": 20}},
		"get_gateway_64": {Figures: map[string]float64{"rps": 9000, "cpu_us.proxy": 50, "cpu_us.service": 70, "cpu_us.postgres": 80, "cpu_us.client": 20}},
		"get_nolimit_64": {Figures: map[string]float64{"rps": 9100}}, // no CPU figures: no line
		"sales":          {Figures: map[string]float64{"pairs_per_s": 2000, "cpu_us.proxy": 140, "cpu_us.service": 220, "cpu_us.postgres": 450, "cpu_us.redis": 2, "cpu_us.client": 70}},
		// 1,000 pages in 0.5 s: cores busy count pages a second, not items.
		"sync_gateway": {Figures: map[string]float64{"items": 100000, "pages": 1000, "seconds": 0.5, "items_per_s": 200000,
			"cpu_us.proxy": 200, "cpu_us.service": 400, "cpu_us.postgres": 300, "cpu_us.client": 100}},
	}
	var b bytes.Buffer
	renderCPUTable(&b, rs.cpuRows([]int{64}), 2)
	out := b.String()
	for _, want := range []string{
		"| scenario | proxy or gateway | service | PostgreSQL | Redis | load generator | total | cores busy |",
		"| GET by id, 64 conns, nginx | 30 | 70 | 80 | — | 20 | 200 | 2.00 of 2 |",
		"| GET by id, 64 conns, gateway | 50 | 70 | 80 | — | 20 | 220 | 1.98 of 2 |",
		"| confirm + cancel pair, via gateway | 140 | 220 | 450 | 2.0 | 70 | 882 | 1.76 of 2 |",
		"| full sync page, via gateway | 200 | 400 | 300 | — | 100 | 1000 | 2.00 of 2 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("CPU table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "rate limiting off") {
		t.Errorf("CPU table has a line for a scenario without CPU figures:\n%s", out)
	}
	b.Reset()
	renderCPUTable(&b, records{"get_nginx_64": {Figures: map[string]float64{"rps": 1}}}.cpuRows([]int{64}), 2)
	if b.Len() != 0 {
		t.Errorf("CPU table without CPU figures = %q, want nothing", b.String())
	}
}

// startAt opens the window once its time comes, gives the error of a
// window that cannot open, and none (and no window) when the run is
// interrupted before its time.
func TestCPUPartsStartAt(t *testing.T) {
	self := cpuParts{{name: "loadgen", pid: os.Getpid()}}
	window, err := self.startAt(context.Background(), time.Now())()
	if err != nil || window == nil {
		t.Errorf("startAt(now)() = %v, %v; want an open window", window, err)
	}
	gone := cpuParts{{name: "gone", pid: 1 << 30}} // above any pid_max
	if window, err := gone.startAt(context.Background(), time.Now())(); err == nil || window != nil {
		t.Errorf("startAt(now) of a part not running = %v, %v; want its error", window, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if window, err := self.startAt(ctx, time.Now().Add(time.Hour))(); err != nil || window != nil {
		t.Errorf("startAt(in an hour) after ctx ended = %v, %v; want nil, nil", window, err)
	}
}
