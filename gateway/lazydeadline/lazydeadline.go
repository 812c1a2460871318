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
	"net"
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
// connection holds.
type deadline struct{ wanted, applied atomic.Int64 }

// Wrap returns c with lazy deadlines rounded up to tick.
func Wrap(c net.Conn, tick time.Duration) *Conn {
	return &Conn{Conn: c, tick: max(int64(tick), 1)}
}

// Read applies the read deadline if it changed, then reads.
func (c *Conn) Read(p []byte) (int, error) {
	if w, changed := c.read.due(); changed {
		if err := c.Conn.SetReadDeadline(fromUnixNano(w)); err != nil {
			return 0, err
		}
		c.read.applied.Store(w)
	}
	return c.Conn.Read(p)
}

// Write applies the write deadline if it changed, then writes.
func (c *Conn) Write(p []byte) (int, error) {
	if w, changed := c.write.due(); changed {
		if err := c.Conn.SetWriteDeadline(fromUnixNano(w)); err != nil {
			return 0, err
		}
		c.write.applied.Store(w)
	}
	return c.Conn.Write(p)
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
	if c.read.ask(t, c.tick) {
		return c.Conn.SetReadDeadline(t)
	}
	return nil
}

// SetWriteDeadline records t for the next Write, as SetReadDeadline does.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if c.write.ask(t, c.tick) {
		return c.Conn.SetWriteDeadline(t)
	}
	return nil
}

// ask records t and reports whether it is already past, and so must be
// handed to the connection at once (recorded as applied).
func (d *deadline) ask(t time.Time, tick int64) (now bool) {
	if !t.IsZero() && !t.After(time.Now()) {
		ns := t.UnixNano()
		if ns == 0 { // 0 stands for no deadline; time.Unix(0, 0) is a past one
			ns = -1
		}
		d.wanted.Store(ns)
		d.applied.Store(ns)
		return true
	}
	d.wanted.Store(roundUp(t, tick))
	return false
}

// due returns the wanted deadline and whether the connection lacks it.
func (d *deadline) due() (int64, bool) {
	w := d.wanted.Load()
	return w, w != d.applied.Load()
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
