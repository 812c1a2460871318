package edge

import (
	"net"
	"sync"
)

// Relaying a held page (relayedStream) through fasthttp's write buffer
// writes the answer's head and the page's first bytes when the buffer is
// full, then the rest of the page apart, right after: two syscalls (slow
// on a VM) and a client woken twice, where one writev of both is one of
// each. The gateway's page tells its connection to hold the first write
// (holdNextWrite), which the next sends along (writeAfterHeld), and to
// send what it still holds once the page is written (sendHeld), so that
// nothing is held past the page.

// maxHeldWrite is the largest write held: fasthttp's write buffer, which
// such a write flushes whole.
const maxHeldWrite = clientWriteBufferSize

// heldWrites pools the buffers of held writes: held only while a page is
// written, they are none of an idle connection's memory.
var heldWrites = sync.Pool{New: func() any { b := make([]byte, 0, maxHeldWrite); return &b }}

// holdNextWrite has the next write, if of at most maxHeldWrite bytes, held
// to leave with the one after it. The caller calls sendHeld once it is
// done writing.
func (c *answerConn) holdNextWrite() { c.hold = true }

// writeAfterHeld sends what is held and p in one writev. It reports p's
// bytes the socket took: the held ones were reported written already.
func (c *answerConn) writeAfterHeld(p []byte) (int, error) {
	held := c.held
	c.held = nil
	heldLen := int64(len(*held))
	c.vec = [2][]byte{*held, p}
	c.bufs = c.vec[:]
	n, err := writeBuffers(c.Conn, &c.bufs)
	c.vec, c.bufs = [2][]byte{}, nil // neither the page nor a pooled buffer stays referred to
	heldWrites.Put(held)
	c.took(n, err)
	return int(max(n-heldLen, 0)), err
}

// writeBuffers writes bufs to conn in one writev where conn can (the
// gateway's connection wrappers pass it on to the socket), one piece at a
// time otherwise.
func writeBuffers(conn net.Conn, bufs *net.Buffers) (int64, error) {
	type buffersWriter interface {
		WriteBuffers(bufs *net.Buffers) (int64, error)
	}
	if bw, ok := conn.(buffersWriter); ok {
		return bw.WriteBuffers(bufs)
	}
	return bufs.WriteTo(conn)
}

// sendHeld stops holding, and sends what is held if the write that was to
// take it along never came.
func (c *answerConn) sendHeld() error {
	c.hold = false
	if c.held == nil {
		return nil
	}
	held := c.held
	c.held = nil
	n, err := c.Conn.Write(*held)
	heldWrites.Put(held)
	c.took(int64(n), err)
	return err
}

// Close sends what is held first: a held write was reported written.
// With nothing held it only reads the connection's state: fasthttp's
// Shutdown closes an idle connection from its own goroutine, and the
// connection's goroutine may close it too.
func (c *answerConn) Close() error {
	if c.held != nil {
		_ = c.sendHeld() // a failure is the answer's cut, reported
	}
	return c.Conn.Close()
}
