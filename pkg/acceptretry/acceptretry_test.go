package acceptretry

import (
	"errors"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/testenv"
)

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
	}
}

// At its descriptor limit a listener waits, and accepts the connections
// that waited in the backlog once descriptors are free again; closed during
// a wait, it says so at once.
func TestAcceptWaitsOutADescriptorShortage(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var retries atomic.Int64
	l := New(ln, func(err error, wait time.Duration) {
		if !Shortage(err) || wait <= 0 {
			t.Errorf("onRetry(%v, %v), want a shortage and a wait", err, wait)
		}
		retries.Add(1)
	})
	var clients []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	// The three wait in the backlog: accepting one needs a descriptor, and
	// the process has none left.
	held := testenv.ExhaustDescriptors(t)
	accepted := make(chan net.Conn, 8)
	failed := make(chan error, 1)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				failed <- err
				return
			}
			accepted <- c
		}
	}()
	waitFor(t, "an accept failed for want of a descriptor", func() bool { return retries.Load() > 0 || len(failed) > 0 })
	select {
	case err := <-failed:
		t.Fatalf("Accept at the descriptor limit = %v, want it to wait", err)
	case c := <-accepted:
		t.Fatalf("Accept at the descriptor limit = %v, want no descriptor for it", c.LocalAddr())
	default:
	}
	// A descriptor given back: a waiting connection is accepted.
	held[0].Close()
	select {
	case c := <-accepted:
		c.Close()
	case err := <-failed:
		t.Fatalf("Accept once a descriptor was free = %v, want the waiting connection", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no connection accepted within 10 s of a descriptor coming free")
	}
	for _, c := range clients {
		c.Close()
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-failed:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept after Close = %v, want net.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Accept went on waiting after Close")
	}
}

// A shortage kept as text alone, as a net.DNSError keeps its socket's
// error, is read from the text's end, and told from its neighbours: EMFILE
// from ENFILE, whose text begins as EMFILE's.
func TestShortageInText(t *testing.T) {
	for _, tt := range []struct {
		text string
		want syscall.Errno
		ok   bool
	}{
		{"dial udp 10.0.0.10:53: socket: too many open files", syscall.EMFILE, true},
		{"dial udp 10.0.0.10:53: socket: too many open files in system", syscall.ENFILE, true},
		{"write udp 10.0.0.10:53: no buffer space available", syscall.ENOBUFS, true},
		{"dial udp 10.0.0.10:53: socket: cannot allocate memory", syscall.ENOMEM, true},
		{"read udp 10.0.0.10:53: connection refused", 0, false},
		{"server misbehaving", 0, false},
	} {
		if got, ok := ShortageIn(tt.text); got != tt.want || ok != tt.ok {
			t.Errorf("ShortageIn(%q) = %v, %v; want %v, %v", tt.text, got, ok, tt.want, tt.ok)
		}
	}
}
