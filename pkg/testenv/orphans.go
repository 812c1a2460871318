package testenv

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// DiesWithTest has cmd's process killed when the test binary that starts
// it ends (Pdeathsig), also one killed before its cleanups ran (go test's
// -timeout, a Ctrl-C): a server a test started served on, orphaned,
// listening on its port and holding its database connections. Call it
// before cmd.Start, after any SysProcAttr of the caller's own.
//
// The kernel sends the signal when the thread that started cmd ends, not
// the process (golang/go#27505): the Go runtime ends a thread only when a
// goroutine locked to it (runtime.LockOSThread) returns without
// unlocking, which no test here does; one that did could see a process
// it started killed mid-test.
func DiesWithTest(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}

// StartHelper runs this test binary again, its test named test alone, with
// env ("NAME=value") added (what tells the test it is the helper), and
// waits until the helper's stdout has said ready: a test that starts
// processes and is then killed (SurvivorsOfKill).
func StartHelper(t testing.TB, test, ready string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	if out, ok := readUpTo(stdout, ready); !ok {
		t.Fatalf("testenv: the helper ended before it said %q:\n%s", ready, out)
	}
	return cmd
}

// readUpTo reads r up to line, and returns what came before it.
func readUpTo(r io.Reader, line string) (string, bool) {
	var before strings.Builder
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if sc.Text() == line {
			return before.String(), true
		}
		before.WriteString(sc.Text() + "\n")
	}
	return before.String(), false
}

// SurvivorsOfKill kills helper (a test binary whose processes a test
// checks), as go test's -timeout ends one, and returns the processes
// started below it that still run 10 s later ("pid command line"), after
// killing them and their process groups, so that a failing test leaves
// none.
func SurvivorsOfKill(helper *exec.Cmd) []string {
	return survivorsOfKill(helper, processesBelow(helper.Process.Pid))
}

// SurvivorsOfKillIn is SurvivorsOfKill that also counts the processes
// working in a folder under dir (the helper's TMPDIR): a daemon the
// helper's children started (pg_ctl's postmaster) is no longer below it,
// and a PostgreSQL server's processes all work in its data folder.
func SurvivorsOfKillIn(helper *exec.Cmd, dir string) []string {
	return survivorsOfKill(helper, append(processesBelow(helper.Process.Pid), processesWorkingIn(dir)...))
}

// survivorsOfKill kills helper and returns those of below still running
// 10 s later, killing them too.
func survivorsOfKill(helper *exec.Cmd, below []int) []string {
	_ = helper.Process.Kill()
	_ = helper.Wait()
	var left []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		left = left[:0]
		for _, pid := range below {
			if command := runningCommand(pid); command != "" {
				left = append(left, fmt.Sprintf("%d %s", pid, command))
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(left) > 0 {
		for _, pid := range below { // a group's leader (nginx's master) would respawn what is killed alone
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return left
}

// processesBelow lists the processes below pid (its children, theirs,
// ...), read from /proc.
func processesBelow(pid int) []int {
	parents := map[int]int{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, stat := range stats {
		fields := statFields(stat)
		child, _ := strconv.Atoi(filepath.Base(filepath.Dir(stat)))
		if len(fields) > 1 {
			parents[child], _ = strconv.Atoi(fields[1])
		}
	}
	var below []int
	for child := range parents {
		for p := parents[child]; p > 1; p = parents[p] {
			if p == pid {
				below = append(below, child)
				break
			}
		}
	}
	return below
}

// processesWorkingIn lists the processes whose working folder is dir or
// under it, read from /proc (this user's, or every one as root).
func processesWorkingIn(dir string) []int {
	var in []int
	cwds, _ := filepath.Glob("/proc/[0-9]*/cwd")
	for _, cwd := range cwds {
		folder, err := os.Readlink(cwd)
		if err != nil || (folder != dir && !strings.HasPrefix(folder, dir+"/")) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(cwd)))
		in = append(in, pid)
	}
	return in
}

// runningCommand is the command line of pid, or "" once it has ended (a
// zombie has).
func runningCommand(pid int) string {
	fields := statFields(fmt.Sprintf("/proc/%d/stat", pid))
	if len(fields) == 0 || fields[0] == "Z" {
		return ""
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))
}

// statFields are the fields of a /proc/PID/stat after the command's name
// (state, ppid, ...), none when it cannot be read (the process ended).
func statFields(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	// "pid (comm) state ppid ...": comm may hold spaces and parentheses.
	return strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
}
