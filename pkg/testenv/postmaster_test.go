package testenv

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// postmasterHelperEnv tells this test binary, run again by
// TestPostgreSQLDiesWithItsTest, to start the harness's clusters and wait
// to be killed.
const postmasterHelperEnv = "TESTENV_POSTMASTER_HELPER"

// A test binary killed before its cleanups run (go test's -timeout, a
// Ctrl-C) takes the PostgreSQL servers the harness started with it: the
// shared cluster (TEST_DATABASE_URL unset) and a test's own (start, and
// startUnder's prlimit) ran on as pg_ctl daemons, with their backends,
// memory and data folders.
func TestPostgreSQLDiesWithItsTest(t *testing.T) {
	if os.Getenv(postmasterHelperEnv) == "1" {
		Postgres(t)         // the shared cluster, with a backend of the pool's
		ShortOfResources(t) // a test's own, under prlimit
		fmt.Println("postgres ready")
		select {}
	}
	tmp := helperTempDir(t)
	cmd := StartHelper(t, "TestPostgreSQLDiesWithItsTest", "postgres ready", postmasterHelperEnv+"=1", "TMPDIR="+tmp, "TEST_DATABASE_URL=")
	if left := SurvivorsOfKillIn(cmd, tmp); len(left) > 0 {
		t.Errorf("10 s after its test binary was killed, its PostgreSQL servers still run: %v", left)
	}
}

// A postmaster runs on when the thread its starter ran on ends (a
// goroutine locked to it with runtime.LockOSThread returning locked: a
// test's, a library's): the kernel sends the parent-death signal when the
// thread that forked the child ends, not the process, so a cluster shared
// by the run, forked from whichever thread its first test ran on, was
// stopped mid-run with that thread.
func TestPostmasterOutlivesTheThreadOfItsStarter(t *testing.T) {
	c := ownClusters(t, "testenv-thread-")
	c.initdb(t, "main")
	var pm *postmaster
	var err error
	release := make(chan struct{})
	tid := onThreadThatEnds(release, func() { pm, err = c.launch("main", nil) })
	if err != nil {
		close(release)
		t.Fatal(err)
	}
	t.Cleanup(pm.stop)
	// Stopped, the server leaves a signal sent to it pending, where /proc
	// shows it, instead of acting on it at some moment of its own.
	pid := pm.cmd.Process.Pid
	if err := pm.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pm.cmd.Process.Signal(syscall.SIGCONT) })
	if !waitFor(time.Minute, func() bool { return processState(pid) == "T" }) {
		t.Fatalf("postgres (%d) did not stop: state %q", pid, processState(pid))
	}
	close(release)
	task := fmt.Sprintf("/proc/self/task/%d", tid)
	if !waitFor(time.Minute, func() bool { _, err := os.Stat(task); return errors.Is(err, fs.ErrNotExist) }) {
		t.Fatalf("the starter's thread %d did not end", tid)
	}
	if pendingSignals(t, pid)&(1<<(syscall.SIGQUIT-1)) != 0 {
		t.Error("postgres was sent its parent-death signal (SIGQUIT) when the thread of the goroutine that started it ended")
	}
}

// onThreadThatEnds runs start in a goroutine locked to its thread, which
// ends once release is closed (the goroutine returns locked), and returns
// the thread's id. The process's main thread, which the Go runtime never
// ends, is not used.
func onThreadThatEnds(release <-chan struct{}, start func()) (tid int) {
	tids := make(chan int)
	var run func()
	run = func() {
		runtime.LockOSThread()
		if syscall.Gettid() == syscall.Getpid() {
			go run() // on another thread: this one is held until release
			<-release
			runtime.UnlockOSThread()
			return
		}
		start()
		tids <- syscall.Gettid()
		<-release
	}
	go run()
	return <-tids
}

// processState is the state letter of pid (/proc/pid/stat: "T" stopped),
// "" once it has been reaped.
func processState(pid int) string {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	_, after, _ := strings.Cut(string(stat), ") ")
	state, _, _ := strings.Cut(after, " ")
	return state
}

// pendingSignals is the set of signals pending for pid, to its thread or
// to the whole process (/proc/pid/status: SigPnd, ShdPnd), bit n-1 for
// signal n.
func pendingSignals(t *testing.T, pid int) uint64 {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	var pending uint64
	for _, line := range strings.Split(string(status), "\n") {
		name, value, _ := strings.Cut(line, ":")
		if name == "SigPnd" || name == "ShdPnd" {
			mask, err := strconv.ParseUint(strings.TrimSpace(value), 16, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			pending |= mask
		}
	}
	return pending
}
