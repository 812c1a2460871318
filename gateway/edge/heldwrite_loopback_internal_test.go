package edge

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// dialSmallWindow connects to addr with a receive buffer of 4 KiB, set
// before the handshake so that the window it announces is small too: a
// slow client's, which an answer larger than the sockets' buffers waits
// for.
func dialSmallWindow(t *testing.T, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var err error
		if cerr := rc.Control(func(fd uintptr) {
			err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		}); cerr != nil {
			return cerr
		}
		return err
	}}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// smallReads reads at most 1000 bytes at a time: a client that reads
// slowly, however much has arrived.
type smallReads struct{ r io.Reader }

func (s smallReads) Read(p []byte) (int, error) { return s.r.Read(p[:min(len(p), 1000)]) }

// Held pages reach a client that reads slowly over a real loopback
// connection whole and in their order, each answer's head and body
// together: pages pipelined in one TCP write with a small answer and a
// HEAD for a page after them (its length, no body), and last a page to a
// client of HTTP/1.0, after which the gateway closes. The first page, 8
// MiB, is more than the two sockets' buffers hold: its writev takes it in
// parts, waiting for the client to read between them (strace: a first
// writev of 2.8 MB, then EAGAIN and ~1 MB at a time), which
// TestAHeldPageLeavesInOneWritev's connection never does. Sending the
// held bytes after the page's, or without them, or one of them again,
// fails it.
func TestHeldPagesReachASlowClientWholeAndInOrder(t *testing.T) {
	g, key, _ := startForPages(t)
	conn := dialSmallWindow(t, g.Addr())
	type asked struct {
		request string
		method  string
		size    int
	}
	head := strings.Replace(pageRequest(key, 100<<10, true), "GET ", "HEAD ", 1)
	http10 := strings.Replace(pageRequest(key, 100<<10, true), "HTTP/1.1", "HTTP/1.0", 1)
	requests := []asked{
		{pageRequest(key, 8<<20, true), "GET", 8 << 20},
		{pageRequest(key, 2*clientWriteBufferSize+1, false), "GET", 2*clientWriteBufferSize + 1},
		{pageRequest(key, 100<<10, true), "GET", 100 << 10},
		{pageRequest(key, 100, true), "GET", 100},
		{head, "HEAD", 100 << 10},
		{pageRequest(key, smallAnswerBytes+1, true), "GET", smallAnswerBytes + 1},
		{http10, "GET", 100 << 10},
	}
	var script strings.Builder
	for _, rq := range requests {
		script.WriteString(rq.request)
	}
	if _, err := io.WriteString(conn, script.String()); err != nil { // one write: pipelined
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(time.Minute)) // a gateway that stops writing fails the test, not hangs it
	r := bufio.NewReader(smallReads{conn})
	for i, rq := range requests {
		resp, err := http.ReadResponse(r, &http.Request{Method: rq.method})
		if err != nil {
			t.Fatalf("answer %d (%s of a %d-byte page): %.200v", i, rq.method, rq.size, err)
		}
		body, err := io.ReadAll(resp.Body)
		want := pageOf(rq.size)
		if rq.method == "HEAD" {
			want = nil
		}
		if err != nil || resp.StatusCode != http.StatusOK || resp.ContentLength != int64(rq.size) || !bytes.Equal(body, want) {
			t.Fatalf("answer %d (%s of a %d-byte page) = %d, length %d, %d bytes read (%v), the page's bytes: %v",
				i, rq.method, rq.size, resp.StatusCode, resp.ContentLength, len(body), err, bytes.Equal(body, want))
		}
	}
	if rest, err := io.ReadAll(r); len(rest) != 0 || err != nil {
		t.Errorf("after the HTTP/1.0 answer: %d more bytes, %v; want the connection closed", len(rest), err)
	}
	if held := g.heldAnswers.bytesHeld(); held != 0 {
		t.Errorf("%d bytes held once every page was read, want 0", held)
	}
}
