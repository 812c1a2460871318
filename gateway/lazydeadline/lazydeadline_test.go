package lazydeadline

import (
	"errors"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// countingConn counts the deadlines that reach the connection.
type countingConn struct {
	net.Conn
	reads, writes []time.Time
}

func (c *countingConn) SetReadDeadline(t time.Time) error { c.reads = append(c.reads, t); return nil }
func (c *countingConn) SetWriteDeadline(t time.Time) error {
	c.writes = append(c.writes, t)
	return nil
}
func (c *countingConn) Read(p []byte) (int, error)  { return 0, nil }
func (c *countingConn) Write(p []byte) (int, error) { return len(p), nil }

// Deadlines asked for between two reads reach the connection once, as the
// last one rounded up to a tick, and only when that changed; clearing a
// deadline and a deadline already past reach it too.
func TestOnlyChangedDeadlinesReachTheConnection(t *testing.T) {
	inner := &countingConn{}
	c := Wrap(inner, time.Second)
	base := time.Now().Add(time.Hour).Truncate(time.Second)

	for i := range 10 { // an idle and a read deadline per request, as fasthttp sets them
		_ = c.SetReadDeadline(base.Add(time.Duration(i+1) * time.Millisecond))
		_ = c.SetReadDeadline(base.Add(time.Duration(i+1) * time.Millisecond).Add(-45 * time.Minute))
		_ = c.SetReadDeadline(base.Add(time.Duration(i+1) * time.Millisecond))
		_, _ = c.Read(nil)
	}
	if want := []time.Time{base.Add(time.Second)}; !slices.EqualFunc(inner.reads, want, time.Time.Equal) {
		t.Fatalf("deadlines set on the connection = %v, want %v (one, rounded up)", inner.reads, want)
	}

	_ = c.SetReadDeadline(time.Time{})
	_, _ = c.Read(nil)
	_, _ = c.Read(nil)
	if n := len(inner.reads); n != 2 || !inner.reads[1].IsZero() {
		t.Fatalf("after clearing: deadlines set = %v, want the zero time once more", inner.reads)
	}

	past := time.Unix(0, 0)
	_ = c.SetReadDeadline(past) // no Read follows: applied at once
	if n := len(inner.reads); n != 3 || !inner.reads[2].Equal(past) {
		t.Fatalf("a past deadline: deadlines set = %v, want %v applied at once", inner.reads, past)
	}
	_ = c.SetReadDeadline(time.Time{})
	_, _ = c.Read(nil)
	if n := len(inner.reads); n != 4 || !inner.reads[3].IsZero() {
		t.Fatalf("clearing a past deadline: deadlines set = %v, want the zero time", inner.reads)
	}

	_ = c.SetWriteDeadline(base)
	if len(inner.writes) != 0 {
		t.Fatalf("a write deadline reached the connection before any write: %v", inner.writes)
	}
	_, _ = c.Write([]byte("x"))
	_, _ = c.Write([]byte("x"))
	if want := []time.Time{base}; !slices.EqualFunc(inner.writes, want, time.Time.Equal) {
		t.Fatalf("write deadlines set = %v, want %v", inner.writes, want)
	}
}

// On a real connection a read deadline still ends a blocked read, and a
// deadline set in the past from another goroutine interrupts one.
func TestDeadlinesStillEndReads(t *testing.T) {
	c := Wrap(pipe(t), 10*time.Millisecond)

	_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read() error = %v, want the deadline exceeded", err)
	}

	_ = c.SetReadDeadline(time.Time{})
	done := readInBackground(c)
	time.Sleep(20 * time.Millisecond) // let the Read block; the test passes either way
	_ = c.SetReadDeadline(time.Now())
	wantDeadlineExceeded(t, done, "a past deadline did not interrupt the blocked Read")
}

// pipe returns one end of an in-memory connection, both closed when the
// test ends.
func pipe(t *testing.T) net.Conn {
	client, server := net.Pipe()
	t.Cleanup(func() { client.Close(); server.Close() })
	return client
}

// readInBackground reads a byte from c in a goroutine, and sends its error.
func readInBackground(c net.Conn) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 1))
		done <- err
	}()
	return done
}

// wantDeadlineExceeded waits for the background Read to end in its
// deadline; if it is still blocked after 10 s the test fails with blocked.
func wantDeadlineExceeded(t *testing.T, done <-chan error, blocked string) {
	t.Helper()
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read() error = %v, want the deadline exceeded", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal(blocked)
	}
}

func TestTickFor(t *testing.T) {
	for _, tc := range []struct {
		timeouts []time.Duration
		want     time.Duration
	}{
		{[]time.Duration{15 * time.Second, 60 * time.Second}, time.Second},
		{[]time.Duration{60 * time.Second, 2 * time.Second, 0}, 250 * time.Millisecond},
		{[]time.Duration{time.Microsecond}, time.Millisecond},
		{[]time.Duration{0, 0}, time.Second},
	} {
		if got := TickFor(tc.timeouts...); got != tc.want {
			t.Errorf("TickFor(%v) = %v, want %v", tc.timeouts, got, tc.want)
		}
	}
}

// stallingConn holds the first zero deadline a Read hands to the
// connection until released, to open the window between a Read reading its
// deadline and applying it.
type stallingConn struct {
	net.Conn
	stall            bool
	entered, release chan struct{}
}

func (s *stallingConn) SetReadDeadline(t time.Time) error {
	if s.stall && t.IsZero() {
		s.stall = false
		close(s.entered)
		<-s.release
	}
	return s.Conn.SetReadDeadline(t)
}

// An interrupt that comes while a Read is applying an older deadline is
// not overwritten by it: the Read still ends.
func TestInterruptIsNotOverwrittenByAnOlderDeadline(t *testing.T) {
	sc := &stallingConn{Conn: pipe(t), entered: make(chan struct{}), release: make(chan struct{})}
	c := Wrap(sc, 10*time.Millisecond)
	_ = c.SetReadDeadline(time.Now().Add(time.Hour))
	c.read.applied.Store(c.read.wanted.Load())
	_ = c.SetReadDeadline(time.Time{}) // the next Read will clear it
	sc.stall = true

	done := readInBackground(c)
	<-sc.entered // the Read is applying the zero deadline
	go func() { _ = c.SetReadDeadline(time.Now()) }()
	time.Sleep(10 * time.Millisecond) // let the interrupt reach the lock; the test passes either way
	close(sc.release)
	wantDeadlineExceeded(t, done, "an interrupt set while the Read applied an older deadline was lost: the Read is still blocked")
}

// Deadlines too far ahead to round go to the connection at once.
func TestFarDeadlinesAreAppliedAtOnce(t *testing.T) {
	inner := &countingConn{}
	c := Wrap(inner, time.Second)
	far := time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)
	_ = c.SetReadDeadline(far)
	_, _ = c.Read(nil)
	if want := []time.Time{far}; !slices.EqualFunc(inner.reads, want, time.Time.Equal) {
		t.Fatalf("deadlines set = %v, want %v once", inner.reads, want)
	}
}

// What fasthttp does per request on a client's connection: an idle, a read
// and a write deadline, a read and a write. Reported allocations should be 0.
func BenchmarkRequestDeadlines(b *testing.B) {
	c := Wrap(&countingConn{}, time.Second)
	b.ReportAllocs()
	for b.Loop() {
		now := time.Now()
		_ = c.SetReadDeadline(now.Add(time.Minute))
		_, _ = c.Read(nil)
		_ = c.SetReadDeadline(now.Add(15 * time.Second))
		_ = c.SetWriteDeadline(now.Add(time.Minute))
		_, _ = c.Write(nil)
	}
}

// vectoredConn records, in order, the write deadlines set on it and the
// writes made to it: "writev" for a WriteBuffers, "write" for a Write.
type vectoredConn struct {
	countingConn
	events []string
}

func (c *vectoredConn) SetWriteDeadline(t time.Time) error {
	c.events = append(c.events, "deadline")
	return c.countingConn.SetWriteDeadline(t)
}
func (c *vectoredConn) Write(p []byte) (int, error) {
	c.events = append(c.events, "write")
	return len(p), nil
}
func (c *vectoredConn) WriteBuffers(bufs *net.Buffers) (int64, error) {
	c.events = append(c.events, "writev")
	var n int64
	for _, b := range *bufs {
		n += int64(len(b))
	}
	*bufs = nil
	return n, nil
}

// WriteBuffers hands the buffers to the connection's own WriteBuffers (one
// writev on a socket; net.Buffers would write to the wrapper piece by
// piece), after the write deadline set since the last write: the gateway
// writes a held page so, and a client that stops reading must still meet
// GATEWAY_WRITE_TIMEOUT.
func TestWriteBuffersAppliesTheDeadlineThenWritesOnce(t *testing.T) {
	inner := &vectoredConn{}
	c := Wrap(inner, time.Second)
	deadline := time.Now().Add(time.Hour)
	_ = c.SetWriteDeadline(deadline)
	bufs := net.Buffers{[]byte("head"), []byte("body")}
	if n, err := c.WriteBuffers(&bufs); n != 8 || err != nil {
		t.Fatalf("WriteBuffers = %d, %v, want 8, nil", n, err)
	}
	if want := []string{"deadline", "writev"}; !slices.Equal(inner.events, want) ||
		len(inner.writes) != 1 || inner.writes[0].Before(deadline) {
		t.Errorf("the connection saw %q (deadlines %v), want %q with the deadline set, %v rounded up", inner.events, inner.writes, want, deadline)
	}
}

// On a connection with no WriteBuffers of its own, WriteBuffers writes the
// buffers in order, as net.Buffers does.
func TestWriteBuffersWritesPieceByPieceWithout(t *testing.T) {
	inner := &recordingConn{}
	c := Wrap(inner, time.Second)
	bufs := net.Buffers{[]byte("head"), []byte("body")}
	if n, err := c.WriteBuffers(&bufs); n != 8 || err != nil || inner.written.String() != "headbody" {
		t.Errorf("WriteBuffers = %d, %v, written %q; want 8, nil, headbody", n, err, inner.written.String())
	}
}

// recordingConn keeps what is written to it.
type recordingConn struct {
	countingConn
	written strings.Builder
}

func (c *recordingConn) Write(p []byte) (int, error) { return c.written.Write(p) }
