package rawio_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/rawio"
)

// tcpPair is a connected loopback TCP pair: the client side wrapped, and
// the server side as net gives it.
func tcpPair(t *testing.T) (wrapped net.Conn, peer net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return dialPair(t, ln, "tcp")
}

func unixPair(t *testing.T) (wrapped net.Conn, peer net.Conn) {
	t.Helper()
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return dialPair(t, ln, "unix")
}

func dialPair(t *testing.T, ln net.Listener, network string) (net.Conn, net.Conn) {
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	c, err := net.Dial(network, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer := <-accepted
	w := rawio.Wrap(c)
	if _, ok := w.(*rawio.Conn); !ok {
		t.Fatalf("Wrap(%T) = %T, want a *rawio.Conn", c, w)
	}
	t.Cleanup(func() { w.Close(); peer.Close() })
	return w, peer
}

// Bytes written either way arrive whole and in order, on TCP and Unix
// sockets, however the kernel splits them: 8 MB is more than a socket's
// buffers hold, so the writes wait in the poller (EAGAIN) and go on.
func TestBytesCrossBothWays(t *testing.T) {
	for name, pair := range map[string]func(*testing.T) (net.Conn, net.Conn){"tcp": tcpPair, "unix": unixPair} {
		t.Run(name, func(t *testing.T) {
			w, peer := pair(t)
			payload := bytes.Repeat([]byte("0123456789abcdef"), 512<<10)
			var got []byte
			var wg sync.WaitGroup
			wg.Go(func() { got, _ = io.ReadAll(io.LimitReader(peer, int64(len(payload)))) })
			if n, err := w.Write(payload); n != len(payload) || err != nil {
				t.Fatalf("Write = %d, %v, want %d, nil", n, err, len(payload))
			}
			wg.Wait()
			if !bytes.Equal(got, payload) {
				t.Fatalf("peer read %d bytes, not the %d written", len(got), len(payload))
			}

			wg.Go(func() { peer.Write(payload) })
			back, err := io.ReadAll(io.LimitReader(w, int64(len(payload))))
			wg.Wait()
			if err != nil || !bytes.Equal(back, payload) {
				t.Fatalf("read back %d bytes (%v), not the %d written", len(back), err, len(payload))
			}
		})
	}
}

// WriteBuffers sends every buffer, empty ones skipped, in order, and
// consumes them as net.Buffers.WriteTo does; more buffers than one writev
// takes (1024) go in the next.
func TestWriteBuffersSendsThemAllInOrder(t *testing.T) {
	w, peer := tcpPair(t)
	var bufs net.Buffers
	var want []byte
	for i := range 3000 {
		b := bytes.Repeat([]byte{byte('a' + i%26)}, i%7*1000) // every 7th empty
		bufs = append(bufs, b)
		want = append(want, b...)
	}
	var got []byte
	var wg sync.WaitGroup
	wg.Go(func() { got, _ = io.ReadAll(io.LimitReader(peer, int64(len(want)))) })
	n, err := w.(*rawio.Conn).WriteBuffers(&bufs)
	wg.Wait()
	if err != nil || n != int64(len(want)) || len(bufs) != 0 {
		t.Fatalf("WriteBuffers = %d, %v with %d buffers left, want %d, nil, none", n, err, len(bufs), len(want))
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the peer read other bytes than the buffers held")
	}
}

// The peer's close is io.EOF, as net's Read says it.
func TestPeerCloseIsEOF(t *testing.T) {
	w, peer := tcpPair(t)
	peer.Close()
	if n, err := w.Read(make([]byte, 10)); n != 0 || err != io.EOF {
		t.Fatalf("Read after the peer closed = %d, %v, want 0, io.EOF", n, err)
	}
}

// A read deadline ends a read that waits, with the error net gives: a
// net.Error whose Timeout is true, and os.ErrDeadlineExceeded; so does a
// write deadline a write that waits on a peer that reads nothing.
func TestDeadlinesEndWaitsAsNetsOwn(t *testing.T) {
	w, _ := tcpPair(t)
	w.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	_, err := w.Read(make([]byte, 10))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read past its deadline = %v, want a timeout", err)
	}
	w.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	n, err := w.Write(make([]byte, 64<<20))
	if !errors.As(err, &ne) || !ne.Timeout() || n >= 64<<20 {
		t.Fatalf("Write past its deadline = %d, %v, want part written and a timeout", n, err)
	}
}

// Close ends a read waiting on the socket with net.ErrClosed, and later
// calls fail so too.
func TestCloseEndsAWaitingRead(t *testing.T) {
	w, _ := tcpPair(t)
	done := make(chan error, 1)
	go func() { _, err := w.Read(make([]byte, 10)); done <- err }()
	time.Sleep(20 * time.Millisecond) // let it wait in the poller
	w.Close()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Read ended by Close = %v, want net.ErrClosed", err)
	}
	if _, err := w.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after Close = %v, want net.ErrClosed", err)
	}
}

// A write to a peer that reset the connection fails with the errno, which
// callers classify (errors.Is ECONNRESET or EPIPE).
func TestAResetIsItsErrno(t *testing.T) {
	w, peer := tcpPair(t)
	peer.(*net.TCPConn).SetLinger(0)
	peer.Close() // a reset
	var err error
	for range 100 { // the reset reaches the socket after a write or two
		if _, err = w.Write([]byte("x")); err != nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("Write to a reset connection = %v, want ECONNRESET or EPIPE", err)
	}
}

// Only net's own sockets are wrapped: anything else (a TLS connection, a
// pipe) is returned as it is. A wrapped socket keeps CloseWrite.
func TestWrapTakesOnlySockets(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if got := rawio.Wrap(a); got != a {
		t.Fatalf("Wrap(pipe) = %T, want the pipe itself", got)
	}
	w, peer := tcpPair(t)
	if err := w.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := peer.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("the peer's read after CloseWrite = %v, want io.EOF", err)
	}
}

// A failed call's error has the shape of net's own, op and cause: the
// cause right under the *net.OpError (os.ErrDeadlineExceeded, the closed
// connection's error, the errno's *os.SyscallError), not net's error of
// the RawConn call around it, which said every address twice in the logs
// ("read tcp A->B: raw-read tcp A->B: i/o timeout").
func TestErrorsHaveNetsShape(t *testing.T) {
	calls := map[string]func(c net.Conn) error{
		"a read past its deadline": func(c net.Conn) error {
			c.SetReadDeadline(time.Now().Add(-time.Second))
			_, err := c.Read(make([]byte, 1))
			return err
		},
		"a write past its deadline": func(c net.Conn) error {
			c.SetWriteDeadline(time.Now().Add(-time.Second))
			_, err := c.Write([]byte("x"))
			return err
		},
		"a read after Close": func(c net.Conn) error {
			c.Close()
			_, err := c.Read(make([]byte, 1))
			return err
		},
		"a write after Close": func(c net.Conn) error {
			c.Close()
			_, err := c.Write([]byte("x"))
			return err
		},
		"buffers written after Close": func(c net.Conn) error {
			c.Close()
			bufs := net.Buffers{[]byte("x")}
			if raw, ok := c.(*rawio.Conn); ok {
				_, err := raw.WriteBuffers(&bufs)
				return err
			}
			_, err := bufs.WriteTo(c)
			return err
		},
		"buffers written after CloseWrite": func(c net.Conn) error {
			c.(interface{ CloseWrite() error }).CloseWrite()
			bufs := net.Buffers{[]byte("x")}
			if raw, ok := c.(*rawio.Conn); ok {
				_, err := raw.WriteBuffers(&bufs)
				return err
			}
			_, err := bufs.WriteTo(c)
			return err
		},
	}
	shape := func(err error) string {
		var oe *net.OpError
		if !errors.As(err, &oe) {
			return fmt.Sprintf("%T %v", err, err)
		}
		return fmt.Sprintf("op %q net %q cause %T %q", oe.Op, oe.Net, oe.Err, oe.Err)
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			w, _ := tcpPair(t)
			stock := w.(*rawio.Conn).Conn
			other, _ := tcpPair(t)
			got, want := shape(call(other)), shape(call(stock))
			if got != want {
				t.Errorf("error %s, want net's %s", got, want)
			}
		})
	}
}
