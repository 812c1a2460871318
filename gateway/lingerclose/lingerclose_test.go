package lingerclose

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

const refusal = "HTTP/1.1 413 Payload Too Large\r\nConnection: close\r\n\r\n"

// refusingServer accepts connections on a Listener with opts and answers
// each with refusal after reading its first KiB, then closes it: what
// fasthttp does with a body over its limit.
func refusingServer(t *testing.T, opts Options) *Listener {
	t.Helper()
	l := listen(t, opts)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				_, _ = c.Read(make([]byte, 1024))
				_, _ = io.WriteString(c, refusal)
				_ = c.Close()
			}()
		}
	}()
	return l
}

// listen returns a Listener with opts on a loopback port, closed at the
// test's end.
func listen(t *testing.T, opts Options) *Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := NewListener(ln, opts)
	t.Cleanup(func() { l.Close() })
	return l
}

// sendThenRead writes size bytes in one call, as a client does that sends
// its whole request before it reads, then reads the answer to the end.
func sendThenRead(t *testing.T, addr string, size int) (answer []byte, writeErr, readErr error) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, writeErr = c.Write(bytes.Repeat([]byte("b"), size)); writeErr != nil {
		return nil, writeErr, nil
	}
	answer, readErr = io.ReadAll(c)
	return answer, nil, readErr
}

// waitLingering waits up to 5 s for l.Lingering() to reach want.
func waitLingering(t *testing.T, l interface{ Lingering() int64 }, want int64) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); l.Lingering() != want; {
		if time.Now().After(end) {
			t.Fatalf("lingering connections = %d, want %d", l.Lingering(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A client that is still sending when the server refuses and closes
// finishes sending and reads the refusal. Closed at once, the socket would
// answer the bytes still arriving with a reset, and the client's write
// would fail (on loopback 18 of 20 times for 4 MiB, every time for 16).
func TestAClientStillSendingReadsTheAnswer(t *testing.T) {
	l := refusingServer(t, Options{IdleTimeout: 2 * time.Second, MaxTime: 10 * time.Second, MaxBytes: 64 << 20, MaxConns: 8})
	for range 3 {
		answer, writeErr, readErr := sendThenRead(t, l.Addr().String(), 16<<20)
		if writeErr != nil || readErr != nil || string(answer) != refusal {
			t.Fatalf("client sending 16 MiB: write %v, read %v, answer %q; want the refusal, then the end of stream", writeErr, readErr, answer)
		}
	}
	waitLingering(t, l, 0)
}

// Draining stops at MaxBytes: past it the socket is closed as it would be
// without lingering, and a client still sending gets the reset.
func TestDrainingStopsAtMaxBytes(t *testing.T) {
	l := refusingServer(t, Options{IdleTimeout: 2 * time.Second, MaxTime: 10 * time.Second, MaxBytes: 64 << 10, MaxConns: 8})
	_, writeErr, readErr := sendThenRead(t, l.Addr().String(), 64<<20)
	if writeErr == nil && readErr == nil {
		t.Fatal("a client sending 64 MiB past a 64 KiB drain finished without an error; want the reset")
	}
	waitLingering(t, l, 0)
}

// A client that neither sends nor closes is let go after IdleTimeout: the
// server's socket is closed, so the client's next writes fail.
func TestASilentClientIsLetGoAfterIdleTimeout(t *testing.T) {
	l := refusingServer(t, Options{IdleTimeout: 500 * time.Millisecond, MaxTime: 10 * time.Second, MaxBytes: 1 << 20, MaxConns: 8})
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write([]byte("hello"))
	answer := make([]byte, len(refusal))
	if _, err := io.ReadFull(c, answer); err != nil || string(answer) != refusal {
		t.Fatalf("answer %q, %v; want the refusal", answer, err)
	}
	waitLingering(t, l, 1)
	waitLingering(t, l, 0)
	var werr error
	for i := 0; i < 50 && werr == nil; i++ { // the first write after the close may still be accepted
		_, werr = c.Write([]byte("more"))
		time.Sleep(10 * time.Millisecond)
	}
	if werr == nil {
		t.Fatal("writes after the idle timeout still succeed; want the server's socket closed")
	}
}

// Past MaxConns lingering connections, Close closes at once: of three
// silent clients, one is drained (its writes are taken in) and the socket
// of the other two is gone (their writes get a reset), and the budget
// counts the two it turned away.
func TestPastMaxConnsCloseIsImmediate(t *testing.T) {
	l := refusingServer(t, Options{IdleTimeout: 10 * time.Second, MaxTime: 10 * time.Second, MaxBytes: 1 << 20, MaxConns: 1})
	var clients []net.Conn
	for range 3 { // silent clients: each would linger for IdleTimeout
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, _ = c.Write([]byte("hello"))
		clients = append(clients, c)
	}
	for _, c := range clients {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, make([]byte, len(refusal))); err != nil {
			t.Fatalf("reading the refusal: %v", err)
		}
	}
	waitLingering(t, l, 1)
	refused := 0
	for _, c := range clients {
		var err error
		for i := 0; i < 100 && err == nil; i++ { // the first write after a close may still be taken in
			_, err = c.Write([]byte("more"))
			time.Sleep(5 * time.Millisecond)
		}
		if err != nil {
			refused++
		}
	}
	if n := l.Lingering(); refused != 2 || n != 1 {
		t.Fatalf("%d clients refused, %d connections lingering; want 2 closed at once and 1 lingering (MaxConns)", refused, n)
	}
	if n := l.Budget().TurnedAway(); n != 2 {
		t.Errorf("budget's TurnedAway() = %d, want 2 (the closes it had no place for)", n)
	}
	for _, c := range clients {
		c.Close()
	}
	waitLingering(t, l, 0)
}

// Close twice: the second says the connection is closed.
func TestCloseTwice(t *testing.T) {
	l := listen(t, Defaults)
	go func() {
		if c, err := net.Dial("tcp", l.Addr().String()); err == nil {
			defer c.Close()
			_, _ = io.ReadAll(c)
		}
	}()
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("first Close: %v", err)
	}
	if err := c.Close(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("second Close = %v, want net.ErrClosed", err)
	}
	waitLingering(t, l, 0)
}

// Close ends the connection for its owner as a net.Conn's Close does: a
// Read blocked in another goroutine returns at once with net.ErrClosed (a
// server closing an idle connection on shutdown waits for that goroutine),
// and a later Read or deadline fails without touching the socket, whose
// draining goes on by its own bounds.
func TestCloseEndsTheConnectionForItsOwner(t *testing.T) {
	l := listen(t, Options{IdleTimeout: 5 * time.Second, MaxTime: 10 * time.Second, MaxBytes: 1 << 20, MaxConns: 8})
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	read := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 1))
		read <- err
	}()
	time.Sleep(50 * time.Millisecond) // the Read is blocked
	if err := c.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	select {
	case err := <-read:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Read blocked at Close = %v, want net.ErrClosed", err)
		}
	case <-time.After(time.Second):
		t.Fatal("a Read blocked at Close still blocks 1 s later, want it to return net.ErrClosed")
	}
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Read after Close = %v, want net.ErrClosed", err)
	}
	if err := c.SetReadDeadline(time.Now()); !errors.Is(err, net.ErrClosed) {
		t.Errorf("SetReadDeadline after Close = %v, want net.ErrClosed", err)
	}
	time.Sleep(50 * time.Millisecond)
	if n := l.Lingering(); n != 1 {
		t.Fatalf("lingering connections = %d after the owner's calls, want 1 (draining for IdleTimeout)", n)
	}
	if _, err := client.Write([]byte("more")); err != nil {
		t.Fatalf("client write while draining: %v", err)
	}
	_ = client.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, err := client.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("client read = %d, %v; want the end of stream", n, err)
	}
	client.Close()
	waitLingering(t, l, 0)
}

// A connection closed with CloseOn lingers on the budget it names, not on
// its listener's: closes of one kind, however many, leave the listener's
// places to the others. With the other budget full, such a close is
// immediate, and the listener's own places are still there.
func TestCloseOnLingersOnItsOwnBudget(t *testing.T) {
	l := listen(t, Options{IdleTimeout: 10 * time.Second, MaxTime: 10 * time.Second, MaxBytes: 1 << 20, MaxConns: 1})
	other := NewBudget(1)
	// Each closed with the client silent and its end open: it lingers for IdleTimeout.
	closeOne := func(closeIt func(*Conn) error) {
		t.Helper()
		client, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { client.Close() })
		c, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		if err := closeIt(c.(*Conn)); err != nil {
			t.Fatal(err)
		}
	}
	closeOnOther := func(c *Conn) error { return c.CloseOn(other) }
	closeOne(closeOnOther)
	closeOne(closeOnOther) // other is full: closed at once
	if l.Lingering() != 0 || other.Lingering() != 1 {
		t.Fatalf("after two CloseOn of a budget of 1: %d lingering on the listener, %d on the budget; want 0 and 1",
			l.Lingering(), other.Lingering())
	}
	closeOne((*Conn).Close)
	if l.Lingering() != 1 || other.Lingering() != 1 {
		t.Fatalf("a Close beside a full budget: %d lingering on the listener, %d on the budget; want 1 and 1",
			l.Lingering(), other.Lingering())
	}
}

// A connection lingering on a Budget gives its place back to that Budget,
// not to its listener's, whichever way its close ends: the drain reaching
// the client's end of stream, or the client's reset before the close
// (CloseWrite fails). Given back to the wrong one, a flood of refusals
// would leave the refusals' Budget full for good and the listener's count
// below zero.
func TestCloseOnGivesThePlaceBackToItsBudget(t *testing.T) {
	l := listen(t, Options{IdleTimeout: 10 * time.Second, MaxTime: 10 * time.Second, MaxBytes: 1 << 20, MaxConns: 1})
	other := NewBudget(1)
	for _, reset := range []bool{false, true} {
		client, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		if reset {
			_ = client.(*net.TCPConn).SetLinger(0) // its Close sends a reset
			client.Close()
			// The reset has arrived once a Read says so.
			if _, err := c.Read(make([]byte, 1)); err == nil {
				t.Fatal("read from a client that reset: no error")
			}
		}
		if err := c.(*Conn).CloseOn(other); err != nil && !reset {
			t.Fatal(err)
		}
		client.Close() // the drain reads its end of stream
		waitLingering(t, other, 0)
		if n := l.Lingering(); n != 0 {
			t.Fatalf("after a CloseOn of a client that reset = %v: %d lingering on the listener, want 0", reset, n)
		}
	}
}

// A full budget's count never passes its bound, however many closes find
// it full at once, and each of them is counted turned away: the gauge
// exported against gateway_connections_lingering_max read above it while
// closes added themselves and took themselves back.
func TestAFullBudgetNeverCountsPastItsBound(t *testing.T) {
	b := NewBudget(1)
	if !b.admit() {
		t.Fatal("the first close found an empty budget of one full")
	}
	const closers, closesEach = 8, 200_000
	done := make(chan struct{})
	for range closers {
		go func() {
			defer func() { done <- struct{}{} }()
			for range closesEach {
				if b.admit() {
					t.Error("a close was admitted to a full budget")
					return
				}
			}
		}()
	}
	highest := int64(0)
	for running := closers; running > 0; {
		select {
		case <-done:
			running--
		default:
			highest = max(highest, b.Lingering())
		}
	}
	if highest != 1 || b.TurnedAway() != closers*closesEach {
		t.Errorf("lingering read up to %d, %d turned away; want 1 at most (the bound), %d", highest, b.TurnedAway(), closers*closesEach)
	}
}

// WriteBuffers writes the buffers to the socket in their order (one writev:
// net.Buffers on a *net.TCPConn), for the wrappers above a Conn; after
// Close it fails, as a Write does.
func TestWriteBuffersWritesToTheSocket(t *testing.T) {
	l := listen(t, Defaults)
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	accepted, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	c := accepted.(*Conn)
	bufs := net.Buffers{[]byte("head"), bytes.Repeat([]byte("b"), 100<<10)}
	if n, err := c.WriteBuffers(&bufs); n != 4+100<<10 || err != nil {
		t.Fatalf("WriteBuffers = %d, %v, want %d, nil", n, err, 4+100<<10)
	}
	_ = c.Close()
	got, err := io.ReadAll(client)
	if err != nil || len(got) != 4+100<<10 || string(got[:4]) != "head" || bytes.Count(got[4:], []byte("b")) != 100<<10 {
		t.Fatalf("the client read %d bytes (%v), want head then the body", len(got), err)
	}
	bufs = net.Buffers{[]byte("late")}
	if _, err := c.WriteBuffers(&bufs); err == nil {
		t.Error("WriteBuffers after Close succeeded")
	}
}
