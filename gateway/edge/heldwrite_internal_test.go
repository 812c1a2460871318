package edge

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/testenv"
)

// socketConn is a client's connection as the gateway's socket would see
// it: it plays reads, then io.EOF, and records each write the socket
// would make (ops: "write" for a Write, "writev" for a WriteBuffers, with
// its bytes). Past takes bytes (when positive) the client has left: the
// write that passes it takes only what fits and fails as a write to a
// reset connection does, and every later one too.
type socketConn struct {
	reads   *strings.Reader
	takes   int
	written bytes.Buffer
	ops     []string
	closed  bool
}

func newSocketConn(script string) *socketConn {
	return &socketConn{reads: strings.NewReader(script)}
}

func (c *socketConn) Read(p []byte) (int, error) { return c.reads.Read(p) }

func (c *socketConn) Write(p []byte) (int, error) {
	c.ops = append(c.ops, fmt.Sprintf("write %d", len(p)))
	return c.take(p)
}

func (c *socketConn) WriteBuffers(bufs *net.Buffers) (int64, error) {
	var all []byte
	for _, b := range *bufs {
		all = append(all, b...)
	}
	*bufs = nil
	c.ops = append(c.ops, fmt.Sprintf("writev %d", len(all)))
	n, err := c.take(all)
	return int64(n), err
}

// take keeps what the client takes of p.
func (c *socketConn) take(p []byte) (int, error) {
	if c.takes > 0 && c.written.Len()+len(p) > c.takes {
		n, _ := c.written.Write(p[:c.takes-c.written.Len()])
		return n, &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("writev", syscall.ECONNRESET)}
	}
	return c.written.Write(p)
}

func (c *socketConn) Close() error { c.closed = true; return nil }
func (c *socketConn) LocalAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080}
}
func (c *socketConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}
}
func (c *socketConn) SetDeadline(time.Time) error      { return nil }
func (c *socketConn) SetReadDeadline(time.Time) error  { return nil }
func (c *socketConn) SetWriteDeadline(time.Time) error { return nil }

// pageOf is the page the upstream of startForPages answers with size
// bytes: no byte repeats within 10 of them, so that bytes reordered or
// lost do not go unseen.
func pageOf(size int) []byte {
	page := make([]byte, size)
	for i := range page {
		page[i] = "0123456789"[i%10] + byte(i/10%7)
	}
	return page
}

// startForPages starts a gateway for socketConn scripts whose export-reader
// answers a list page of the size its cursor asks for, with its length,
// or without one (read whole by the gateway) when asked "nolength".
func startForPages(t *testing.T) (*Gateway, string, *testenv.Output) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		size, _ := strconv.Atoi(r.URL.Query().Get("cursor"))
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("nolength") == "" {
			w.Header().Set("Content-Length", strconv.Itoa(size))
		}
		page := pageOf(size)
		_, _ = w.Write(page[:size/2])
		w.(http.Flusher).Flush() // chunked, without a length
		_, _ = w.Write(page[size/2:])
	}))
	t.Cleanup(upstream.Close)
	g, _, logs := startInternal(t, map[string]string{"EXPORT_READER_URLS": upstream.URL}, fakeKeys{})
	get(t, "http://"+g.Addr()+"/v1/no-such-route", nil) // Fiber builds its routes as it starts serving
	return g, wellFormedKey(t), logs
}

// pageRequest asks for a list page of size bytes.
func pageRequest(key string, size int, withLength bool) string {
	query := fmt.Sprintf("cursor=%d", size)
	if !withLength {
		query += "&nolength=1"
	}
	return fmt.Sprintf("GET /v1/export/items?%s HTTP/1.1\r\nHost: gateway\r\nX-API-Key: %s\r\n\r\n", query, key)
}

// serveSocket serves conn as the gateway's listener would (answerConn).
func serveSocket(g *Gateway, conn *socketConn) {
	_ = g.app.Server().ServeConn(&answerConn{Conn: conn, cut: g.cutAnswer})
}

// readPages reads n answers from written and checks that each is a 200
// whose body is the page of its size, with nothing after the last.
func readPages(t *testing.T, written []byte, sizes ...int) {
	t.Helper()
	r := bufio.NewReader(bytes.NewReader(written))
	for _, size := range sizes {
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatalf("the answer of a %d-byte page: %v", size, err)
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK || resp.ContentLength != int64(size) || !bytes.Equal(body, pageOf(size)) {
			t.Fatalf("a %d-byte page = %d, length %d, %d bytes read (%v), the page's bytes: %v",
				size, resp.StatusCode, resp.ContentLength, len(body), err, bytes.Equal(body, pageOf(size)))
		}
	}
	if rest, _ := io.ReadAll(r); len(rest) != 0 {
		t.Fatalf("%d bytes written after the answers", len(rest))
	}
}

// A page held whole leaves the gateway as its answer's head and body in
// one writev: through fasthttp's write buffer, the buffer's flush and the
// rest of the page were two writes, two syscalls and a client woken
// twice. Its bytes are those of the page, whatever its size around the
// thresholds: two write buffers (a page smaller is not held), a small
// answer (read into the client's answer, not held), a page and 1 MiB.
func TestAHeldPageLeavesInOneWritev(t *testing.T) {
	g, key, _ := startForPages(t)
	for _, tc := range []struct {
		size       int
		withLength bool
		oneWritev  bool
	}{
		{2*clientWriteBufferSize - 1, false, false},
		{2 * clientWriteBufferSize, false, true},
		{2*clientWriteBufferSize + 1, false, true},
		{smallAnswerBytes, true, false},
		{smallAnswerBytes + 1, true, true},
		{smallAnswerBytes + 1, false, true},
		{100 << 10, true, true},
		{1 << 20, true, true},
		{1 << 20, false, true},
	} {
		conn := newSocketConn(pageRequest(key, tc.size, tc.withLength))
		serveSocket(g, conn)
		readPages(t, conn.written.Bytes(), tc.size)
		if tc.oneWritev && (len(conn.ops) != 1 || !strings.HasPrefix(conn.ops[0], "writev ")) {
			t.Errorf("a %d-byte page (with its length: %v) left in %q, want one writev", tc.size, tc.withLength, conn.ops)
		}
	}
}

// Pipelined pages are answered in their order, each in one writev.
func TestPipelinedHeldPagesKeepTheirOrder(t *testing.T) {
	g, key, _ := startForPages(t)
	sizes := []int{100 << 10, 2*clientWriteBufferSize + 7, 300 << 10}
	var script strings.Builder
	for _, size := range sizes {
		script.WriteString(pageRequest(key, size, size%2 == 0))
	}
	conn := newSocketConn(script.String())
	serveSocket(g, conn)
	readPages(t, conn.written.Bytes(), sizes...)
	if len(conn.ops) != len(sizes) {
		t.Errorf("3 pipelined pages left in %q, want a writev each", conn.ops)
	}
}

// A client that leaves while a held page is written has its answer cut
// logged with the bytes the socket took, no more: the write held was
// reported written to fasthttp, but counts only once it left with the
// next, in the writev that failed part way.
func TestAHeldPageCutShortCountsOnlyWhatTheSocketTook(t *testing.T) {
	g, key, logs := startForPages(t)
	for _, takes := range []int{100, clientWriteBufferSize + 1000, 50 << 10} {
		conn := newSocketConn(pageRequest(key, 100<<10, true))
		conn.takes = takes
		before := len(logs.String())
		serveSocket(g, conn)
		cut := cutLinesIn(t, logs.String()[before:])
		if len(cut) != 1 || cut[0].Bytes != int64(takes) || cut[0].Status != http.StatusOK || conn.written.Len() != takes {
			t.Errorf("a client that took %d bytes of a held page: cut lines %+v, %d bytes written, want one of 200 with %[1]d bytes sent",
				takes, cut, conn.written.Len())
		}
	}
}

// A held write is sent before its connection closes, however it closes:
// it was reported written.
func TestAHeldWriteIsSentBeforeTheConnectionCloses(t *testing.T) {
	conn := newSocketConn("")
	ac := &answerConn{Conn: conn}
	ac.holdNextWrite()
	if n, err := ac.Write([]byte("held")); n != 4 || err != nil {
		t.Fatalf("a held write = %d, %v, want 4, nil", n, err)
	}
	if conn.written.Len() != 0 {
		t.Fatalf("a held write was written at once: %q", conn.ops)
	}
	if err := ac.Close(); err != nil {
		t.Fatal(err)
	}
	if conn.written.String() != "held" || !conn.closed || ac.sent != 4 {
		t.Errorf("closed holding a write: written %q, closed %v, %d bytes sent; want held, true, 4", conn.written.String(), conn.closed, ac.sent)
	}
}
