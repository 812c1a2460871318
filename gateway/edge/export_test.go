package edge

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// MinHeaderBytes is the smallest GATEWAY_MAX_HEADER_BYTES.
const MinHeaderBytes = minHeaderBytes

// UnfinishedRequestAnswer sends the gateway at addr (host:port) a request
// whose headers never end, on a new connection, and returns what it is
// answered once the read timeout has passed (a 408; the body closed): for
// the tests of both packages that time such a request, by its log line and
// by its span.
func UnfinishedRequestAnswer(t *testing.T, addr string) *http.Response {
	t.Helper()
	resp, _ := RawAnswer(t, addr, "GET /v1/health HTTP/1.1\r\nHost: gateway\r\n") // never ended
	return resp
}

// RawAnswer sends request, written as is, on a new connection to the
// gateway at addr (host:port), and returns the answer and its body: for the
// tests of both packages that send what no HTTP client would.
func RawAnswer(t *testing.T, addr, request string) (*http.Response, []byte) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, request); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%q: %v", request, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, body
}

// SetHeldAnswersLimit sets the bytes of list pages and items a gateway
// started after it holds whole at once, until the test ends.
func SetHeldAnswersLimit(t *testing.T, n int) {
	old := heldAnswersLimit
	heldAnswersLimit = n
	t.Cleanup(func() { heldAnswersLimit = old })
}
