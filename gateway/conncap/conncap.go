// Package conncap bounds how many connections a server holds open at
// once. fasthttp accepts any number, up to the process's file limit, and
// each one, idle or not, holds a goroutine and its buffers: a flood of
// connections (or a client library with a huge pool) grows the process
// until it is killed for its memory, with every client's requests in
// flight. Past the bound a new connection is never handed to the server:
// Refuse gets it instead, to answer and close it.
//
// A connection counts from its Accept to its first Close, whoever calls
// it (the server after an answer with Connection: close, an idle or read
// timeout, a client that left, the drain at shutdown): Close frees its
// place exactly once.
package conncap

import (
	"net"
	"sync/atomic"
)

// Listener hands out at most max connections open at once.
type Listener struct {
	net.Listener
	max    int64
	refuse func(net.Conn)
	open   atomic.Int64
}

// NewListener wraps ln. A connection accepted while max are open is given
// to refuse, on the accepting goroutine: refuse must not block on its
// client, and must close it.
func NewListener(ln net.Listener, max int, refuse func(net.Conn)) *Listener {
	return &Listener{Listener: ln, max: int64(max), refuse: refuse}
}

// Open is how many connections are open now.
func (l *Listener) Open() int64 { return l.open.Load() }

// Accept returns the next connection there is room for, refusing the
// others meanwhile.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.takePlace() {
			return &conn{Conn: c, l: l}, nil
		}
		l.refuse(c)
	}
}

// takePlace counts one more connection open if there is room. The count
// never passes max, even for an instant: Open is exported as a gauge that
// the alerts read against max.
func (l *Listener) takePlace() bool {
	for {
		n := l.open.Load()
		if n >= l.max {
			return false
		}
		if l.open.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// conn is a counted connection.
type conn struct {
	net.Conn
	l      *Listener
	closed atomic.Bool
}

// Close frees the connection's place the first time it is called.
func (c *conn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.l.open.Add(-1)
	}
	return c.Conn.Close()
}

// WriteBuffers writes bufs to the connection, in one writev where it can:
// net.Buffers writes one piece at a time to any writer but net's own
// types, and a conn, which hides its connection's methods, is not one.
func (c *conn) WriteBuffers(bufs *net.Buffers) (int64, error) {
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
