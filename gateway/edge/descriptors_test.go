package edge_test

import (
	"bufio"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/gateway/gatewaytest"
	"github.com/coinexport/export/pkg/testenv"
)

// getHealth sends GET /v1/health on conn and reads the answer's status.
func getHealth(t *testing.T, conn interface {
	Write([]byte) (int, error)
	SetDeadline(time.Time) error
}, br *bufio.Reader) int {
	t.Helper()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write([]byte("GET /v1/health HTTP/1.1\r\nHost: gw\r\n\r\n")); err != nil {
		t.Fatalf("sending GET /v1/health: %v", err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the answer to GET /v1/health: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A gateway out of file descriptors keeps its listener: it answers on the
// connections it holds, logs the shortage, and accepts the connection that
// waited in the backlog once a descriptor is free. Before, fasthttp took
// EMFILE for the listener's end: the gateway stopped accepting (the binary
// exited, cutting off every connection it held).
func TestOutOfDescriptorsTheGatewayWaitsAndServesOn(t *testing.T) {
	dsn, _, _ := seed(t)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn})
	kept := dial(t, gw.URL)
	keptReader := bufio.NewReader(kept)
	if got := getHealth(t, kept, keptReader); got != 200 {
		t.Fatalf("GET /v1/health = %d, want 200", got)
	}

	held := testenv.ExhaustDescriptors(t)
	held[0].Close() // the client's side of one more connection
	waiting := dial(t, gw.URL)
	waitFor(t, 10*time.Second, func() bool { return strings.Contains(gw.Logs.String(), "accept failed") })
	if got := getHealth(t, kept, keptReader); got != 200 {
		t.Errorf("GET /v1/health on a connection held through the shortage = %d, want 200", got)
	}

	for _, f := range held[1:] {
		f.Close()
	}
	if got := getHealth(t, waiting, bufio.NewReader(waiting)); got != 200 {
		t.Errorf("GET /v1/health on the connection that waited for a descriptor = %d, want 200", got)
	}
}
