package conncap_test

import (
	"net"
	"testing"
	"time"

	"github.com/coinexport/export/gateway/conncap"
)

// capped listens on loopback with a cap of max, accepting in a loop:
// each connection it accepts is sent on accepted, each it refuses is
// closed and sent on refused.
func capped(t *testing.T, max int) (l *conncap.Listener, accepted, refused chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted, refused = make(chan net.Conn, 16), make(chan net.Conn, 16)
	l = conncap.NewListener(ln, max, func(c net.Conn) {
		c.Close()
		refused <- c
	})
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	return l, accepted, refused
}

// connect dials l and returns the connection its Accept returned, or nil
// if it was refused.
func connect(t *testing.T, l *conncap.Listener, accepted, refused <-chan net.Conn) net.Conn {
	t.Helper()
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	select {
	case c := <-accepted:
		return c
	case <-refused:
		return nil
	case <-time.After(10 * time.Second):
		t.Fatal("the connection was neither accepted nor refused")
	}
	return nil
}

func TestPastTheCapAConnectionIsRefusedUntilOneCloses(t *testing.T) {
	l, accepted, refused := capped(t, 2)
	first, second := connect(t, l, accepted, refused), connect(t, l, accepted, refused)
	if first == nil || second == nil {
		t.Fatal("a connection under the cap was refused")
	}
	if got := l.Open(); got != 2 {
		t.Fatalf("Open() = %d, want 2", got)
	}
	if connect(t, l, accepted, refused) != nil {
		t.Fatal("a third connection with a cap of 2 was accepted")
	}
	if got := l.Open(); got != 2 {
		t.Fatalf("Open() after a refusal = %d, want 2", got)
	}
	first.Close()
	if got := l.Open(); got != 1 {
		t.Fatalf("Open() after a close = %d, want 1", got)
	}
	if connect(t, l, accepted, refused) == nil {
		t.Fatal("a connection was refused once one of the 2 had closed")
	}
}

// However often its connections are closed, the count comes back to 0,
// never below: a second Close (fasthttp's and a wrapper's, say) frees
// nothing more, and the cap holds as it did.
func TestTheCountNeitherLeaksNorGoesNegative(t *testing.T) {
	const max = 3
	l, accepted, refused := capped(t, max)
	for round := range 3 {
		var conns []net.Conn
		for range max {
			c := connect(t, l, accepted, refused)
			if c == nil {
				t.Fatalf("round %d: a connection under the cap was refused", round)
			}
			conns = append(conns, c)
		}
		if connect(t, l, accepted, refused) != nil {
			t.Fatalf("round %d: a connection past the cap was accepted", round)
		}
		for _, c := range conns {
			c.Close()
			c.Close()
		}
		if got := l.Open(); got != 0 {
			t.Fatalf("round %d: Open() after closing every connection twice = %d, want 0", round, got)
		}
	}
}

// oneConnListener hands out conn, once.
type oneConnListener struct {
	net.Listener
	conn net.Conn
}

func (l *oneConnListener) Accept() (net.Conn, error) { return l.conn, nil }

// buffersConn counts the WriteBuffers and the Writes made to it.
type buffersConn struct {
	net.Conn
	writevs, writes int
}

func (c *buffersConn) Write(p []byte) (int, error) { c.writes++; return len(p), nil }

func (c *buffersConn) WriteBuffers(bufs *net.Buffers) (int64, error) {
	c.writevs++
	var n int64
	for _, b := range *bufs {
		n += int64(len(b))
	}
	*bufs = nil
	return n, nil
}

// A counted connection passes WriteBuffers on to its connection's own (a
// socket's writev through the gateway's wrappers): net.Buffers writes to a
// wrapper that lacks it one piece, and one syscall, at a time.
func TestACountedConnectionWritesBuffersThroughItsConnection(t *testing.T) {
	inner := &buffersConn{}
	l := conncap.NewListener(&oneConnListener{conn: inner}, 1, func(net.Conn) {})
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	bw, ok := c.(interface {
		WriteBuffers(*net.Buffers) (int64, error)
	})
	if !ok {
		t.Fatal("a counted connection has no WriteBuffers")
	}
	bufs := net.Buffers{[]byte("head"), []byte("body")}
	if n, err := bw.WriteBuffers(&bufs); n != 8 || err != nil || inner.writevs != 1 || inner.writes != 0 {
		t.Errorf("WriteBuffers = %d, %v, with %d writevs and %d writes of the connection; want 8, nil, 1, 0", n, err, inner.writevs, inner.writes)
	}
}
