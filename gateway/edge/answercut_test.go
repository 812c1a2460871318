package edge_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coinexport/export/gateway/gatewaytest"
	"github.com/coinexport/export/pkg/identity"
)

// bigItemBytes is an item's answer far larger than the socket buffers
// between a client that stops reading and the gateway (on loopback a few
// MiB), so that the gateway is still writing it when that client leaves;
// past heldAnswersLimit, it is relayed as it comes.
const bigItemBytes = 40 << 20

var bigItem = bytes.Repeat([]byte("x"), bigItemBytes)

// heldItemBytes is an item's answer also far larger than those socket
// buffers, but within heldAnswersLimit: held whole, and written to its
// client's socket with its head in one writev (relayedStream.WriteTo).
const heldItemBytes = 24 << 20

// cutItems are the items whose answers the cut tests have cut, and their
// sizes: one relayed as it comes, one held whole.
var cutItems = []struct {
	name string
	size int
}{{"big", bigItemBytes}, {"held", heldItemBytes}}

// itemsUpstream is export-reader for the answer cut tests: item "big"
// answers bigItemBytes, "held" heldItemBytes, "slow" waits for release (after sending its
// request id on slowIDs), any other a small envelope.
type itemsUpstream struct {
	slowIDs chan string
	release chan struct{}
	once    sync.Once
}

func startItemsUpstream(t *testing.T) (*itemsUpstream, string) {
	u := &itemsUpstream{slowIDs: make(chan string, 4), release: make(chan struct{})}
	t.Cleanup(u.releaseSlow)
	srv := signedUpstream(t, func(w http.ResponseWriter, r *http.Request, id identity.Identity) {
		switch r.URL.Path {
		case "/v1/export/items/big":
			w.Header().Set("Content-Length", fmt.Sprint(bigItemBytes))
			_, _ = w.Write(bigItem)
			return
		case "/v1/export/items/held":
			w.Header().Set("Content-Length", fmt.Sprint(heldItemBytes))
			_, _ = w.Write(bigItem[:heldItemBytes])
			return
		case "/v1/export/items/slow":
			u.slowIDs <- id.RequestID
			<-u.release
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"data":{"id":"small"},"meta":{"request_id":%q}}`, id.RequestID)
	})
	return u, srv.URL
}

func (u *itemsUpstream) releaseSlow() { u.once.Do(func() { close(u.release) }) }

// cutLine is an "answer cut short" line as the tests read it.
type cutLine struct {
	Level     string `json:"level"`
	RequestID string `json:"request_id"`
	Method    string `json:"method"`
	Route     string `json:"route"`
	Status    int    `json:"status"`
	Cause     string `json:"cause"`
	BytesSent *int64 `json:"answer_bytes_sent"`
}

// cutLines are the gateway's "answer cut short" lines so far.
func cutLines(t *testing.T, gw *gatewaytest.Server) []cutLine {
	t.Helper()
	var lines []cutLine
	for l := range strings.SplitSeq(gw.Logs.String(), "\n") {
		if !strings.Contains(l, `"msg":"answer cut short"`) {
			continue
		}
		var line cutLine
		if err := json.Unmarshal([]byte(l), &line); err != nil {
			t.Fatalf("%v: %s", err, l)
		}
		lines = append(lines, line)
	}
	return lines
}

// waitForCut waits for the cut line of requestID and returns every cut
// line then.
func waitForCut(t *testing.T, gw *gatewaytest.Server, requestID string) []cutLine {
	t.Helper()
	var lines []cutLine
	waitFor(t, 10*time.Second, func() bool {
		lines = cutLines(t, gw)
		for _, l := range lines {
			if l.RequestID == requestID {
				return true
			}
		}
		return false
	})
	return lines
}

// getItem writes a GET of item on conn with key.
func getItem(t *testing.T, conn net.Conn, item, key string) {
	t.Helper()
	if _, err := fmt.Fprintf(conn, "GET /v1/export/items/%s HTTP/1.1\r\nHost: gateway\r\nX-API-Key: %s\r\n\r\n", item, key); err != nil {
		t.Fatal(err)
	}
}

// readHead reads an answer's head from r, and returns it and the bytes of
// the answer read so far (its head and what r holds of its body).
func readHead(t *testing.T, r *bufio.Reader) (*http.Response, int) {
	t.Helper()
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	var head bytes.Buffer
	_ = resp.Header.Write(&head)
	return resp, len(resp.Proto) + len(resp.Status) + 3 + head.Len() + 2 + r.Buffered()
}

// A client that reads the head of a large answer (relayed as it comes, or
// held whole and sent with its head in one writev), then closes or resets
// its connection, leaves a warn line with the answer's request id, route,
// status, cause and how many of its bytes the gateway's socket had taken
// (at least what the client read, less than the whole), and a count in
// gateway_answers_cut_total; its access line, written before the answer,
// says 200 all the same.
func TestAClientThatLeavesMidAnswerLeavesATrace(t *testing.T) {
	dsn, _, k := seed(t)
	_, reader := startItemsUpstream(t)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader})
	for _, item := range cutItems {
		for _, reset := range []bool{false, true} {
			testAClientThatLeavesMidAnswer(t, gw, k.read, item.name, item.size, reset)
		}
	}
	wantSeries(t, scrape(t, gw.AdminURL), "gateway_answers_cut_total",
		`gateway_answers_cut_total{cause="client_left",route="GET /v1/export/items/{item_id}"} 4`,
		`gateway_answers_cut_total{cause="write_timeout",route="GET /v1/export/items/{item_id}"} 0`)
}

// testAClientThatLeavesMidAnswer has a client leave mid-answer, closing
// or resetting its connection, and checks the answer's cut line.
func testAClientThatLeavesMidAnswer(t *testing.T, gw *gatewaytest.Server, key, item string, size int, reset bool) {
	conn := dial(t, gw.URL)
	getItem(t, conn, item, key)
	r := bufio.NewReader(conn)
	resp, read := readHead(t, r)
	id := resp.Header.Get("X-Request-Id")
	if resp.StatusCode != http.StatusOK || id == "" {
		t.Fatalf("the %s item = %d, request id %q", item, resp.StatusCode, id)
	}
	if reset {
		_ = conn.(*net.TCPConn).SetLinger(0)
	}
	conn.Close()
	lines := waitForCut(t, gw, id)
	var mine []cutLine
	for _, l := range lines {
		if l.RequestID == id {
			mine = append(mine, l)
		}
	}
	whole := int64(read-r.Buffered()) + int64(size) // head and body
	if l := mine[0]; len(mine) != 1 || l.Level != "WARN" || l.Method != "GET" || l.Route != "GET /v1/export/items/{item_id}" ||
		l.Status != 200 || l.Cause != "client_left" || l.BytesSent == nil || *l.BytesSent < int64(read) || *l.BytesSent >= whole {
		t.Errorf("%s item, reset %v: cut lines of the answer = %+v (bytes %v), want one warn line, GET, the route, 200, client_left, and at least the %d bytes the client read, less than %d",
			item, reset, mine, bytesOf(mine), read, whole)
	}
}

func bytesOf(lines []cutLine) []int64 {
	var b []int64
	for _, l := range lines {
		if l.BytesSent != nil {
			b = append(b, *l.BytesSent)
		}
	}
	return b
}

// On a kept-alive connection, an answer the client read whole is not
// blamed for the next one, which it left before it came: the one line is
// the second answer's, and counts none of the first's bytes as sent.
func TestOnlyTheAnswerCutIsBlamedOnAKeptAliveConnection(t *testing.T) {
	dsn, _, k := seed(t)
	upstream, reader := startItemsUpstream(t)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader})
	conn := dial(t, gw.URL)
	r := bufio.NewReader(conn)
	getItem(t, conn, "small", k.read)
	first, _ := readHead(t, r)
	if _, err := io.ReadAll(first.Body); err != nil || first.StatusCode != http.StatusOK {
		t.Fatalf("the small item = %d, %v", first.StatusCode, err)
	}
	getItem(t, conn, "slow", k.read)
	id := <-upstream.slowIDs
	_ = conn.(*net.TCPConn).SetLinger(0)
	conn.Close()
	upstream.releaseSlow()
	lines := waitForCut(t, gw, id)
	if len(lines) != 1 || *lines[0].BytesSent != 0 {
		t.Errorf("cut lines = %+v (bytes %v), want the second answer's alone (%s; not the first's, %s), 0 bytes sent",
			lines, bytesOf(lines), id, first.Header.Get("X-Request-Id"))
	}
}

// Two pipelined requests whose client reset the connection before the
// first was answered: the first answer is the one cut (its client got
// none of it), and the second is not served. Without each answer flushed
// on its own, the first waited in fasthttp's write buffer for the second,
// whose write failed with both in it, and the line named the second alone.
func TestTheFirstOfTwoPipelinedAnswersIsTheOneCut(t *testing.T) {
	dsn, _, k := seed(t)
	upstream, reader := startItemsUpstream(t)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader})
	conn := dial(t, gw.URL)
	two := fmt.Sprintf("GET /v1/export/items/slow HTTP/1.1\r\nHost: gateway\r\nX-API-Key: %s\r\n\r\n"+
		"GET /v1/export/items/small HTTP/1.1\r\nHost: gateway\r\nX-API-Key: %[1]s\r\n\r\n", k.read)
	if _, err := io.WriteString(conn, two); err != nil { // in one write: read together
		t.Fatal(err)
	}
	id := <-upstream.slowIDs
	_ = conn.(*net.TCPConn).SetLinger(0)
	conn.Close()
	upstream.releaseSlow()
	lines := waitForCut(t, gw, id)
	if len(lines) != 1 || lines[0].Cause != "client_left" || *lines[0].BytesSent != 0 {
		t.Errorf("cut lines = %+v (bytes %v), want the first answer's alone (%s), client_left, 0 bytes sent", lines, bytesOf(lines), id)
	}
}

// A client that stops reading mid-answer without leaving is cut off when
// GATEWAY_WRITE_TIMEOUT passes: the line says write_timeout, not a client
// that left. An answer held whole meets it in the writev that sends its
// head with its body (the write deadline applied before it).
func TestAClientThatStopsReadingIsCutByTheWriteTimeout(t *testing.T) {
	dsn, _, k := seed(t)
	_, reader := startItemsUpstream(t)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader,
		"GATEWAY_WRITE_TIMEOUT": "300ms"})
	for _, item := range cutItems {
		conn := dial(t, gw.URL)
		getItem(t, conn, item.name, k.read)
		resp, _ := readHead(t, bufio.NewReader(conn))
		id := resp.Header.Get("X-Request-Id")
		lines := waitForCut(t, gw, id) // the client reads no more, and stays
		var mine []cutLine
		for _, l := range lines {
			if l.RequestID == id {
				mine = append(mine, l)
			}
		}
		if len(mine) != 1 || mine[0].Cause != "write_timeout" || mine[0].Status != 200 {
			t.Errorf("%s item: cut lines = %+v, want one of %s, write_timeout, 200", item.name, lines, id)
		}
	}
}

// An answer written on a kept-alive connection after the last answer's
// GATEWAY_WRITE_TIMEOUT has passed has a write deadline of its own: the
// refusal of a head that cannot be read or comes too slowly, and a 100
// Continue. fasthttp sets the deadline only before a handler's answer and
// left it on the connection; its error handler's answer and its 100
// Continue were written under the last one's, passed, and never reached
// the client (the connection closed without a word: a client idle for
// 50 s whose next head then stalled had no 408). The gateway now sets each
// answer's deadline as it notes it (noteAnswer), and fasthttp clears it
// once the answer is written.
func TestALateAnswerOnAKeptAliveConnectionIsWritten(t *testing.T) {
	dsn, _, _ := seed(t)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn,
		"GATEWAY_WRITE_TIMEOUT": "300ms", "GATEWAY_READ_TIMEOUT": "200ms"})
	const unmatched = "POST /v1/no-such-route HTTP/1.1\r\nHost: gateway\r\nContent-Length: 2\r\n"
	for _, tc := range []struct {
		name, second string
		want         []int // the answers to it
	}{
		{"a head that cannot be read", "GET /v1/health HTTP/1.1\r\nHost: gateway\r\nBad Header\r\n\r\n", []int{400}},
		{"a head that stops coming", "GET /v1/health HTTP/1.1\r\nHo", []int{408}},
		{"a 100 Continue", unmatched + "Expect: 100-continue\r\n\r\n{}", []int{100, 404}},
	} {
		conn := dial(t, gw.URL)
		r := bufio.NewReader(conn)
		if _, err := io.WriteString(conn, unmatched+"\r\n{}"); err != nil {
			t.Fatal(err)
		}
		first, _ := readHead(t, r)
		if _, err := io.Copy(io.Discard, first.Body); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond) // past the first answer's write deadline
		if _, err := io.WriteString(conn, tc.second); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		for _, want := range tc.want {
			resp, err := http.ReadResponse(r, nil)
			if err != nil || resp.StatusCode != want {
				t.Errorf("%s: answer %v, %v; want %d", tc.name, resp, err, want)
				break
			}
		}
	}
}
