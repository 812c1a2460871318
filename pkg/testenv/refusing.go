package testenv

import (
	"net"
	"os"
	"strconv"
	"syscall"
	"testing"
)

// RefusingAddr returns a loopback address (host:port) that refuses every
// connection until the test ends: an instance that is down. Its port is
// held by a socket bound to it that never listens, so no other socket can
// take it meanwhile. A port from FreeAddr is free for any process to take
// until a server listens on it (when it came from the ephemeral range, the
// next listen on ":0" of a test binary beside this one took it about once
// in 14,000), and a test then found the instance it wanted down answering.
func RefusingAddr(t testing.TB) string {
	t.Helper()
	addr, _ := RefusingUntilListen(t)
	return addr
}

// RefusingUntilListen returns an address that refuses connections, as
// RefusingAddr's does, and a function that starts listening on it: an
// instance that is down, then comes back on its address. The listener is
// the socket that held the port, so no other process can take the port
// in between (re-listening on a FreeAddr port failed, now and then, with
// "address already in use"). listen may be called once.
func RefusingUntilListen(t testing.TB) (addr string, listen func() net.Listener) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatalf("testenv: socket: %v", err)
	}
	syscall.CloseOnExec(fd)
	handedOver := false
	t.Cleanup(func() {
		if !handedOver {
			syscall.Close(fd)
		}
	})
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
	addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	listen = func() net.Listener {
		t.Helper()
		if handedOver {
			t.Fatalf("testenv: %s is listening already", addr)
		}
		if err := syscall.Listen(fd, syscall.SOMAXCONN); err != nil {
			t.Fatalf("testenv: listen on %s: %v", addr, err)
		}
		// The file owns fd from here; net.FileListener takes a copy of it.
		handedOver = true
		f := os.NewFile(uintptr(fd), addr)
		defer f.Close()
		l, err := net.FileListener(f)
		if err != nil {
			t.Fatalf("testenv: listener on %s: %v", addr, err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}
	return addr, listen
}
