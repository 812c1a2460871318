package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ExhaustDescriptors leaves the test process no file descriptor to open,
// until the test ends: it lowers the process's limit to two above its
// highest open descriptor and takes every free number below it (the limit
// bounds descriptor numbers, and a closed one leaves a hole that the next
// open takes). It returns what it took, one at least: closing one gives a
// descriptor back, and so does any other descriptor of the process closed
// meanwhile (an earlier test's connection ending): a test that must have
// none at all uses NoDescriptors. The limit is the whole process's, so no
// other test may run meanwhile (none of a package that calls this may be
// parallel).
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

// AnsweredAfterADescriptorShortage checks what every listener of the stack
// must do out of file descriptors: it runs the test process out of them
// (ExhaustDescriptors), connects to addr with the one left, waits for logs
// to say that accepting failed (acceptretry's line), frees the
// descriptors, and fails the test unless a GET of path on the connection
// that waited is then answered.
func AnsweredAfterADescriptorShortage(t testing.TB, addr, path string, logs *Output) {
	t.Helper()
	held := ExhaustDescriptors(t)
	held[0].Close() // the client's side of the connection
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), "accept failed"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no line said that accepting failed within 10 s; the log:\n%s", logs.String())
		}
	}
	for _, f := range held[1:] {
		f.Close()
	}
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, addr); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer on the connection that waited: %v", err)
	}
	resp.Body.Close()
}

// WaitListening waits until addr accepts connections, and returns once
// the server has closed the connection it tried with: the client ends its
// side, sending nothing, and waits for the server's end. Dialled and
// closed at once, the server's end was closed a moment later, in whatever
// the test did next: out of descriptors (ExhaustDescriptors), a
// descriptor given back behind the test's back, which the server's next
// accept got (seen in the gateway's tests with an upstream's end).
func WaitListening(t testing.TB, addr string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !closedByTheServer(addr); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("testenv: %s did not accept a connection and close it within 5 s", addr)
		}
	}
}

// closedByTheServer dials addr, ends its side, and reports whether the
// server then closed its end (read as the end of the stream).
func closedByTheServer(addr string) bool {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return false
	}
	defer conn.Close()
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		return false
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = io.Copy(io.Discard, conn)
	return err == nil
}

// NoDescriptors leaves the test process no file descriptor to open until
// restore is called or the test ends, whatever is closed meanwhile: it
// lowers the process's limit to zero, below every descriptor number, so
// opening one fails with EMFILE as at any limit. Under ExhaustDescriptors'
// limit, a descriptor that something else in the process closes (a
// listener a garbage collection closed) is free for the next open, and a
// test expecting none had a connection made. The limit is the whole
// process's, so no other test may run meanwhile.
func NoDescriptors(t testing.TB) (restore func()) {
	t.Helper()
	var was syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &was); err != nil {
		t.Fatal(err)
	}
	restore = func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &was); err != nil {
			t.Errorf("testenv: restoring the descriptor limit: %v", err)
		}
	}
	t.Cleanup(restore)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: 0, Max: was.Max}); err != nil {
		t.Fatal(err)
	}
	return restore
}
