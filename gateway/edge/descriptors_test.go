package edge_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/gateway/gatewaytest"
	"github.com/coinexport/export/gateway/upstream"
	"github.com/coinexport/export/pkg/testenv"
)

// A test out of descriptors runs the gateway in its own process, so any
// descriptor closed there after testenv.ExhaustDescriptors is one the
// gateway's next accept or dial gets. Seen (/proc/self/fd before and
// after, 11 failures in 150 runs of the two tests): an httptest upstream
// that answered "Connection: close" closed its end of the gateway's
// connection just after the gateway had answered; the test exhausted the
// descriptors in between, and the gateway's next dial got that number
// back (a hang, the upstream unable to accept, or 200, instead of 503).
// The gateway's probes can do the same: a socket every 250 ms to each
// service that refuses (gatewaytest's default) rechecks one that is down. So
// these tests run the gateway against quietUpstream, probed only as it
// starts, and exhaust the descriptors once every connection to it has
// ended on both sides.

// quietUpstream serves every service of a gateway started with
// quietServices: it answers each request with an envelope on a connection
// of its own ("Connection: close") and ends the connection only after the
// gateway has closed its end, then sends the request's path on the channel
// it returns. A path received is a connection closed on both sides.
func quietUpstream(t *testing.T) (url string, ended <-chan string) {
	t.Helper()
	paths := make(chan string, 100)
	addr := testenv.ServeConns(t, func(conn net.Conn) {
		req, err := http.ReadRequest(bufio.NewReader(conn))
		if err != nil {
			return
		}
		const body = `{"data":{},"meta":{"request_id":"r"}}`
		fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		io.Copy(io.Discard, conn) // until the gateway closes its end
		conn.Close()
		paths <- req.URL.Path
	})
	return "http://" + addr, paths
}

// quietServices is the environment of a gateway whose three services are
// url, each probed once as the gateway starts and not again while the test
// runs (an hour apart, never found down).
func quietServices(url string) map[string]string {
	return map[string]string{
		"EXPORT_READER_URLS":      url,
		"SALES_WRITER_URLS":       url,
		"SHOP_SCHEMA_URLS":        url,
		"UPSTREAM_PROBE_INTERVAL": "1h",
	}
}

// probes are the paths of the probes a gateway started with quietServices
// sends as it starts, one a service.
var probes = []string{upstream.HealthPath, upstream.HealthPath, upstream.HealthPath}

// waitForEnded waits until the connections that asked for each of paths
// (one connection a path, repeated for as many) have ended.
func waitForEnded(t *testing.T, ended <-chan string, paths ...string) {
	t.Helper()
	left := append([]string(nil), paths...)
	timeout := time.After(10 * time.Second)
	for len(left) > 0 {
		select {
		case p := <-ended:
			if i := slices.Index(left, p); i >= 0 {
				left = slices.Delete(left, i, i+1)
			}
		case <-timeout:
			t.Fatalf("the connections asking for %q had not ended within 10 s", left)
		}
	}
}

// statusOf sends request (a whole HTTP/1.1 request head) on conn and
// reads the answer's status; what names the request in a failure.
func statusOf(t *testing.T, conn net.Conn, br *bufio.Reader, what, request string) int {
	t.Helper()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write([]byte(request)); err != nil {
		t.Fatalf("sending %s: %v", what, err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the answer to %s: %v", what, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// getHealth sends GET /v1/health on conn and reads the answer's status.
func getHealth(t *testing.T, conn net.Conn, br *bufio.Reader) int {
	t.Helper()
	return statusOf(t, conn, br, "GET /v1/health", "GET /v1/health HTTP/1.1\r\nHost: gw\r\n\r\n")
}

// quietGateway starts a gateway on the database dsn whose three services
// are one quietUpstream, and a connection to it held for the test.
func quietGateway(t *testing.T, dsn string) (gw *gatewaytest.Server, services string, ended <-chan string, kept net.Conn, keptReader *bufio.Reader) {
	t.Helper()
	services, ended = quietUpstream(t)
	env := quietServices(services)
	env["DATABASE_URL"] = dsn
	gw = gatewaytest.Start(t, env)
	kept = dial(t, gw.URL)
	return gw, services, ended, kept, bufio.NewReader(kept)
}

// A gateway out of file descriptors keeps its listener: it answers on the
// connections it holds, logs the shortage, and accepts the connection that
// waited in the backlog once a descriptor is free. Before, fasthttp took
// EMFILE for the listener's end: the gateway stopped accepting (the binary
// exited, cutting off every connection it held).
func TestOutOfDescriptorsTheGatewayWaitsAndServesOn(t *testing.T) {
	dsn, _, _ := seed(t)
	gw, _, ended, kept, keptReader := quietGateway(t, dsn)
	if got := getHealth(t, kept, keptReader); got != 200 {
		t.Fatalf("GET /v1/health = %d, want 200", got)
	}
	waitForEnded(t, ended, probes...)

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
	gw, reader, ended, kept, keptReader := quietGateway(t, dsn)
	get := func() int {
		t.Helper()
		return statusOf(t, kept, keptReader, "GET an item",
			"GET /v1/export/items/coin-1 HTTP/1.1\r\nHost: gw\r\nX-API-Key: "+k.read+"\r\n\r\n")
	}
	if got := get(); got != 200 { // the key is cached from here on
		t.Fatalf("GET an item = %d, want 200", got)
	}
	waitForEnded(t, ended, append(probes, "/v1/export/items/coin-1")...)

	restore := testenv.NoDescriptors(t) // none even if something closes one meanwhile
	if got := get(); got != 503 {
		t.Errorf("GET an item with the gateway out of descriptors = %d, want 503", got)
	}
	restore()
	metrics := scrape(t, gw.AdminURL)
	wantSeries(t, metrics, "gateway_upstream_errors_total",
		`gateway_upstream_errors_total{kind="gateway_shortage",upstream="export-reader",upstream_instance="none"} 1`,
		`gateway_upstream_errors_total{kind="unreachable",upstream="export-reader",upstream_instance="`+reader+`"} 0`,
	)
	wantSeries(t, metrics, "gateway_upstream_retries_total",
		`gateway_upstream_retries_total{kind="unreachable",upstream="export-reader",upstream_instance="`+reader+`"} 0`,
	)
}
