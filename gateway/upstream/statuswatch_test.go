package upstream

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coinexport/export/gateway/lazydeadline"
	"github.com/coinexport/export/pkg/rawio"
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
// Requests' connections set their deadlines lazily; the probe's are the
// connections dialled, bare; both speak TLS exactly to an https instance.
func TestEachClientOfAnInstanceDialsItsOwnConnections(t *testing.T) {
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
		if w, ok := conn.(*watchedConn); ok {
			conn = w.Conn
		}
		if _, lazy := conn.(*lazydeadline.Conn); !lazy {
			t.Errorf("%s: a request's connection is a %T, want its deadlines set lazily", scheme, conn)
		}
		// The probe's short timeouts are kept exact, and its answers are
		// read by itself: its connection is the socket dialled, bare but
		// for its reads and writes made raw (rawio), deadlines its own.
		probed, err := inst.probe.Dial(inst.probe.Addr)
		if err != nil {
			t.Fatal(err)
		}
		probed.Close()
		if raw, ok := probed.(*rawio.Conn); !ok {
			t.Errorf("%s: the probe's connection is a %T, want the socket dialled, read raw", scheme, probed)
		} else if _, bare := raw.Conn.(*net.TCPConn); !bare {
			t.Errorf("%s: the probe's socket is a %T, want the one dialled", scheme, raw.Conn)
		}
		if inst.client.IsTLS != (scheme == "https") || inst.probe.IsTLS != (scheme == "https") {
			t.Errorf("%s: TLS for requests %v, for the probe %v; want both %v", scheme, inst.client.IsTLS, inst.probe.IsTLS, scheme == "https")
		}
	}
}

// The watch reads each answer's status line as fasthttp's client reads it,
// whatever the answer's shape: over answers built from blank lines before
// it, interim answers, protocols, spacing, statuses (three digits and
// not), status messages, line ends, and bodies holding status lines, in
// reads of sizes that split the status line at every place, an answer
// fasthttp reads with a status to refuse is refused, one it reads with
// another is taken as it reads it, and one it cannot read is not taken.
// The watch parses the bytes itself: this holds it to fasthttp's parser,
// also across fasthttp upgrades.
func TestWatchedConnReadsStatusLinesAsFasthttpDoes(t *testing.T) {
	refusedStatuses := map[string]bool{"000": true, "099": true, "101": true, "600": true, "999": true}
	statuses := []string{"000", "099", "100", "101", "103", "200", "204", "304", "599", "600", "999", "1010", "20", "2x0", "0200"}
	var answers []string
	for _, lead := range []string{"", "\r\n", "\n\n", " \r\n"} {
		for _, interim := range []string{"", "HTTP/1.1 100 Continue\r\n\r\n", "HTTP/1.1 103 E\r\nLink: <HTTP/1.1 101>\r\n\r\n", "HTTP/1.1 100 C\n\n"} {
			for _, proto := range []string{"HTTP/1.1 ", "HTTP/1.0   ", "HTTP/2.0 ", "HTP/1.1 ", "HTTP/1.1\t"} {
				for _, status := range statuses {
					for _, rest := range []string{
						"\r\nContent-Length: 0\r\n\r\n",
						" OK\nContent-Length: 0\n\n",
						" 101\r\r\nContent-Length: 0\r\n\r\n",
						" OK\r\nContent-Length: 17\r\n\r\nHTTP/1.1 101 X\r\n\r\n",
						" OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n 101 \r\n0\r\n\r\n",
					} {
						answers = append(answers, lead+interim+proto+status+rest)
					}
				}
			}
		}
	}
	for _, answer := range answers {
		for _, chunk := range []int{1, 2, 3, 9, 10, 11, 12, 13, 4096} {
			want := &fasthttp.Response{}
			wantErr := want.Read(bufio.NewReader(&chunkedConn{answer: []byte(answer), chunk: chunk}))
			got, err := readThrough(answer, chunk)
			refused := errors.As(err, new(refusedStatusError))
			switch final := finalStatus(answer); {
			case wantErr != nil:
				if err == nil {
					t.Fatalf("%q in reads of %d: taken %d, fasthttp cannot read it (%v)", answer, chunk, got.StatusCode(), wantErr)
				}
			case refusedStatuses[final] || want.StatusCode() == fasthttp.StatusSwitchingProtocols:
				if !refused {
					t.Fatalf("%q in reads of %d: %d (%v), want it refused (its status %s, fasthttp reads %d)", answer, chunk, got.StatusCode(), err, final, want.StatusCode())
				}
			case err != nil || got.StatusCode() != want.StatusCode() || string(got.Body()) != string(want.Body()):
				t.Fatalf("%q in reads of %d: %d %q (%v), want %d %q as fasthttp reads it",
					answer, chunk, got.StatusCode(), got.Body(), err, want.StatusCode(), want.Body())
			}
		}
	}
}

// finalStatus is the status of the last status line in the head of
// answer, one TestWatchedConnReadsStatusLinesAsFasthttpDoes built: the
// token after the protocol, before the line that says a body follows
// (after an interim status, what follows that line is read as the final
// answer: the test also reads fasthttp's status).
func finalStatus(answer string) string {
	var status string
	for _, line := range strings.Split(answer, "\n") {
		if strings.HasPrefix(line, "Content-Length: 17") || strings.HasPrefix(line, "Transfer-Encoding") {
			break
		}
		if fields := strings.Fields(line); len(fields) > 1 && strings.Contains(fields[0], "TP/") {
			status = fields[1]
		}
	}
	return status
}

// watchedAnswer is what the instance in TestWatchedConnectionsUnderConcurrentUse
// answers, by path: the answers the gateway relays (bodies that hold
// status lines, 100 KB of them chunked or with a length, HEAD, 204, 304,
// interim answers, a 413 sent before the request's body was read), and a
// 101 and a "000", each followed by a whole answer that is no one's.
func watchedAnswer(path, id string) (answer string, early bool) {
	lines := strings.Repeat("HTTP/1.1 101 Switching Protocols\r\n", 3000)
	switch path {
	case "/ok":
		body := id + " HTTP/1.1 101 X\r\n"
		return fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body), false
	case "/head":
		return "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nX-Id: " + id + "\r\n\r\n", false
	case "/204":
		return "HTTP/1.1 204 No Content\r\nX-Id: " + id + "\r\n\r\n", false
	case "/304":
		return "HTTP/1.1 304 Not Modified\r\nX-Id: " + id + "\r\n\r\n", false
	case "/chunked":
		return fmt.Sprintf("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Id: %s\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", id, len(lines), lines), false
	case "/length":
		return fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Id: %s\r\n\r\n%s", len(lines), id, lines), false
	case "/interim":
		return "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Id: " + id + "\r\n\r\n", false
	case "/early":
		return "HTTP/1.1 413 Content Too Large\r\nContent-Length: 0\r\nX-Id: " + id + "\r\n\r\n", true
	case "/switch":
		return "HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n" +
			"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nX-Id: left\r\n\r\nleft over", false
	default: // "/zero"
		return "HTTP/1.1 000 X\r\nContent-Length: 0\r\nX-Id: left\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 9\r\nX-Id: left\r\n\r\nleft over", false
	}
}

// Through an instance's client, its answers read whole or as streams,
// requests from several goroutines on connections kept alive (fewer
// than the goroutines) each get their own answer, whatever the answers
// before them on the connection: none is refused, cut or taken for
// another's, and a connection a 101 or a "000" came on is not used
// again (a kept one would hand its "left over" answer to the next
// request). Run under -race, it also holds that the watch is touched by
// one goroutine at a time.
func TestWatchedConnectionsUnderConcurrentUse(t *testing.T) {
	addr := testenv.ServeConns(t, func(conn net.Conn) {
		r := bufio.NewReader(conn)
		for {
			req, err := http.ReadRequest(r)
			if err != nil {
				return
			}
			answer, early := watchedAnswer(req.URL.Path, req.URL.Query().Get("id"))
			if !early {
				_, _ = io.Copy(io.Discard, req.Body)
			}
			if _, err := conn.Write([]byte(answer)); err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
		}
	})
	paths := []string{"/ok", "/head", "/204", "/304", "/chunked", "/length", "/interim", "/early", "/switch", "/zero"}
	for _, whole := range []bool{true, false} {
		o := opts()
		o.MaxConns, o.ReadTimeout = 3, 5*time.Second
		if whole {
			o.ReadWholeUpTo = 1 << 20
		}
		p, err := ParseInstanceURL("http://" + addr)
		if err != nil {
			t.Fatal(err)
		}
		inst := newInstance(p, o)
		var wg sync.WaitGroup
		for g := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 50 {
					path, id := paths[(g*7+i)%len(paths)], fmt.Sprintf("g%di%d", g, i)
					if err := callWatched(inst, addr, path, id, i%4 == 0); err != nil {
						t.Errorf("read whole %v: %s %s: %v", whole, path, id, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		inst.client.CloseIdleConnections()
	}
}

// callWatched sends inst a request for path, with a body of 200 KB if
// withBody (always to /early), and checks it got its own answer, or a
// failure for a 101 or a "000".
func callWatched(inst *Instance, addr, path, id string, withBody bool) error {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + path + "?id=" + id)
	switch {
	case path == "/head":
		req.Header.SetMethod(fasthttp.MethodHead)
	case withBody || path == "/early":
		req.Header.SetMethod(fasthttp.MethodPost)
		req.SetBody(make([]byte, 200<<10))
	}
	err := inst.client.Do(req, resp)
	body := resp.Body()
	if err == nil && resp.IsBodyStream() {
		body, err = io.ReadAll(resp.BodyStream())
		_ = resp.CloseBodyStream()
	}
	switch {
	case path == "/switch" || path == "/zero":
		if err == nil {
			return fmt.Errorf("%d %q, want a failure", resp.StatusCode(), body)
		}
	case err != nil:
		return err
	case path == "/ok":
		if !strings.HasPrefix(string(body), id+" ") {
			return fmt.Errorf("%d %q, want its own answer", resp.StatusCode(), body)
		}
	case string(resp.Header.Peek("X-Id")) != id:
		return fmt.Errorf("%d, X-Id %q, want its own answer", resp.StatusCode(), resp.Header.Peek("X-Id"))
	case (path == "/chunked" || path == "/length") && len(body) != 3000*len("HTTP/1.1 101 Switching Protocols\r\n"):
		return fmt.Errorf("a body of %d bytes", len(body))
	}
	return nil
}
