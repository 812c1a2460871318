// Package lazydeadline wraps connections so that a deadline costs something
// only when it changes by a tick and a read or write is about to use it.
//
// fasthttp sets a deadline on a connection several times per request: the
// gateway's server sets the idle, the read and the write deadline of the
// client's connection, and its client the write and read deadline of the
// upstream one. Each set is a runtime timer update under a lock (3.5 % of
// the gateway's CPU under load, measured with pprof), and most of them move
// a deadline by microseconds or are replaced before any read or write
// happens. A wrapped connection remembers the deadline asked for, rounded
// up to the next tick, and hands it to the connection just before the next
// Read or Write, only if the rounded value changed.
//
// So a deadline fires up to one tick late, never early; a deadline in the
// past (how one goroutine interrupts another's blocked read) is applied at
// once. Deadlines other than those must be set by the goroutine that reads
// or writes, as fasthttp does.
package lazydeadline

import (
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// TickFor returns the tick for connections with these timeouts (0 for
// none): an eighth of the shortest, at most a second, at least a
// millisecond.
func TickFor(timeouts ...time.Duration) time.Duration {
	tick := time.Second
	for _, d := range timeouts {
		if d > 0 {
			tick = min(tick, max(d/8, time.Millisecond))
		}
	}
	return tick
}

// Conn is a net.Conn with lazy deadlines.
type Conn struct {
	net.Conn
	tick        int64 // nanoseconds
	read, write deadline
}

// deadline is one direction's deadline, as Unix nanoseconds rounded up to a
// tick, 0 for none: wanted is what was asked for, applied what the
// connection holds. mu orders handing deadlines to the connection, so that
// an interrupt from another goroutine is never overwritten by an older
// deadline that a Read or Write was applying at the same moment.
//
// Unix time reads the wall clock, which may step (NTP, a VM resumed), but
// only between the set and the next Read or Write, which fasthttp does at
// once: the connection then turns the deadline into a wait on the
// monotonic clock, which no later step moves.
type deadline struct {
	wanted, applied atomic.Int64
	mu              sync.Mutex
}

// Wrap returns c with lazy deadlines rounded up to tick.
func Wrap(c net.Conn, tick time.Duration) *Conn {
	return &Conn{Conn: c, tick: max(int64(tick), 1)}
}

// Read applies the read deadline if it changed, then reads.
func (c *Conn) Read(p []byte) (int, error) {
	if err := c.read.applyIfChanged(c.Conn.SetReadDeadline); err != nil {
		return 0, err
	}
	return c.Conn.Read(p)
}

// Write applies the write deadline if it changed, then writes.
func (c *Conn) Write(p []byte) (int, error) {
	if err := c.write.applyIfChanged(c.Conn.SetWriteDeadline); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

// WriteBuffers applies the write deadline if it changed, then writes bufs
// as one writev where the connection can (WriteBuffers of its own, or one
// of net's types): net.Buffers writes one piece at a time to any other
// writer, and to a Conn, which hides the connection's own method, it would.
func (c *Conn) WriteBuffers(bufs *net.Buffers) (int64, error) {
	if err := c.write.applyIfChanged(c.Conn.SetWriteDeadline); err != nil {
		return 0, err
	}
	if bw, ok := c.Conn.(buffersWriter); ok {
		return bw.WriteBuffers(bufs)
	}
	return bufs.WriteTo(c.Conn)
}

// buffersWriter is a connection that writes net.Buffers in one writev
// through wrappers net.Buffers cannot see past.
type buffersWriter interface {
	WriteBuffers(bufs *net.Buffers) (int64, error)
}

// SetDeadline sets both deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

// SetReadDeadline records t for the next Read; a t already past is applied
// now, for a Read that may be blocked in another goroutine.
func (c *Conn) SetReadDeadline(t time.Time) error {
	return c.read.set(t, c.tick, c.Conn.SetReadDeadline)
}

// SetWriteDeadline records t for the next Write, as SetReadDeadline does.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	return c.write.set(t, c.tick, c.Conn.SetWriteDeadline)
}

// set records t, rounded up to tick, or hands it to the connection through
// setOnConn at once if it must not wait (appliedAtOnce).
func (d *deadline) set(t time.Time, tick int64, setOnConn func(time.Time) error) error {
	if !appliedAtOnce(t) {
		d.wanted.Store(roundUp(t, tick))
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.setApplied(t)
	return setOnConn(t)
}

// applyIfChanged hands the wanted deadline to the connection through
// setOnConn if the connection lacks it.
func (d *deadline) applyIfChanged(setOnConn func(time.Time) error) error {
	if d.wanted.Load() == d.applied.Load() {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	w := d.wanted.Load() // again: an interrupt may have come meanwhile
	if err := setOnConn(fromUnixNano(w)); err != nil {
		return err
	}
	d.applied.Store(w)
	return nil
}

// farFuture bounds the deadlines that are rounded: Unix nanoseconds do not
// reach past 2262, and rounding up must not overflow.
var farFuture = time.Unix(0, math.MaxInt64/2)

// appliedAtOnce reports whether t goes to the connection now rather than
// before the next I/O: a deadline already past (an interrupt, perhaps for
// an I/O blocked in another goroutine) or one beyond farFuture.
func appliedAtOnce(t time.Time) bool {
	return !t.IsZero() && (!t.After(time.Now()) || t.After(farFuture))
}

// setApplied records t, about to be handed to the connection, as both
// wanted and applied. Its value only needs to differ from every rounded
// deadline and from 0 (none): a past t keeps its own (or -1 for the epoch),
// a far one is math.MaxInt64.
func (d *deadline) setApplied(t time.Time) {
	ns := int64(math.MaxInt64)
	if !t.After(farFuture) {
		if ns = t.UnixNano(); ns == 0 {
			ns = -1
		}
	}
	d.wanted.Store(ns)
	d.applied.Store(ns)
}

// roundUp returns t in Unix nanoseconds rounded up to a tick, 0 for none.
func roundUp(t time.Time, tick int64) int64 {
	if t.IsZero() {
		return 0
	}
	ns := t.UnixNano()
	return (ns + tick - 1) / tick * tick
}

// fromUnixNano is the inverse of roundUp: the zero time for 0.
func fromUnixNano(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// Listener wraps each accepted connection.
type Listener struct {
	net.Listener
	tick time.Duration
}

// NewListener returns ln whose connections have lazy deadlines.
func NewListener(ln net.Listener, tick time.Duration) *Listener {
	return &Listener{Listener: ln, tick: tick}
}

// Accept accepts and wraps a connection.
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return Wrap(c, l.tick), nil
}
