package testenv

import (
	"bufio"
	"net"
	"net/http"
	"testing"
	"time"
)

// SendOn writes req on conn and reads its answer, as a gateway does on a
// connection it keeps alive: a test of a stopping service holds a
// connection of its own to see what the service does with it. The caller
// closes the answer's body; an error (the connection closed before an
// answer) fails the test.
func SendOn(t testing.TB, conn net.Conn, req *http.Request) *http.Response {
	t.Helper()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	if err := req.Write(conn); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		t.Fatalf("no answer on the connection: %v", err)
	}
	return resp
}
