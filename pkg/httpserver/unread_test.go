package httpserver

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/testenv"
)

// The requests net/http answers itself, before any handler runs, are
// answered with the envelope on both listeners, each with a request id that
// the service's log names.
func TestNetHTTPAnswersBecomeEnvelopes(t *testing.T) {
	addrs, logs := runOnTwoAddrs(t)

	cases := []struct {
		name, request string
		status        int
		code, message string
	}{
		{"no Host", "GET /v1/x HTTP/1.1\r\n\r\n",
			400, "bad_request", "the request could not be read: missing required Host header"},
		{"invalid header name", "GET /v1/x HTTP/1.1\r\nHost: x\r\nBad Name: y\r\n\r\n",
			400, "bad_request", "the request could not be read: invalid header name"},
		{"no request line", "hello\r\n\r\n",
			400, "bad_request", "the request could not be read"},
		{"headers over the limit", "GET /v1/x HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 64<<10) + "\r\n\r\n",
			431, "headers_too_large", "the request line (with its URL) and headers are too large together"},
		{"unknown transfer coding", "POST /v1/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
			400, "unsupported_transfer_encoding", "the request's Transfer-Encoding is not supported: send Content-Length, or Transfer-Encoding: chunked"},
		{"HTTP/2.0 on the HTTP/1 port", "GET /v1/x HTTP/2.0\r\nHost: x\r\n\r\n",
			400, "http_version_not_supported", "send HTTP/1.1 or HTTP/1.0"},
		{"unknown Expect", "GET /v1/x HTTP/1.1\r\nHost: x\r\nExpect: tea\r\n\r\n",
			417, "expectation_failed", "the only Expect understood is 100-continue"},
		{"unknown Expect, HTTP/1.0", "GET /v1/x HTTP/1.0\r\nHost: x\r\nExpect: tea\r\n\r\n",
			417, "expectation_failed", "the only Expect understood is 100-continue"},
	}
	for _, addr := range addrs {
		for _, tc := range cases {
			resp, body := rawExchange(t, addr, tc.request)
			var env envelope.Parsed
			if err := json.Unmarshal(body, &env); err != nil || env.Error == nil {
				t.Errorf("%s on %s: %d %q, want an error envelope", tc.name, addr, resp.StatusCode, body)
				continue
			}
			id := resp.Header.Get(envelope.RequestIDHeader)
			switch {
			case resp.StatusCode != tc.status || env.Error.Code != tc.code || env.Error.Message != tc.message:
				t.Errorf("%s on %s: %d %s %q, want %d %s %q", tc.name, addr, resp.StatusCode, env.Error.Code,
					env.Error.Message, tc.status, tc.code, tc.message)
			case len(id) != 32 || env.Meta.RequestID != id:
				t.Errorf("%s on %s: request id %q in the header, %q in meta, want the same 32 hex digits", tc.name, addr, id, env.Meta.RequestID)
			case resp.Header.Get("Content-Type") != envelope.ContentType || resp.Header.Get(envelope.ErrorCodeHeader) != tc.code || !resp.Close:
				t.Errorf("%s on %s: headers %v, want the envelope's content type, X-Error-Code %s and Connection: close", tc.name, addr, resp.Header, tc.code)
			}
		}
	}
	// The first of each code is logged with its request id (then at most
	// one per interval and code).
	_, body := rawExchange(t, addrs[0], "GET /v1/x HTTP/2.0\r\nHost: x\r\n\r\n")
	var env envelope.Parsed
	_ = json.Unmarshal(body, &env)
	if out := logs.String(); strings.Contains(out, env.Meta.RequestID) {
		t.Errorf("a second http_version_not_supported within the interval was logged: %s", out)
	}
	if out := logs.String(); !strings.Contains(out, `"msg":"request refused before routing: net/http could not read it","request_id":"`) ||
		!strings.Contains(out, `"status":400,"error_code":"http_version_not_supported","reason":"unsupported protocol version"`) {
		t.Errorf("logs = %s, want the refusal with its request id, status and reason", out)
	}
	_, metrics := rawExchange(t, addrs[1], "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	// Each is the client's fault: none counts as a 5xx, the series of the
	// service's own failures (net/http's 501 and 505 did).
	if !strings.Contains(string(metrics), `http_requests_total{method="_OTHER",route="unread",status_class="4xx"} 17`) ||
		strings.Contains(string(metrics), `status_class="5xx"`) ||
		strings.Contains(string(metrics), `http_request_duration_seconds_count{method="_OTHER",route="unread"`) {
		t.Errorf("metrics lack the seventeen 4xx answered before routing, count a 5xx, or time them:\n%s", metrics)
	}
}

// A handler's answer is never taken for one of net/http's, even one in
// plain text that closes the connection.
func TestHandlerAnswersAreNotNetHTTPs(t *testing.T) {
	for _, answer := range []string{
		"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nDate: Sat, 28 Nov 2026 06:00:00 GMT\r\n\r\nno",
		"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\n\r\nno",
		"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n200 OK",
		`{"error":{"code":"x"}}HTTP/1.1 400 Bad Request` + "\r\n" + netHTTPErrorHeaders,
		"HTTP/1.1 417 Expectation Failed but not quite\r\n\r\n",
		"HTTP/1.1 417 Expectation Failed\r\nX: y\r\n\r\n",
		"HTTP/1.1 417 Expectation Failed",
		"HTTP/1.1 400 Bad Request\r\n" + netHTTPErrorHeaders + "400 Bad Request and more",
		"HTTP/1.1 400 Bad Request\r\n" + netHTTPErrorHeaders,
		"HTTP/1.0 400 Bad Request\r\n" + netHTTPErrorHeaders + "400 Bad Request",
		"HTTP/1.1 4",
	} {
		if status, _, ok := netHTTPAnswer([]byte(answer)); ok {
			t.Errorf("netHTTPAnswer(%q) = %d, true; want false", answer, status)
		}
	}
}

// rawExchange sends request on a new connection to addr and reads the
// answer whole.
func rawExchange(t *testing.T, addr, request string) (*http.Response, []byte) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	// The server may answer and close before it read everything (431):
	// a failed write still leaves its answer to read.
	go func() { _, _ = conn.Write([]byte(request)) }()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%q: %v", request[:min(len(request), 40)], err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, body
}

func BenchmarkNetHTTPAnswerOfAHandlersAnswer(b *testing.B) {
	answer := []byte("HTTP/1.1 200 OK\r\nCache-Control: no-store\r\nContent-Type: application/json; charset=utf-8\r\n" +
		"X-Request-Id: 4bf92f3577b34da6a3ce929d0e0e4736\r\nDate: Sat, 28 Nov 2026 06:00:00 GMT\r\nContent-Length: 900\r\n\r\n{")
	b.ReportAllocs()
	for b.Loop() {
		if _, _, ok := netHTTPAnswer(answer); ok {
			b.Fatal("a handler's answer taken for net/http's")
		}
	}
}

// A handler's answer whose body holds something like one of net/http's
// own answers reaches the client whole, even where a write on the
// connection begins with it (net/http's buffer may start a write anywhere
// in a body; here a flush puts it there).
func TestAHandlersBodyIsNeverRewritten(t *testing.T) {
	head := strings.Repeat("x", 100)
	tail := "HTTP/1.1 400 Bad Request\r\n" + netHTTPErrorHeaders + "400 Bad Request, quoted in a text"
	body := head + tail
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/text", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = io.WriteString(w, head)
		_ = http.NewResponseController(w).Flush()
		_, _ = io.WriteString(w, tail)
	})
	addr := testenv.FreeAddr(t)
	signer, err := identity.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	srv := New(Config{Service: "test", Addr: addr, Log: slog.New(slog.DiscardHandler), Signer: signer}, mux)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() { stop(); <-done }()
	testenv.WaitListening(t, addr)
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/text", nil)
	signAsReader(signer, req)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 || string(got) != body {
		t.Errorf("GET /v1/text = %d, %d bytes (%v); want 200 and the handler's %d bytes", resp.StatusCode, len(got), err, len(body))
	}
}

// signAsReader signs req as the gateway would for a read key.
func signAsReader(signer *identity.Signer, req *http.Request) {
	for _, h := range signer.Sign(identity.Identity{OwnerID: "o1", KeyID: "k1", Scopes: []string{identity.ScopeExportRead},
		RequestID: "4bf92f3577b34da6a3ce929d0e0e4736"}, identity.RequestOf(req), time.Now()) {
		req.Header.Set(h.Name, h.Value)
	}
}
