package stopsignal

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// helperDrainEnv, set, makes the test binary a stand-in for a server's
// main (runHelper): it drains for the duration the variable holds.
const helperDrainEnv = "STOPSIGNAL_HELPER_DRAIN"

func TestMain(m *testing.M) {
	if drain := os.Getenv(helperDrainEnv); drain != "" {
		os.Exit(runHelper(drain))
	}
	if name := os.Getenv(stubEnv); name != "" {
		os.Exit(runStub(name))
	}
	os.Exit(m.Run())
}

// runHelper is a main as every binary's: it serves until Context is done,
// then drains for drain and returns 0. Each step is a line on stdout, which
// the test waits for.
func runHelper(drain string) int {
	d, err := time.ParseDuration(drain)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := Context()
	defer stop()
	fmt.Println("serving")
	<-ctx.Done()
	fmt.Println("draining")
	time.Sleep(d)
	fmt.Println("stopped")
	return 0
}

// helper is the test binary started as runHelper: its stdout, line by
// line, and how it ended.
type helper struct {
	cmd   *exec.Cmd
	lines chan string // closed at the end of stdout
	done  chan error  // cmd.Wait's result
}

func startHelper(t *testing.T, drain time.Duration) *helper {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperDrainEnv+"="+drain.String())
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{cmd: cmd, lines: make(chan string, 16), done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
		close(h.lines)
		h.done <- cmd.Wait() // once stdout is read: Wait closes it
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		for range h.lines {
		}
	})
	h.waitFor(t, "serving")
	return h
}

// waitFor reads stdout up to line.
func (h *helper) waitFor(t *testing.T, line string) {
	t.Helper()
	for got := range h.lines {
		if got == line {
			return
		}
	}
	t.Fatalf("the helper's stdout ended before %q", line)
}

func (h *helper) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := h.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// wait returns how the helper ended, or fails the test if it is still
// running after within.
func (h *helper) wait(t *testing.T, within time.Duration) *os.ProcessState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	select {
	case err := <-h.done:
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatal(err)
		}
		return h.cmd.ProcessState
	case <-ctx.Done():
		t.Fatalf("the helper still runs %s after the signal", within)
		return nil
	}
}

// A second SIGINT or SIGTERM during the drain ends the process at once,
// killed by that signal: Ctrl-C twice, or a supervisor sending TERM again,
// does not wait out the drain.
func TestSecondSignalEndsTheProcessAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name          string
		first, second syscall.Signal
	}{
		{"TERM twice", syscall.SIGTERM, syscall.SIGTERM},
		{"Ctrl-C twice", syscall.SIGINT, syscall.SIGINT},
		{"Ctrl-C, then TERM from a supervisor", syscall.SIGINT, syscall.SIGTERM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startHelper(t, time.Minute)
			h.signal(t, tc.first)
			h.waitFor(t, "draining")
			h.signal(t, tc.second)
			state := h.wait(t, 5*time.Second)
			status, ok := state.Sys().(syscall.WaitStatus)
			if !ok || !status.Signaled() || status.Signal() != tc.second {
				t.Errorf("helper after %s during its drain ended with %s, want killed by %s", tc.second, state, tc.second)
			}
		})
	}
}

// One signal alone stops the process gracefully: its drain runs to the end
// and main returns.
func TestOneSignalDrains(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			h := startHelper(t, 200*time.Millisecond)
			h.signal(t, sig)
			h.waitFor(t, "draining")
			h.waitFor(t, "stopped")
			if state := h.wait(t, 5*time.Second); state.ExitCode() != 0 {
				t.Errorf("helper after one %s ended with %s, want exit status 0 after its drain", sig, state)
			}
		})
	}
}

// stop, called with no signal received (main returning on its own), ends
// the context.
func TestStopEndsTheContext(t *testing.T) {
	ctx, stop := Context()
	stop()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the context is not done after stop")
	}
}

// Every binary's main takes its stop signal from Context: a main that
// registered its own handler would swallow the second signal again. One
// that ignores the stop signals, ending when its input does (logcap, make
// run's log writer), registers none.
func TestEveryMainUsesContext(t *testing.T) {
	mains := mainFiles(t, "../..")
	if len(mains) < 8 {
		t.Fatalf("found the mains %v, want the 8 binaries' at least", mains)
	}
	for _, path := range mains {
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		ignores := strings.Contains(string(src), "signal.Ignore(syscall.SIGINT, syscall.SIGTERM")
		if !strings.Contains(string(src), "stopsignal.Context()") && !ignores || strings.Contains(string(src), "signal.Notify") {
			t.Errorf("%s does not take its stop signal from stopsignal.Context", path)
		}
	}
}

// mainFiles returns the Go files under root that hold a func main, outside
// the folders make run and make bench fill (.run).
func mainFiles(t *testing.T, root string) []string {
	t.Helper()
	var mains []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != root || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err == nil && strings.Contains(string(src), "\nfunc main() {") {
			mains = append(mains, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return mains
}
