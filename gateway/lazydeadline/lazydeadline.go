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
	tick int64 // nanoseconds
	// Deadlines as Unix nanoseconds rounded up to a tick, 0 for none:
	// wanted is what was asked for, applied what the connection holds.
	readWanted, readApplied   atomic.Int64
	writeWanted, writeApplied atomic.Int64
}

// Wrap returns c with lazy deadlines rounded up to tick.
func Wrap(c net.Conn, tick time.Duration) *Conn {
	return &Conn{Conn: c, tick: max(int64(tick), 1)}
}

// Read applies the read deadline if it changed, then reads.
func (c *Conn) Read(p []byte) (int, error) {
	if w := c.readWanted.Load(); w != c.readApplied.Load() {
		if err := c.Conn.SetReadDeadline(fromUnixNano(w)); err != nil {
			return 0, err
		}
		c.readApplied.Store(w)
	}
	return c.Conn.Read(p)
}

// Write applies the write deadline if it changed, then writes.
func (c *Conn) Write(p []byte) (int, error) {
	if w := c.writeWanted.Load(); w != c.writeApplied.Load() {
		if err := c.Conn.SetWriteDeadline(fromUnixNano(w)); err != nil {
			return 0, err
		}
		c.writeApplied.Store(w)
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
	if isPast(t) {
		c.readWanted.Store(pastUnixNano(t))
		c.readApplied.Store(pastUnixNano(t))
		return c.Conn.SetReadDeadline(t)
	}
	c.readWanted.Store(c.roundUp(t))
	return nil
}

// SetWriteDeadline records t for the next Write, as SetReadDeadline does.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if isPast(t) {
		c.writeWanted.Store(pastUnixNano(t))
		c.writeApplied.Store(pastUnixNano(t))
		return c.Conn.SetWriteDeadline(t)
	}
	c.writeWanted.Store(c.roundUp(t))
	return nil
}

// isPast reports whether t is a deadline that has already passed.
func isPast(t time.Time) bool { return !t.IsZero() && !t.After(time.Now()) }

// pastUnixNano is past deadline t in Unix nanoseconds, never 0 (which
// stands for no deadline): time.Unix(0, 0) is a past deadline too.
func pastUnixNano(t time.Time) int64 {
	if ns := t.UnixNano(); ns != 0 {
		return ns
	}
	return -1
}

// roundUp returns t in Unix nanoseconds rounded up to a tick, 0 for none.
func (c *Conn) roundUp(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	ns := t.UnixNano()
	return (ns + c.tick - 1) / c.tick * c.tick
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
