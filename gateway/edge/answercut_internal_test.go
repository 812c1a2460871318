package edge

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/testenv"
)

// clientConn is a client's connection as fasthttp's server sees it, played
// from a script: reads hands over the client's bytes, and the client
// leaves once the server has read a byte of the last of them. Every write
// from then on fails as a write to a reset connection does, and every read
// past the script fails with then. It is driven on the server's one
// goroutine (ServeConn), so a failed write is the one the script says,
// where a real client's reset races the server's reads. undated are the
// first lines of the writes made with no write deadline set.
type clientConn struct {
	reads         []string
	then          error
	left          bool
	written       bytes.Buffer
	writeDeadline time.Time
	undated       []string
}

func (c *clientConn) Read(p []byte) (int, error) {
	if len(c.reads) == 0 {
		return 0, c.then
	}
	c.left = c.left || len(c.reads) == 1
	n := copy(p, c.reads[0])
	if c.reads[0] = c.reads[0][n:]; c.reads[0] == "" {
		c.reads = c.reads[1:]
	}
	return n, nil
}

func (c *clientConn) Write(p []byte) (int, error) {
	if c.writeDeadline.IsZero() {
		line, _, _ := bytes.Cut(p, []byte("\r\n"))
		c.undated = append(c.undated, string(line))
	}
	if c.left {
		return 0, &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.ECONNRESET)}
	}
	return c.written.Write(p)
}

func (c *clientConn) Close() error { return nil }
func (c *clientConn) LocalAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080}
}
func (c *clientConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}
}
func (c *clientConn) SetDeadline(t time.Time) error      { return c.SetWriteDeadline(t) }
func (c *clientConn) SetReadDeadline(time.Time) error    { return nil }
func (c *clientConn) SetWriteDeadline(t time.Time) error { c.writeDeadline = t; return nil }

// serveScript serves a connection that plays reads, then then, as the
// listener's would be (answerConn), and returns it once served.
func serveScript(g *Gateway, then error, reads ...string) *clientConn {
	conn := &clientConn{reads: reads, then: then}
	_ = g.app.Server().ServeConn(&answerConn{Conn: conn, cut: g.cutAnswer})
	return conn
}

// startForScripts starts a gateway for serveScript: served once through
// its listener, as Fiber builds its routes when it starts serving
// (Listener), and ServeConn must not come before.
func startForScripts(t *testing.T) (*Gateway, *testenv.Output) {
	g, logs := startWithHook(t, nil, nil)
	get(t, "http://"+g.Addr()+"/v1/no-such-route", nil)
	return g, logs
}

// firstRequest is the request each script of afterAnAnswer starts with,
// answered 404 and taken whole.
const firstRequest = "GET /v1/no-such-route HTTP/1.1\r\nHost: gateway\r\n\r\n"

// overLimit is the head of a sale whose body is over BodyLimit, but for
// its empty line.
var overLimit = fmt.Sprintf("POST /v1/export/items/a/sales/confirm HTTP/1.1\r\nHost: gateway\r\nContent-Length: %d\r\n",
	BodyLimit+1)

// afterAnAnswer are second requests on a kept-alive connection after the
// answer to firstRequest, each answered by a different writer: the
// route's handler, fasthttp's error handler, ExpectHandler, fasthttp's
// 100 Continue.
var afterAnAnswer = []struct {
	name   string
	second string
	then   error  // the reads past it
	status int    // of the second answer's cut line; 0: none
	route  string // of that line
}{
	{"a 100 Continue", "POST /v1/no-such-route HTTP/1.1\r\nHost: gateway\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n",
		io.EOF, 0, ""},
	{"a HEAD", "HEAD /v1/no-such-route HTTP/1.1\r\nHost: gateway\r\n\r\n", io.EOF, 404, "unmatched"},
	{"a malformed head", "GET /v1/health HTTP/1.1\r\nHost: gateway\r\nBad Header\r\n\r\n", io.EOF, 400, "unrouted"},
	{"a head too large", "GET /v1/health HTTP/1.1\r\nHost: gateway\r\nX-Large: " + strings.Repeat("a", 9000) + "\r\n\r\n",
		io.EOF, 431, "unrouted"},
	{"a body over the limit", overLimit + "\r\n", io.EOF, 413, "POST /v1/export/items/{item_id}/sales/confirm"},
	{"a body over the limit with Expect", overLimit + "Expect: 100-continue\r\n\r\n", io.EOF, 413,
		"POST /v1/export/items/{item_id}/sales/confirm"},
	{"a head that stops coming", "GET /v1/health HTTP/1.1\r\nHo", timeoutErr, 408, "unrouted"},
	{"a client that left mid-head", "GET /v1/health HTTP/1.1\r\nHo", resetErr, 0, ""},
}

// Reads past the script: its deadline passed, its client reset it.
var (
	timeoutErr = &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	resetErr   = &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
)

// cutLineOf is what the blame test reads of an "answer cut short" line.
type cutLineOf struct {
	RequestID string `json:"request_id"`
	Route     string `json:"route"`
	Status    int    `json:"status"`
	Bytes     int64  `json:"answer_bytes_sent"`
}

// cutLinesIn reads the "answer cut short" lines among logs.
func cutLinesIn(t *testing.T, logs string) []cutLineOf {
	t.Helper()
	var cut []cutLineOf
	for l := range strings.SplitSeq(logs, "\n") {
		if !strings.Contains(l, `"msg":"answer cut short"`) {
			continue
		}
		var line cutLineOf
		if err := json.Unmarshal([]byte(l), &line); err != nil {
			t.Fatalf("%v: %s", err, l)
		}
		cut = append(cut, line)
	}
	return cut
}

// On a kept-alive connection, what the gateway writes after an answer its
// client took whole is noted before it is written, whoever writes it: a
// failed write is never blamed on the earlier answer (its request id, its
// bytes). fasthttp writes its own refusals (a head it cannot read, too
// large, too slow; a body over the limit) through the error handler, which
// notes them as every answer is (end); a 100 Continue is noted as no
// answer (noteContinue: without it, its failed write was logged under the
// first request's id, status 404); a 499, to a client that left, is not
// noted. The client here leaves once it has sent its second request.
func TestAWriteAfterAnAnswerTakenWholeIsNotBlamedOnIt(t *testing.T) {
	g, logs := startForScripts(t)
	for _, tc := range afterAnAnswer {
		before := len(logs.String())
		conn := serveScript(g, tc.then, firstRequest, tc.second)
		resp, err := http.ReadResponse(bufio.NewReader(&conn.written), nil)
		if err != nil || resp.StatusCode != http.StatusNotFound {
			t.Fatalf("%s: the first answer: %v, %v", tc.name, resp, err)
		}
		firstID := resp.Header.Get("X-Request-Id")
		cut := cutLinesIn(t, logs.String()[before:])
		switch {
		case tc.status == 0 && len(cut) != 0:
			t.Errorf("%s: cut lines %+v, want none (the first answer's request id %s)", tc.name, cut, firstID)
		case tc.status != 0 && (len(cut) != 1 || cut[0].RequestID == firstID || cut[0].Status != tc.status ||
			cut[0].Route != tc.route || cut[0].Bytes != 0):
			t.Errorf("%s: cut lines %+v, want one of the second answer (not %s, the first's): %d, %s, 0 bytes sent",
				tc.name, cut, firstID, tc.status, tc.route)
		}
	}
}

// A failed write is write_timeout only when GATEWAY_WRITE_TIMEOUT passed
// (the deadline's own error). The kernel giving up on a client that
// stopped answering (ETIMEDOUT, once its retransmissions went unanswered
// for about 15 minutes: reached with GATEWAY_WRITE_TIMEOUT set longer) is
// a Timeout() error too, and was counted as the write timeout, which was
// not set to pass yet: it is a client gone, as a reset is.
func TestAnAnswerIsCutByTheWriteTimeoutOnlyWhenItPassed(t *testing.T) {
	writeErr := func(err error) error { return &net.OpError{Op: "write", Net: "tcp", Err: err} }
	for _, tc := range []struct {
		err  error
		want cutCause
	}{
		{writeErr(os.NewSyscallError("write", syscall.EPIPE)), cutClientLeft},
		{writeErr(os.NewSyscallError("write", syscall.ECONNRESET)), cutClientLeft},
		{writeErr(os.NewSyscallError("write", syscall.ETIMEDOUT)), cutClientLeft},
		{writeErr(os.ErrDeadlineExceeded), cutWriteTimeout},
		{writeErr(net.ErrClosed), cutOther},
	} {
		if got := causeOf(tc.err); got != tc.want {
			t.Errorf("causeOf(%v) = %s, want %s", tc.err, cutCauses[got], cutCauses[tc.want])
		}
	}
}

// Every write to a client has a write deadline: each answer's is set as it
// is noted (noteAnswer), and fasthttp clears it once the answer is
// written, so what the gateway does not note had none. A 100 Continue and
// the 499 to a client that left mid-request were written so: to a client
// that reads nothing (its window closed, the socket's buffer full) such a
// write could block, holding the connection and its goroutine for as long
// as the client kept it open. (fasthttp alone left the last answer's
// deadline on the connection for them, passed or not.)
func TestEveryWriteToAClientHasADeadline(t *testing.T) {
	g, _ := startForScripts(t)
	for _, tc := range afterAnAnswer {
		if conn := serveScript(g, tc.then, firstRequest, tc.second); len(conn.undated) != 0 {
			t.Errorf("%s: written without a write deadline: %q", tc.name, conn.undated)
		}
	}
	// The 100 Continue to a client that stays, and the answer after it.
	conn := serveScript(g, io.EOF, "POST /v1/no-such-route HTTP/1.1\r\nHost: gateway\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n",
		"{}", firstRequest)
	if len(conn.undated) != 0 || !strings.HasPrefix(conn.written.String(), "HTTP/1.1 100 Continue") {
		t.Errorf("a 100 Continue first: written without a write deadline: %q (written %q)", conn.undated, conn.written.String())
	}
}
