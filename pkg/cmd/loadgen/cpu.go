package main

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
)

// What bounds a throughput figure on a machine whose cores are shared by
// the load generator, the proxy, the service and PostgreSQL is how much CPU
// each of them spends per request. The get and sales scenarios measure it
// over the same window as their figure, from the kernel's accounting in
// /proc, and record it as the figures cpu_us.<part>.

// cpuFigurePrefix starts the figures of CPU time per request (or per pair).
const cpuFigurePrefix = "cpu_us."

// cpuParts are the parts of the stack a scenario accounts, by name: each a
// process tree (the process and its descendants), so nginx's workers count
// under its master and PostgreSQL's backends under the postmaster. The
// client part is the load generator, measured by the scenario itself.
type cpuParts []cpuPart

type cpuPart struct {
	name string
	pid  int
}

// String and Set make cpuParts a repeatable flag: --cpu name=pid.
func (p *cpuParts) String() string {
	var s []string
	for _, part := range *p {
		s = append(s, part.name+"="+strconv.Itoa(part.pid))
	}
	return strings.Join(s, ",")
}

func (p *cpuParts) Set(v string) error {
	name, pidText, ok := strings.Cut(v, "=")
	pid, err := strconv.Atoi(pidText)
	if !ok || name == "" || err != nil || pid <= 0 {
		return fmt.Errorf("want name=pid, got %q", v)
	}
	if name == clientPart {
		return fmt.Errorf("%q is measured by the scenario itself", clientPart)
	}
	*p = append(*p, cpuPart{name, pid})
	return nil
}

// clientPart is the load generator's share: wrk for get, this process for
// sales.
const clientPart = "client"

// cpuSample is the CPU time each part had used at one moment.
type cpuSample map[string]time.Duration

// sample reads the CPU time of every part's process tree: each process's
// own time and that of its children that have exited and been waited for,
// which the kernel adds to the parent (cutime, cstime). So a PostgreSQL
// backend or an nginx worker that exits between two samples keeps its time
// in the tree instead of taking it away.
func (p cpuParts) sample() (cpuSample, error) {
	if len(p) == 0 {
		return cpuSample{}, nil
	}
	procs, err := procfs.AllProcs()
	if err != nil {
		return nil, fmt.Errorf("cpu: list processes: %w", err)
	}
	used := map[int]time.Duration{}
	children := map[int][]int{}
	for _, proc := range procs {
		st, err := proc.Stat()
		if err != nil {
			continue // exited while listed
		}
		used[st.PID] = ticks(int64(st.UTime) + int64(st.STime) + int64(st.CUTime) + int64(st.CSTime))
		children[st.PPID] = append(children[st.PPID], st.PID)
	}
	out := cpuSample{}
	for _, part := range p {
		if _, alive := used[part.pid]; !alive {
			return nil, fmt.Errorf("cpu: %s (pid %d) is not running", part.name, part.pid)
		}
		out[part.name] = treeTime(part.pid, used, children)
	}
	return out, nil
}

// userHZ is the unit of the times in /proc/PID/stat (USER_HZ), 100 on
// every Linux architecture Go runs on; procfs assumes the same.
const userHZ = 100

func ticks(n int64) time.Duration { return time.Duration(n) * time.Second / userHZ }

// treeTime sums the CPU time of pid and its descendants.
func treeTime(pid int, used map[int]time.Duration, children map[int][]int) time.Duration {
	total := used[pid]
	for _, child := range children[pid] {
		total += treeTime(child, used, children)
	}
	return total
}

// perUnit turns the CPU used between two samples into figures of
// microseconds per unit of work (request or pair), with the client's time
// added. Nothing is recorded without units: a run that did no work has no
// cost per unit.
func perUnit(before, after cpuSample, client time.Duration, units float64, figures map[string]float64) {
	if units <= 0 {
		return
	}
	for name, end := range after {
		figures[cpuFigurePrefix+name] = float64(end-before[name]) / float64(time.Microsecond) / units
	}
	if client > 0 {
		figures[cpuFigurePrefix+clientPart] = float64(client) / float64(time.Microsecond) / units
	}
}

// selfCPU is the CPU time this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuColumns are the parts make bench accounts, in the table's order.
var cpuColumns = []string{"proxy", "service", "postgres", "redis", clientPart}
