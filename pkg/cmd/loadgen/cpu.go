package main

import (
	"context"
	"fmt"
	"slices"
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
	if slices.ContainsFunc(*p, func(part cpuPart) bool { return part.name == name }) {
		return fmt.Errorf("%q given twice", name)
	}
	*p = append(*p, cpuPart{name, pid})
	return nil
}

// clientPart is the load generator's share: wrk for get, this process for
// sales.
const clientPart = "client"

// cpuSample is the CPU time each part had used at one moment, and when
// each part's root process started (to tell a reused pid).
type cpuSample struct {
	used    map[string]time.Duration
	started map[string]uint64
}

// sample reads the CPU time of every part's process tree: each process's
// own time and that of its children that have exited and been waited for,
// which the kernel adds to the parent (cutime, cstime). So a PostgreSQL
// backend or an nginx worker that exits between two samples keeps its time
// in the tree instead of taking it away. (A child reaped between the reads
// of its parent and of itself is missed by that one sample; a delta that
// comes out negative is left out, see cpuUsage.record.)
func (p cpuParts) sample() (cpuSample, error) {
	out := cpuSample{used: map[string]time.Duration{}, started: map[string]uint64{}}
	if len(p) == 0 {
		return out, nil
	}
	procs, err := procfs.AllProcs()
	if err != nil {
		return out, fmt.Errorf("cpu: list processes: %w", err)
	}
	used := map[int]time.Duration{}
	started := map[int]uint64{}
	children := map[int][]int{}
	for _, proc := range procs {
		st, err := proc.Stat()
		if err != nil {
			continue // exited while listed
		}
		used[st.PID] = ticks(int64(st.UTime) + int64(st.STime) + int64(st.CUTime) + int64(st.CSTime))
		started[st.PID] = st.Starttime
		children[st.PPID] = append(children[st.PPID], st.PID)
	}
	for _, part := range p {
		if _, alive := used[part.pid]; !alive {
			return out, fmt.Errorf("cpu: %s (pid %d) is not running", part.name, part.pid)
		}
		out.used[part.name] = treeTime(part.pid, used, children)
		out.started[part.name] = started[part.pid]
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

// cpuWindow is an open measurement: the parts' CPU time and this process's
// at its start.
type cpuWindow struct {
	parts  cpuParts
	before cpuSample
	self   time.Duration
}

// start opens a window.
func (p cpuParts) start() (*cpuWindow, error) {
	before, err := p.sample()
	if err != nil {
		return nil, err
	}
	self, err := selfCPU()
	if err != nil {
		return nil, err
	}
	return &cpuWindow{parts: p, before: before, self: self}, nil
}

// startAt opens the parts' CPU window at the time at, from a goroutine of
// its own: the caller is waiting on workers, which cross that time while
// they run. opened waits for it and gives the window, or nil and no error
// if ctx ended before at.
func (p cpuParts) startAt(ctx context.Context, at time.Time) (opened func() (*cpuWindow, error)) {
	var (
		window *cpuWindow
		err    error
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-time.After(time.Until(at)):
			window, err = p.start()
		case <-ctx.Done():
		}
	}()
	return func() (*cpuWindow, error) {
		<-done
		return window, err
	}
}

// cpuUsage is the CPU time used within a window, by part and by this
// process.
type cpuUsage struct {
	parts map[string]time.Duration
	self  time.Duration
}

// stop closes the window.
func (w *cpuWindow) stop() (cpuUsage, error) {
	after, err := w.parts.sample()
	if err != nil {
		return cpuUsage{}, err
	}
	self, err := selfCPU()
	if err != nil {
		return cpuUsage{}, err
	}
	u := cpuUsage{parts: map[string]time.Duration{}, self: self - w.self}
	for name, end := range after.used {
		if after.started[name] != w.before.started[name] {
			return cpuUsage{}, fmt.Errorf("cpu: %s's pid belongs to another process than at the start", name)
		}
		u.parts[name] = end - w.before.used[name]
	}
	return u, nil
}

// record adds figures of microseconds per unit of work (request or pair)
// for every part and for the client, whose time the scenario knows (wrk's,
// or this process's: u.self). Nothing is recorded without units. A part
// whose time went down (a process left its tree without being waited for)
// has no true figure: it is left out and named in the returned list.
func (u cpuUsage) record(client time.Duration, units float64, figures map[string]float64) (leftOut []string) {
	if units <= 0 {
		return nil
	}
	for name, d := range u.parts {
		if d < 0 {
			leftOut = append(leftOut, name)
			continue
		}
		figures[cpuFigurePrefix+name] = float64(d) / float64(time.Microsecond) / units
	}
	if client > 0 && len(u.parts) > 0 { // without parts there is no CPU table to fill
		figures[cpuFigurePrefix+clientPart] = float64(client) / float64(time.Microsecond) / units
	}
	slices.Sort(leftOut)
	return leftOut
}

// leftOutNote is a record's note for parts record left out.
func leftOutNote(leftOut []string) string {
	return "no CPU figure for " + strings.Join(leftOut, ", ") + ": a process left the tree during the round"
}

// selfCPU is the CPU time this process has used.
func selfCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("cpu: getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
