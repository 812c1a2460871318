package edge_test

import (
	"bufio"
	"net/http"
	"net/http/httptest"
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

// A connection to a service that the gateway cannot open for want of its
// own descriptors is counted as its shortage, under no instance: counted as
// the instance's "unreachable", it had ExportUpstreamRetries and the
// dashboard name a reader that was fine while the gateway sat at its limit
// (seen on a live stack: "repeats export-reader requests after unreachable
// failures of http://127.0.0.1:24301").
func TestOutOfDescriptorsNoInstanceIsCounted(t *testing.T) {
	dsn, _, k := seed(t)
	// Each answer closes its connection, so the next request must open one.
	reader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"data":{},"meta":{"request_id":"r"}}`))
	}))
	t.Cleanup(reader.Close)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader.URL})
	kept := dial(t, gw.URL)
	keptReader := bufio.NewReader(kept)
	get := func() int {
		t.Helper()
		kept.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := kept.Write([]byte("GET /v1/export/items/coin-1 HTTP/1.1\r\nHost: gw\r\nX-API-Key: " + k.read + "\r\n\r\n")); err != nil {
			t.Fatalf("sending GET: %v", err)
		}
		resp, err := http.ReadResponse(keptReader, nil)
		if err != nil {
			t.Fatalf("reading the answer to GET: %v", err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get(); got != 200 { // the key is cached from here on
		t.Fatalf("GET an item = %d, want 200", got)
	}

	held := testenv.ExhaustDescriptors(t)
	if got := get(); got != 503 {
		t.Errorf("GET an item with the gateway out of descriptors = %d, want 503", got)
	}
	for _, f := range held {
		f.Close()
	}
	metrics := scrape(t, gw.AdminURL)
	wantSeries(t, metrics, "gateway_upstream_errors_total",
		`gateway_upstream_errors_total{kind="gateway_shortage",upstream="export-reader",upstream_instance="none"} 1`,
		`gateway_upstream_errors_total{kind="unreachable",upstream="export-reader",upstream_instance="`+reader.URL+`"} 0`,
	)
	wantSeries(t, metrics, "gateway_upstream_retries_total",
		`gateway_upstream_retries_total{kind="unreachable",upstream="export-reader",upstream_instance="`+reader.URL+`"} 0`,
	)
}
