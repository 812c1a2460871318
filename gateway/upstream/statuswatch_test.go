package upstream

import (
	"bufio"
	"errors"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/coinexport/export/pkg/testenv"
	"github.com/valyala/fasthttp"
)

// chunkedConn hands out its answer chunk bytes per read at most, then
// io.EOF; writes go nowhere.
type chunkedConn struct {
	net.Conn
	answer []byte
	chunk  int
}

func (c *chunkedConn) Read(p []byte) (int, error) {
	if len(c.answer) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), c.chunk)], c.answer)
	c.answer = c.answer[n:]
	return n, nil
}

func (c *chunkedConn) Write(p []byte) (int, error) { return len(p), nil }

// readThrough reads answer as fasthttp's client does (past interim
// answers), from a watched connection that hands it out chunk bytes at a
// time, once a request was written.
func readThrough(answer string, chunk int) (*fasthttp.Response, error) {
	conn := watch(&chunkedConn{answer: []byte(answer), chunk: chunk})
	if _, err := conn.Write([]byte("GET / HTTP/1.1\r\n\r\n")); err != nil {
		return nil, err
	}
	resp := &fasthttp.Response{}
	return resp, resp.Read(bufio.NewReader(conn))
}

// An answer with 101 Switching Protocols, or a status outside 100-599
// ("000", which fasthttp reads as 200), also after interim answers, is a
// failure to read its head, however its bytes are split between reads:
// never a connection closed before any byte (fasthttp's io.EOF, which
// upstream.Do sends a GET again after), never an answer taken. Other
// answers are read as fasthttp reads them without the watch.
func TestWatchedConnRefusesTheAnswersFasthttpWouldKeepItsConnectionAfter(t *testing.T) {
	refused := []string{
		"HTTP/1.1 101 Switching Protocols\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
		"HTTP/1.1 000 X\r\nContent-Length: 2\r\n\r\n{}",
		"HTTP/1.1 000\r\nContent-Length: 2\r\n\r\n{}",
		"HTTP/1.1 001 X\r\nContent-Length: 2\r\n\r\n{}",
		"HTTP/1.1 099 X\r\n\r\n",
		"HTTP/1.1 600 X\r\nContent-Length: 2\r\n\r\n{}",
		"HTTP/1.1 999 X\r\nContent-Length: 2\r\n\r\n{}",
		"HTTP/1.0 101 X\r\n\r\n",
		"\r\n\r\nHTTP/1.1 101 X\r\n\r\n", // blank lines first, which fasthttp skips
		"HTTP/1.1   101\r\n\r\n",         // spaces, which it skips too
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 101 Switching Protocols\r\n\r\n",
		"HTTP/1.1 100 Continue\n\nHTTP/1.1 101 Switching Protocols\n\n",
		"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 000 X\r\nContent-Length: 0\r\n\r\n",
	}
	taken := []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
		"HTTP/1.1 204 No Content\r\n\r\n",
		"HTTP/1.1 304 Not Modified\r\n\r\n",
		"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}",
		"HTTP/1.1 599 X\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n",
		"\r\nHTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.0 200 OK\r\n\r\n{}",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
		"HTTP/1.1 103 Early Hints\r\nLink: </101>\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
	}
	for _, answer := range refused {
		for chunk := 1; chunk <= len(answer); chunk++ {
			resp, err := readThrough(answer, chunk)
			if !errors.As(err, new(refusedStatusError)) || errors.Is(err, io.EOF) {
				t.Fatalf("%q in reads of %d bytes: read %d (%v), want the answer refused", answer, chunk, resp.StatusCode(), err)
			}
		}
	}
	for _, answer := range taken {
		want := &fasthttp.Response{}
		if err := want.Read(bufio.NewReader(strings.NewReader(answer))); err != nil {
			t.Fatalf("%q unwatched: %v", answer, err)
		}
		for chunk := 1; chunk <= len(answer); chunk++ {
			resp, err := readThrough(answer, chunk)
			if err != nil || resp.StatusCode() != want.StatusCode() || string(resp.Body()) != string(want.Body()) {
				t.Fatalf("%q in reads of %d bytes: %d %q (%v), want %d %q as unwatched",
					answer, chunk, resp.StatusCode(), resp.Body(), err, want.StatusCode(), want.Body())
			}
		}
	}
}

// The watch reads the status of each answer, not only the first one's on
// the connection: a request written starts it again.
func TestWatchedConnWatchesEachAnswer(t *testing.T) {
	inner := &chunkedConn{chunk: 4096}
	conn := watch(inner)
	for i, answer := range []string{"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", "HTTP/1.1 101 X\r\n\r\n"} {
		inner.answer = []byte(answer)
		if _, err := conn.Write([]byte("GET / HTTP/1.1\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		err := (&fasthttp.Response{}).Read(bufio.NewReader(conn))
		if refused := errors.As(err, new(refusedStatusError)); refused != (i == 1) {
			t.Errorf("answer %d, %q: %v", i+1, answer, err)
		}
	}
}

// An instance's plain connections are watched; its TLS ones are not:
// fasthttp puts TLS over the connection Dial returns, and under it the
// watch would read ciphertext, where a space then three digits would pass
// for a status (one to refuse about once in 70,000 answers: a space before
// a line feed, 1/2, three digits, (10/256)^3, half of the codes refused).
func TestOnlyPlainConnectionsAreWatched(t *testing.T) {
	addr := testenv.ServeConns(t, func(conn net.Conn) { _, _ = io.Copy(io.Discard, conn) })
	for _, scheme := range []string{"http", "https"} {
		p, err := ParseInstanceURL(scheme + "://" + addr)
		if err != nil {
			t.Fatal(err)
		}
		inst := newInstance(p, opts())
		conn, err := inst.client.Dial(inst.client.Addr)
		if err != nil {
			t.Fatal(err)
		}
		conn.Close()
		if _, watched := conn.(*watchedConn); watched != (scheme == "http") {
			t.Errorf("%s: a connection watched: %v, want %v", scheme, watched, scheme == "http")
		}
	}
}
