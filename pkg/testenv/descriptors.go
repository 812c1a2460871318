package testenv

import (
	"errors"
	"os"
	"strconv"
	"syscall"
	"testing"
)

// ExhaustDescriptors leaves the test process no file descriptor to open,
// until the test ends: it lowers the process's limit to two above its
// highest open descriptor and takes every free number below it (the limit
// bounds descriptor numbers, and a closed one leaves a hole that the next
// open takes). It returns what it took, one at least: closing one gives a
// descriptor back. The limit is the whole process's, so no other test may
// run meanwhile (none of a package that calls this may be parallel).
func ExhaustDescriptors(t testing.TB) []*os.File {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("testenv: no /proc/self/fd to find the open descriptors: %v", err)
	}
	var highest uint64
	for _, fd := range fds {
		n, err := strconv.ParseUint(fd.Name(), 10, 64)
		if err != nil {
			t.Fatalf("testenv: /proc/self/fd/%s: %v", fd.Name(), err)
		}
		highest = max(highest, n)
	}
	var was syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &was); err != nil {
		t.Fatal(err)
	}
	var held []*os.File
	t.Cleanup(func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &was); err != nil {
			t.Errorf("testenv: restoring the descriptor limit: %v", err)
		}
		for _, f := range held {
			f.Close()
		}
	})
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: highest + 2, Max: was.Max}); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := os.Open(os.DevNull)
		if errors.Is(err, syscall.EMFILE) {
			return held
		}
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, f)
	}
}
