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

// proxiesHelperEnv makes the test binary, started by
// TestProxiesDieWithTheirTest, start nginx and haproxy and wait to be
// killed.
const proxiesHelperEnv = "TESTENV_PROXIES_HELPER"

// A test binary killed before its cleanups run (go test's -timeout, a
// Ctrl-C) takes its nginx and haproxy with it. They served on, listening,
// in a process group of their own that no terminal's SIGINT reaches,
// nginx's worker orphaned by its master.
func TestProxiesDieWithTheirTest(t *testing.T) {
	if os.Getenv(proxiesHelperEnv) == "1" {
		startProxiesAndWait(t)
		return
	}
	NeedIngress(t)
	// The helper's folders, which its cleanups do not remove, are in one
	// of this test's, which the proxies' user must be able to pass through.
	tmp, err := os.MkdirTemp("", "testenv-proxies-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	if err := os.Chmod(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestProxiesDieWithTheirTest$")
	cmd.Env = append(os.Environ(), proxiesHelperEnv+"=1", "TMPDIR="+tmp)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if out, ok := readUpTo(stdout, "proxies listening"); !ok {
		t.Fatalf("the helper ended before its proxies listened:\n%s", out)
	}
	proxies := descendants(cmd.Process.Pid)
	if len(proxies) < 2 {
		t.Fatalf("the helper's processes: %v, want nginx and haproxy", proxies)
	}
	_ = cmd.Process.Kill() // as go test's -timeout ends a test binary: no cleanup runs
	_ = cmd.Wait()
	var left []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		left = left[:0]
		for _, pid := range proxies {
			if name := liveProcess(pid); name != "" {
				left = append(left, fmt.Sprintf("%d %s", pid, name))
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(left) > 0 {
		for _, pid := range proxies { // each started its own group: a master's kill takes what it respawned
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		t.Errorf("10 s after their test binary was killed, its proxies still run: %v", left)
	}
}

// startProxiesAndWait is the helper: nginx and haproxy started as the
// ingress test starts them, then nothing until the helper is killed.
func startProxiesAndWait(t *testing.T) {
	nginx, haproxy := FreeAddr(t), FreeAddr(t)
	Nginx(t, nginx, "server { listen "+nginx+"; location / { return 204; } }")
	HAProxy(t, haproxy, "defaults\n  mode http\n  timeout connect 1s\n  timeout client 1s\n  timeout server 1s\n"+
		"frontend f\n  bind "+haproxy+"\n  http-request return status 204\n")
	fmt.Println("proxies listening")
	select {}
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

// descendants lists the processes below pid (its children, theirs, ...),
// read from /proc.
func descendants(pid int) []int {
	parents := map[int]int{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, stat := range stats {
		b, err := os.ReadFile(stat)
		if err != nil {
			continue // ended meanwhile
		}
		// "pid (comm) state ppid ...": comm may hold spaces and parentheses.
		fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
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

// liveProcess is the command line of pid, or "" once it has ended (a
// zombie has ended).
func liveProcess(pid int) string {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	if fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:])); len(fields) > 0 && fields[0] == "Z" {
		return ""
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))
}
