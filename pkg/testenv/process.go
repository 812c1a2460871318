package testenv

import (
	"bytes"
	"net"
	"sync"
	"testing"
)

// FreeAddr returns a loopback address with a port free at the time of the
// call, for a server the test starts itself (a binary's run, a process).
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// Output collects what a server under test writes (its logs) while the
// test reads it: writes and reads may come from different goroutines.
type Output struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(p)
}

// String returns everything written so far.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}
