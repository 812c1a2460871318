package testenv

import (
	"net"
	"strconv"
	"syscall"
	"testing"
)

// RefusingAddr returns a loopback address (host:port) that refuses every
// connection until the test ends: an instance that is down. Its port is
// held by a socket bound to it that never listens, so no other socket can
// take it meanwhile. An address from FreeAddr, closed at once, could be
// handed to the next listen on ":0" of any process on the machine (a test
// binary of another package running beside this one): about 1 in 14,000
// each, and a test then found the instance it wanted down answering.
func RefusingAddr(t testing.TB) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatalf("testenv: socket: %v", err)
	}
	syscall.CloseOnExec(fd)
	t.Cleanup(func() { syscall.Close(fd) })
	// No SO_REUSEADDR (Go's listeners set it): a bind to this port, or one
	// to ":0" that the kernel would answer with it, conflicts with this
	// socket as long as it is open.
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("testenv: bind: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatalf("testenv: getsockname: %v", err)
	}
	port := sa.(*syscall.SockaddrInet4).Port
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}
