package testenv

import (
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// UnacceptingAddr returns a loopback address (host:port) where a connection
// is never made until the test ends: a dial there times out, as it does to
// a host that is gone or behind a network that drops packets, where
// RefusingAddr's is refused at once. Its socket listens with an accept
// queue of one, filled here and never accepted from, so Linux drops each
// later SYN (a full queue drops it, SYN cookies or not) and the dialer
// waits out its timeout.
func UnacceptingAddr(t testing.TB) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatalf("testenv: socket: %v", err)
	}
	syscall.CloseOnExec(fd)
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("testenv: bind: %v", err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatalf("testenv: listen: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatalf("testenv: getsockname: %v", err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
	// Connections the kernel completes for the queue, until it takes no
	// more: the first dial that times out.
	for range 16 {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return addr
		}
		if err != nil {
			t.Fatalf("testenv: dial %s: %v", addr, err)
		}
		t.Cleanup(func() { c.Close() })
	}
	t.Fatalf("testenv: %s accepted 16 connections into a queue of one", addr)
	return ""
}
