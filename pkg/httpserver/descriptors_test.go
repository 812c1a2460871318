package httpserver

import (
	"bufio"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/testenv"
)

// Out of file descriptors, a service logs the shortage once (acceptretry),
// not net/http's "Accept error" once a second for as long as it lasts, and
// serves the connection that waited once a descriptor is free.
func TestOutOfDescriptorsIsLoggedOnceAndServedAfter(t *testing.T) {
	var logs testenv.Output
	addr, stop := runServer(t, http.NewServeMux(), nil, slog.New(slog.NewJSONHandler(&logs, nil)), time.Second)
	t.Cleanup(func() { stop() })
	held := testenv.ExhaustDescriptors(t)
	held[0].Close() // the client's side of the connection
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), "accept failed"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no line said that accepting failed within 10 s; the log:\n%s", logs.String())
		}
	}
	for _, f := range held[1:] {
		f.Close()
	}
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write([]byte("GET /healthz HTTP/1.1\r\nHost: svc\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer on the connection that waited: %v", err)
	}
	resp.Body.Close()
	if strings.Contains(logs.String(), "Accept error") {
		t.Errorf("net/http logged its own accept errors too:\n%s", logs.String())
	}
}
