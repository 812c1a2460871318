package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// postmaster is a PostgreSQL server the harness runs as its own child,
// not as pg_ctl's daemon: killed with the test binary, also one killed
// before its cleanups ran (go test's -timeout, a Ctrl-C), where pg_ctl's
// postmaster ran on with its backends, memory and data folder
// (TestPostgreSQLDiesWithItsTest).
type postmaster struct {
	cmd    *exec.Cmd
	exited <-chan struct{} // closed once the process has ended and been reaped
}

// startPostmaster runs bin's postgres on the cluster in data as asUser
// ("" for the current one), under command (its words before postgres's:
// prlimit and its limits, which the server inherits), with args after
// "-D data", appending what it writes to logPath, and returns once it
// accepts connections, as pg_ctl -w start did.
//
// The user is the process's from its start (Credential), not switched to
// by runuser: the kernel clears the parent-death signal of a process that
// changes its user, and Go's fork sets the user before the signal
// (syscall's forkAndExecInChild). The signal is SIGQUIT, PostgreSQL's
// immediate shutdown: the postmaster ends its backends before it exits
// (SIGKILL would leave them to find it gone on their own). Its own
// process group keeps a terminal's Ctrl-C from reaching it before the
// test binary's cleanups, as pg_ctl's setsid did.
func startPostmaster(bin, asUser, data, logPath string, command []string, args ...string) (*postmaster, error) {
	argv := append(slices.Clone(command), filepath.Join(bin, "postgres"), "-D", data)
	cmd := exec.Command(argv[0], append(argv[1:], args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if asUser != "" {
		cred, err := credentialOf(asUser)
		if err != nil {
			return nil, err
		}
		cmd.SysProcAttr.Credential = cred
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGQUIT
	log, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer log.Close() // the server has its own copy once started
	cmd.Stdout, cmd.Stderr = log, log
	exited, err := startOnOwnThread(cmd)
	if err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	pm := &postmaster{cmd: cmd, exited: exited}
	if err := pm.awaitReady(data); err != nil {
		pm.stop()
		out, _ := os.ReadFile(logPath)
		return nil, fmt.Errorf("%w; its log (%s):\n%s", err, logPath, out)
	}
	return pm, nil
}

// startOnOwnThread starts cmd from a goroutine locked to its thread until
// cmd has ended and been reaped, and returns a channel closed then. The
// kernel sends the parent-death signal when the thread that forked the
// child ends, not the process (golang/go#27505), and the Go runtime ends a
// thread when a goroutine locked to it returns without unlocking: forked
// from whichever thread its caller ran on, a cluster shared by the whole
// run was stopped mid-run, under every test after, once any goroutine (a
// test's, a library's) had locked that thread and returned locked
// (TestPostmasterOutlivesTheThreadOfItsStarter). One thread a server.
func startOnOwnThread(cmd *exec.Cmd) (<-chan struct{}, error) {
	started := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread() // the child is gone: the thread may serve others
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
		close(exited)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return exited, nil
}

// startTimeout is how long startPostmaster waits for the server to accept
// connections: pg_ctl's -w default.
const startTimeout = 60 * time.Second

// awaitReady waits until the server's postmaster.pid, in data, names its
// process and says it accepts connections ("ready", or "standby" for a
// standby that accepts none), as pg_ctl -w does.
func (pm *postmaster) awaitReady(data string) error {
	pid := strconv.Itoa(pm.cmd.Process.Pid)
	deadline := time.Now().Add(startTimeout)
	for {
		lines := strings.Split(readPidFile(data), "\n")
		if len(lines) > 7 && lines[0] == pid && slices.Contains([]string{"ready", "standby"}, strings.TrimSpace(lines[7])) {
			return nil
		}
		select {
		case <-pm.exited:
			return fmt.Errorf("postgres exited at its start: %v", pm.cmd.ProcessState)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres did not accept connections within %v", startTimeout)
		}
	}
}

// readPidFile is the content of data's postmaster.pid, "" while there is
// none (the server has not written it yet).
func readPidFile(data string) string {
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return ""
	}
	return string(b)
}

// stop stops the server at once (immediate shutdown, as pg_ctl -m
// immediate stop did) and waits until it has ended; a server already
// stopped (pg_ctl stop, by a test) is left as it is. One that has not
// ended within startTimeout is killed.
func (pm *postmaster) stop() {
	if err := pm.cmd.Process.Signal(syscall.SIGQUIT); err != nil && !errors.Is(err, os.ErrProcessDone) {
		_ = pm.cmd.Process.Kill()
	}
	select {
	case <-pm.exited:
	case <-time.After(startTimeout):
		_ = pm.cmd.Process.Kill()
		<-pm.exited
	}
}
