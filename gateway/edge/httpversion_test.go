package edge_test

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coinexport/export/gateway/gatewaytest"
	"github.com/coinexport/export/pkg/identity"
)

// upstreamCalls records, for each request a fake service got, the HTTP
// version it was sent in and the connection it came on.
type upstreamCalls struct {
	mu    sync.Mutex
	calls []upstreamCall
}

type upstreamCall struct{ proto, conn string }

func (u *upstreamCalls) add(r *http.Request) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.calls = append(u.calls, upstreamCall{r.Proto, r.RemoteAddr})
}

func (u *upstreamCalls) all() []upstreamCall {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]upstreamCall(nil), u.calls...)
}

// versionUpstream is a fake service that records each call's version and
// connection; its shop schema answer is streamed (flushed in two parts,
// no Content-Length), as shop-schema's is.
func versionUpstream(t *testing.T, calls *upstreamCalls) *httptest.Server {
	t.Helper()
	return signedUpstream(t, func(w http.ResponseWriter, r *http.Request, id identity.Identity) {
		calls.add(r)
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/sync/prestashop/schema" {
			_, _ = io.WriteString(w, `{"data":{"categories":[],`)
			http.NewResponseController(w).Flush()
			_, _ = io.WriteString(w, `"features":[]},"meta":{"request_id":"`+id.RequestID+`"}}`)
			return
		}
		_, _ = io.WriteString(w, `{"data":{"id":"coin-1"},"meta":{"request_id":"`+id.RequestID+`"}}`)
	})
}

// The gateway speaks HTTP/1.1 to the services whatever version its client
// spoke: it sent an HTTP/1.0 (or 1.2) request on in the client's version,
// and the service's net/http answered a 1.0 request and closed the
// connection, so that every such request, however cheap for the client
// (HTTP/1.0 with Connection: keep-alive, pipelined), cost a kept-alive
// connection to the service, a new one dialled, and the service a
// connection in TIME_WAIT. The client is still answered as it asked: an
// HTTP/1.0 client's connection is closed after the answer unless it asked
// to keep it.
func TestServicesAreSpokenToInHTTP11WhateverTheClientSpoke(t *testing.T) {
	dsn, _, k := seed(t)
	var calls upstreamCalls
	up := versionUpstream(t, &calls)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn,
		"EXPORT_READER_URLS": up.URL, "SHOP_SCHEMA_URLS": up.URL})
	item := "GET /v1/export/items/coin-1 "
	requests := []struct {
		name, head, body string
		closed           bool // the client's connection after the answer
	}{
		{"1.0", item + "HTTP/1.0\r\nX-API-Key: " + k.read + "\r\n\r\n", `"coin-1"`, true},
		{"1.0 keep-alive", item + "HTTP/1.0\r\nConnection: keep-alive\r\nX-API-Key: " + k.read + "\r\n\r\n", `"coin-1"`, false},
		{"1.2", item + "HTTP/1.2\r\nHost: gw\r\nX-API-Key: " + k.read + "\r\n\r\n", `"coin-1"`, true},
		{"1.1 close", item + "HTTP/1.1\r\nHost: gw\r\nConnection: close\r\nX-API-Key: " + k.read + "\r\n\r\n", `"coin-1"`, true},
		{"1.1", item + "HTTP/1.1\r\nHost: gw\r\nX-API-Key: " + k.read + "\r\n\r\n", `"coin-1"`, false},
		{"1.0 shop schema", "POST /v1/sync/prestashop/schema HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}", `"features":[]`, true},
	}
	for _, rq := range requests {
		conn := dial(t, gw.URL)
		if _, err := io.WriteString(conn, rq.head); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: %v", rq.name, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(string(body), rq.body) {
			t.Errorf("%s: answer %d %q (%v), want 200 with %s", rq.name, resp.StatusCode, body, err, rq.body)
		}
		_ = conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		_, err = br.ReadByte()
		if closed := errors.Is(err, io.EOF); closed != rq.closed {
			t.Errorf("%s: connection closed after the answer: %v (%v), want %v", rq.name, closed, err, rq.closed)
		}
	}
	got := calls.all()
	if len(got) != len(requests) {
		t.Fatalf("the service got %d calls, want %d", len(got), len(requests))
	}
	for i, c := range got {
		if c.proto != "HTTP/1.1" {
			t.Errorf("%s: the service was sent %s, want HTTP/1.1", requests[i].name, c.proto)
		}
	}
	// The item reads share one upstream's connections (the shop schema
	// route has its own): one, kept alive from first to last.
	for i, c := range got[:len(got)-1] {
		if c.conn != got[0].conn {
			t.Errorf("%s: came on connection %s, the first on %s: want one kept-alive connection", requests[i].name, c.conn, got[0].conn)
		}
	}
}

// A streamed answer (shop-schema's: no Content-Length) reaches a client
// that does not speak HTTP/1.1 with its length, and no chunks: fasthttp
// frames a stream of unknown length chunked whatever the client, and RFC
// 9112 7.1 forbids chunked towards HTTP/1.0, whose clients that know 1.0
// alone read the chunk sizes as part of the body. The answer is read whole
// for them (relayWhole); an HTTP/1.1 client still gets it streamed.
func TestStreamedAnswerReachesAnHTTP10ClientWithItsLength(t *testing.T) {
	dsn, _, _ := seed(t)
	var calls upstreamCalls
	up := versionUpstream(t, &calls)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn,
		"EXPORT_READER_URLS": up.URL, "SHOP_SCHEMA_URLS": up.URL})
	for _, version := range []string{"1.0", "1.2", "1.1"} {
		status, fields, body := shopSchemaIn(t, gw.URL, version)
		if !strings.Contains(status, " 200 ") {
			t.Fatalf("HTTP/%s: %s %q, want a 200", version, status, body)
		}
		if version == "1.1" {
			if fields.Get("Transfer-Encoding") != "chunked" {
				t.Errorf("HTTP/1.1: Transfer-Encoding %q, want the answer streamed, chunked", fields.Get("Transfer-Encoding"))
			}
			continue
		}
		if te := fields.Get("Transfer-Encoding"); te != "" {
			t.Errorf("HTTP/%s: Transfer-Encoding %q, want none", version, te)
		}
		if fields.Get("Content-Length") != strconv.Itoa(len(body)) || !strings.HasPrefix(body, `{"data":{"categories":[],"features":[]}`) {
			t.Errorf("HTTP/%s: Content-Length %q, body %q: want the answer's JSON, with its length", version, fields.Get("Content-Length"), body)
		}
	}
}

// A streamed answer the service breaks off reaches an HTTP/1.0 client as
// a 502 envelope, the answer being read whole for it before its first
// byte is sent (an HTTP/1.1 client gets it cut short, as streamed).
func TestStreamBrokenOffIsA502ForAnHTTP10Client(t *testing.T) {
	dsn, _, _ := seed(t)
	up := signedUpstream(t, func(w http.ResponseWriter, r *http.Request, id identity.Identity) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"data":{"categories":[],`)
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler) // the connection is closed mid-answer
	})
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "SHOP_SCHEMA_URLS": up.URL})
	status, fields, body := shopSchemaIn(t, gw.URL, "1.0")
	if !strings.Contains(status, " 502 ") || fields.Get("X-Error-Code") != "bad_gateway" ||
		fields.Get("Content-Length") != strconv.Itoa(len(body)) || !strings.Contains(body, `"code":"bad_gateway"`) {
		t.Errorf("answer %s %v %q, want the 502 bad_gateway envelope, with its length", status, fields, body)
	}
}

// shopSchemaIn sends a shop schema call in HTTP/version and reads the
// answer raw, to the connection's end: its status line, header fields and
// body as sent.
func shopSchemaIn(t *testing.T, baseURL, version string) (status string, fields textproto.MIMEHeader, body string) {
	t.Helper()
	conn := dial(t, baseURL)
	head := "POST /v1/sync/prestashop/schema HTTP/" + version + "\r\nHost: gw\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	raw, err := io.ReadAll(conn) // the connection is closed after the answer
	if err != nil {
		t.Fatalf("HTTP/%s: %v", version, err)
	}
	header, body, _ := strings.Cut(string(raw), "\r\n\r\n")
	tp := textproto.NewReader(bufio.NewReader(strings.NewReader(header + "\r\n\r\n")))
	status, _ = tp.ReadLine()
	if fields, err = tp.ReadMIMEHeader(); err != nil {
		t.Fatalf("HTTP/%s: answer %q: %v", version, raw, err)
	}
	return status, fields, body
}

// A streamed answer that carries its length (shop-schema's, since it has
// given one) reaches an HTTP/1.0 client as it comes, not read whole
// first: read whole, it was held in the gateway, the service's slot free
// again once it had written it, for as long as the client took to read
// it. Here the service writes the first half and waits for the client to
// have read it: read whole, the client got nothing, and its read timed out.
func TestLengthedStreamReachesAnHTTP10ClientAsItComes(t *testing.T) {
	dsn, _, _ := seed(t)
	const half = 256 << 10
	clientRead := make(chan struct{})
	up := signedUpstream(t, func(w http.ResponseWriter, r *http.Request, id identity.Identity) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(2*half))
		_, _ = io.WriteString(w, strings.Repeat(" ", half))
		http.NewResponseController(w).Flush()
		select {
		case <-clientRead:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, strings.Repeat(" ", half))
	})
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "SHOP_SCHEMA_URLS": up.URL})
	conn := dial(t, gw.URL)
	if _, err := io.WriteString(conn, "POST /v1/sync/prestashop/schema HTTP/1.0\r\nHost: gw\r\nContent-Length: 2\r\n\r\n{}"); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	answer := bufio.NewReader(conn)
	resp, err := http.ReadResponse(answer, nil)
	if err != nil {
		t.Fatalf("no answer while the service waits for the client to read its first half: %v", err)
	}
	// Most of it: the last bytes may wait in the gateway's write buffer.
	const most = half - 64<<10
	if _, err := io.ReadFull(resp.Body, make([]byte, most)); err != nil {
		t.Fatalf("the first half did not come while the service waited: %v", err)
	}
	close(clientRead)
	rest, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || resp.ContentLength != 2*half || err != nil || len(rest) != 2*half-most || len(resp.TransferEncoding) > 0 {
		t.Errorf("answer %d, Content-Length %d, Transfer-Encoding %v, rest %d bytes (%v): want 200 with the service's length",
			resp.StatusCode, resp.ContentLength, resp.TransferEncoding, len(rest), err)
	}
}

// A streamed answer whose service stops sending past UPSTREAM_READ_TIMEOUT,
// read whole for an HTTP/1.0 client, is the 504 of a timeout
// (upstreamReadError), as for an answer read whole, not a 502.
func TestStreamTimedOutIsA504ForAnHTTP10Client(t *testing.T) {
	dsn, _, _ := seed(t)
	stalled := make(chan struct{})
	t.Cleanup(func() { close(stalled) }) // runs before the upstream closes
	up := signedUpstream(t, func(w http.ResponseWriter, r *http.Request, id identity.Identity) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"data":{"categories":[],`)
		http.NewResponseController(w).Flush()
		select {
		case <-stalled:
		case <-r.Context().Done():
		}
	})
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "SHOP_SCHEMA_URLS": up.URL, "UPSTREAM_READ_TIMEOUT": "300ms"})
	status, fields, body := shopSchemaIn(t, gw.URL, "1.0")
	if !strings.Contains(status, " 504 ") || fields.Get("X-Error-Code") != "upstream_timeout" ||
		fields.Get("Content-Length") != strconv.Itoa(len(body)) || !strings.Contains(body, `"code":"upstream_timeout"`) {
		t.Errorf("answer %s %v %q, want the 504 upstream_timeout envelope, with its length", status, fields, body)
	}
}
