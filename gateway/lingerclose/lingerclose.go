// Package lingerclose closes a server's TCP connections in stages, as
// RFC 9112 section 9.6 asks and nginx's lingering_close does: the write side
// first, then the client's remaining bytes are read and thrown away until
// it closes its side (or a bound is reached), and only then the socket.
//
// fasthttp closes at once. When it refuses a request whose rest is still
// arriving (a body over the limit, a head over the limit, a request refused
// with "Connection: close"), the bytes that arrive after the close make the
// kernel answer with a reset, and a client still sending sees "connection
// reset" instead of the error envelope it was sent (fasthttp issue #1348:
// browsers almost always, curl now and then; on loopback from about 4 MB
// of unsent body on, on real networks much sooner).
//
// The draining runs in a goroutine of its own after Close returns, so the
// server's worker is free at once. It is bounded per connection (Options)
// and in number: past MaxConns lingering connections, a connection is
// closed at once, as without this package. A kind of close that may come in
// a flood lingers on a Budget of its own (CloseOn), so that it cannot use
// up the places the listener's other closes count on.
package lingerclose

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coinexport/export/pkg/rawio"
)

// Options bound the draining of one closed connection.
type Options struct {
	// IdleTimeout ends the draining when the client sends nothing for
	// this long.
	IdleTimeout time.Duration
	// MaxTime ends it this long after Close, however the client sends.
	MaxTime time.Duration
	// MaxBytes ends it once this many bytes were thrown away.
	MaxBytes int64
	// MaxConns is how many connections may linger at once.
	MaxConns int64
}

// Defaults are the gateway's: long enough for a client on a slow link to
// finish sending a few megabytes it should not have sent and read the
// answer; short enough that lingering connections cost little.
var Defaults = Options{IdleTimeout: 2 * time.Second, MaxTime: 10 * time.Second, MaxBytes: 16 << 20, MaxConns: 1024}

// Listener hands out connections that close in stages.
type Listener struct {
	net.Listener
	opts   Options
	budget *Budget
}

// NewListener wraps ln. Its connections linger on a Budget of
// opts.MaxConns.
func NewListener(ln net.Listener, opts Options) *Listener {
	return &Listener{Listener: ln, opts: opts, budget: NewBudget(opts.MaxConns)}
}

// Lingering is how many connections are being drained now on the
// listener's own budget.
func (l *Listener) Lingering() int64 { return l.budget.Lingering() }

// Budget is the listener's own budget, for its figures.
func (l *Listener) Budget() *Budget { return l.budget }

// Budget bounds how many connections linger on it at once; past it a
// connection is closed at once.
type Budget struct {
	max       int64
	lingering atomic.Int64
	// turnedAway counts the closes that found it full: the signal that
	// it is too small, a client still sending then reading a reset.
	turnedAway atomic.Uint64
}

// NewBudget returns a budget of max lingering connections.
func NewBudget(max int64) *Budget { return &Budget{max: max} }

// Lingering is how many connections are being drained now on b.
func (b *Budget) Lingering() int64 { return b.lingering.Load() }

// Max is how many connections may linger on b at once.
func (b *Budget) Max() int64 { return b.max }

// TurnedAway is how many closes found b full and closed at once.
func (b *Budget) TurnedAway() uint64 { return b.turnedAway.Load() }

// admit counts one more lingering connection unless max are already.
// Compared before it is added, never added and taken back: the gauge
// read at a scrape never passes its bound, and a close never finds the
// budget full for a place another close held only for that moment.
func (b *Budget) admit() bool {
	for {
		n := b.lingering.Load()
		if n >= b.max {
			b.turnedAway.Add(1)
			return false
		}
		if b.lingering.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Accept accepts a connection; one that is not TCP is returned as it is.
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c, nil
	}
	return &Conn{TCPConn: tc, io: rawio.Wrap(tc).(*rawio.Conn), l: l}, nil
}

// Conn is a TCP connection whose Close lingers.
//
// To its owner a closed Conn is closed, as net.Conn's Close promises: a
// Read blocked in another goroutine returns (fasthttp's Shutdown closes
// an idle connection from outside and waits for the goroutine reading
// it), and later Reads and deadlines fail with net.ErrClosed. Otherwise
// that Read would go on beside the drain, take the client's bytes, and
// end only with the drain's deadline, a timeout fasthttp answers with a
// 408 on a connection that never sent a request; and a deadline set after
// Close would replace the drain's.
type Conn struct {
	*net.TCPConn
	// io is the socket's reads and writes for its owner, made with raw
	// system calls (rawio: the runtime's monitor is not woken by each).
	io *rawio.Conn
	l  *Listener
	// mu orders closing with setting deadlines, so that none set by the
	// owner reaches the socket once it drains.
	mu     sync.Mutex
	closed atomic.Bool
	// reading is held by Read: the drain starts once a Read that was
	// blocked at Close has returned, so that the two never read together.
	reading sync.Mutex
}

// Read reads, or fails with net.ErrClosed after Close.
func (c *Conn) Read(p []byte) (int, error) {
	c.reading.Lock()
	defer c.reading.Unlock()
	if c.closed.Load() {
		return 0, c.errClosed("read")
	}
	n, err := c.io.Read(p)
	if err != nil && c.closed.Load() { // Close interrupted it
		err = c.errClosed("read")
	}
	return n, err
}

// Write writes p to the socket.
func (c *Conn) Write(p []byte) (int, error) { return c.io.Write(p) }

// WriteBuffers writes bufs to the socket in one writev (net.Buffers
// writes one piece at a time to anything but net's own types), for the
// wrappers above a Conn, which cannot reach the socket's own.
func (c *Conn) WriteBuffers(bufs *net.Buffers) (int64, error) {
	return c.io.WriteBuffers(bufs)
}

// SetDeadline sets both deadlines, or fails with net.ErrClosed after Close.
func (c *Conn) SetDeadline(t time.Time) error {
	return c.setDeadline(t, c.TCPConn.SetDeadline)
}

// SetReadDeadline sets the read deadline, or fails with net.ErrClosed
// after Close.
func (c *Conn) SetReadDeadline(t time.Time) error {
	return c.setDeadline(t, c.TCPConn.SetReadDeadline)
}

// SetWriteDeadline sets the write deadline, or fails with net.ErrClosed
// after Close.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	return c.setDeadline(t, c.TCPConn.SetWriteDeadline)
}

func (c *Conn) setDeadline(t time.Time, set func(time.Time) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return c.errClosed("set")
	}
	return set(t)
}

// errClosed is the error of an operation op on a closed Conn, as
// net.TCPConn words it.
func (c *Conn) errClosed(op string) error {
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: net.ErrClosed}
}

// Close closes the write side and leaves the rest to a goroutine that
// drains what the client still sends, then closes the socket. It returns
// at once.
func (c *Conn) Close() error { return c.CloseOn(c.l.budget) }

// CloseOn is Close lingering on b instead of the listener's budget (at
// once if b is full), the draining bounded by the listener's Options all
// the same.
func (c *Conn) CloseOn(b *Budget) error {
	c.mu.Lock()
	first := c.closed.CompareAndSwap(false, true)
	c.mu.Unlock()
	if !first {
		return net.ErrClosed
	}
	if !b.admit() {
		return c.TCPConn.Close()
	}
	if err := c.TCPConn.CloseWrite(); err != nil { // the client reset it already
		b.lingering.Add(-1)
		return c.TCPConn.Close()
	}
	// A deadline past interrupts a Read blocked in another goroutine.
	_ = c.TCPConn.SetReadDeadline(aLongTimeAgo)
	go c.drainThenClose(b)
	return nil
}

// aLongTimeAgo is a deadline already past.
var aLongTimeAgo = time.Unix(1, 0)

// discard holds the buffers drained bytes are read into.
var discard = sync.Pool{New: func() any { return new([16 << 10]byte) }}

// drainThenClose reads until the client's end of stream, an error, or a
// bound of Options, then closes and gives its place on b back.
func (c *Conn) drainThenClose(b *Budget) {
	defer b.lingering.Add(-1)
	defer c.TCPConn.Close()
	// Wait for a Read that was blocked at Close to return (interrupted);
	// later ones fail without reading.
	c.reading.Lock()
	//lint:ignore SA2001 only the wait counts
	c.reading.Unlock()
	buf := discard.Get().(*[16 << 10]byte)
	defer discard.Put(buf)
	opts := c.l.opts
	end := time.Now().Add(opts.MaxTime)
	for read := int64(0); read < opts.MaxBytes; {
		deadline := time.Now().Add(opts.IdleTimeout)
		if deadline.After(end) {
			deadline = end
		}
		if c.TCPConn.SetReadDeadline(deadline) != nil {
			return
		}
		n, err := c.TCPConn.Read(buf[:])
		read += int64(n)
		if err != nil { // io.EOF: the client closed its side, as it should
			return
		}
	}
}
