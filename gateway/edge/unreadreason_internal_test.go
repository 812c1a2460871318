package edge

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/valyala/fasthttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// A request fasthttp could not read is answered 400 bad_request "the
// request could not be read" whatever failed, and its access line and
// server span say which part failed, in a word of the gateway's
// (unreadReason), never in the request's bytes: fasthttp's error text
// quotes them, and they may hold an API key, which no log line holds.
func TestAnUnreadableRequestSaysWhichPartCouldNotBeRead(t *testing.T) {
	g, sr, logs := startInternal(t, nil, fakeKeys{})
	key, _, err := apikey.Generate([]string{"export:read"})
	if err != nil {
		t.Fatal(err)
	}
	const post = "POST /v1/sync/prestashop/schema HTTP/1.1\r\nHost: gateway\r\n"
	const chunked = post + "Transfer-Encoding: chunked\r\n\r\n"
	for _, tt := range []struct{ name, request, reason string }{
		{"no method", "GARBAGE\r\n\r\n", "request_line"},
		{"no protocol", "GET /v1/health\r\nHost: gateway\r\n\r\n", "request_line"},
		{"two spaces before the protocol", "GET /v1/health  HTTP/1.1\r\nHost: gateway\r\n\r\n", "request_line"},
		{"a method of control characters", "G\x01T /v1/health HTTP/1.1\r\nHost: gateway\r\n\r\n", "request_line"},
		{"a control character in the target", "GET /v1/he\x7falth HTTP/1.1\r\nHost: gateway\r\n\r\n", "invalid_uri"},
		{"a port not digits", "GET /v1/health HTTP/1.1\r\nHost: gateway:8x\r\nX-API-Key: " + key + "\r\n\r\n", "invalid_uri"},
		{"a '[' without ']' in Host", "GET /v1/health HTTP/1.1\r\nHost: [gateway\r\n\r\n", "invalid_uri"},
		{"a header line without a colon", "GET /v1/health HTTP/1.1\r\nHost: gateway\r\nX-API-Key " + key + "\r\n\r\n", "header"},
		{"a header name with a control character", "GET /v1/health HTTP/1.1\r\nHost: gateway\r\nX-\x01: " + key + "\r\n\r\n", "header"},
		{"a space before a header's colon", "GET /v1/health HTTP/1.1\r\nHost: gateway\r\nX-API-Key : " + key + "\r\n\r\n", "header"},
		{"no Host", "GET /v1/health HTTP/1.1\r\nX-API-Key: " + key + "\r\n\r\n", "host"},
		{"two Host lines", "GET /v1/health HTTP/1.1\r\nHost: gateway\r\nHost: " + key + "\r\n\r\n", "host"},
		{"two Content-Length lines", post + "Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}", "content_length"},
		{"a Content-Length not a number", post + "X-API-Key: " + key + "\r\nContent-Length: timeout\r\n\r\n", "content_length"},
		{"a Transfer-Encoding other than chunked", post + "Transfer-Encoding: gzip\r\n\r\n", "transfer_encoding"},
		{"two Transfer-Encoding lines", post + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", "transfer_encoding"},
		{"Transfer-Encoding in HTTP/1.0", "POST /v1/sync/prestashop/schema HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "transfer_encoding"},
		{"a chunk size not hex", chunked + "zz\r\n\r\n", "chunked_body"},
		{"a chunk size too long", chunked + "1234567890abcdef01\r\n", "chunked_body"},
		{"a chunk not ended by CRLF", chunked + "2\r\n{}xx0\r\n\r\n", "chunked_body"},
		// RFC 9112 7.1.1 allows BWS before a chunk extension's ';'
		// (legacy); fasthttp refuses it: a 400 envelope, never a request
		// read otherwise. A size followed by blanks alone is read, as Go's
		// net/http reads it (FuzzFraming).
		{"a blank before a chunk extension", chunked + "2 ;x=1\r\n{}\r\n0\r\n\r\n", "chunked_body"},
		{"a forbidden trailer field", chunked + "0\r\nContent-Length: 5\r\n\r\n", "trailer"},
		{"a forbidden field declared in Trailer", post + "Trailer: Content-Length\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "trailer"},
		{"user info fasthttp cannot read", "GET /v1/health HTTP/1.1\r\nHost: user:" + key + "|@gateway\r\n\r\n", "user_info"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := RawAnswer(t, g.Addr(), tt.request)
			id := resp.Header.Get("X-Request-Id")
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), `"code":"bad_request"`) {
				t.Fatalf("%d %s, want 400 bad_request", resp.StatusCode, body)
			}
			var line struct {
				Method, Route string
				Reason        string `json:"unread_reason"`
			}
			if err := json.Unmarshal([]byte(accessLineOf(logs.String(), id)), &line); err != nil {
				t.Fatalf("access line of %s: %v\n%s", id, err, logs.String())
			}
			if line.Method != "_OTHER" || line.Route != "unrouted" || line.Reason != tt.reason {
				t.Errorf("access line: method %q, route %q, reason %q; want _OTHER, unrouted, %q", line.Method, line.Route, line.Reason, tt.reason)
			}
			if got := unreadReasonOfSpan(sr.Ended(), id); got != tt.reason {
				t.Errorf("server span's %s = %q, want %q", attrUnreadReason, got, tt.reason)
			}
		})
	}
	if strings.Contains(logs.String(), key) || strings.Contains(logs.String(), key[len(key)-16:]) {
		t.Errorf("the key sent in unreadable requests reached the logs:\n%s", logs.String())
	}
}

// A request read whole, and one refused for its size (431, 413) or its
// time (408), says no reason: the status and code say it.
func TestOnlyAnUnreadableRequestSaysAReason(t *testing.T) {
	g, _, logs := startInternal(t, map[string]string{"GATEWAY_READ_TIMEOUT": "300ms"}, fakeKeys{})
	for _, request := range []string{
		"GET /v1/health HTTP/1.1\r\nHost: gateway\r\n\r\n",
		"GET /v1/health HTTP/1.1\r\nHost: gateway\r\nX-Big: " + strings.Repeat("a", 64<<10) + "\r\n\r\n",
		"GET /v1/health HTTP/1.1\r\nHost: gateway\r\n",
		// a chunked body over the limit: unrouted, fasthttp resets its head
		"POST /v1/sync/prestashop/schema HTTP/1.1\r\nHost: gateway\r\nTransfer-Encoding: chunked\r\n\r\n" +
			strconv.FormatInt(BodyLimit+1, 16) + "\r\n" + strings.Repeat("a", BodyLimit+1) + "\r\n0\r\n\r\n",
	} {
		resp, _ := RawAnswer(t, g.Addr(), request)
		if line := accessLineOf(logs.String(), resp.Header.Get("X-Request-Id")); line == "" || strings.Contains(line, `"unread_reason"`) {
			t.Errorf("a %d's access line %q, want one without a reason", resp.StatusCode, line)
		}
	}
}

// unreadReasonOfSpan is the attrUnreadReason of the server span of the
// request id, "" if it has none.
func unreadReasonOfSpan(spans []sdktrace.ReadOnlySpan, id string) string {
	for _, s := range spans {
		if s.SpanContext().TraceID().String() != id || s.SpanKind() != trace.SpanKindServer {
			continue
		}
		for _, a := range s.Attributes() {
			if a.Key == attrUnreadReason {
				return a.Value.AsString()
			}
		}
	}
	return ""
}

// A chunked body whose client closed or reset its connection in a chunk's
// size line or in the trailer is a client that left (chunkCutByClient),
// as fasthttp's read reports it: a broken chunk, which does not unwrap.
// A size line that stops for a timeout, or holds a character it may not,
// is not. (The raw connections of TestAResetConnectionIsNoServerError
// meet the closes; a reset there comes as the read's own error, so the
// reset inside a broken chunk is made here.)
func TestABrokenChunkOfAClientThatLeftIsAClientThatLeft(t *testing.T) {
	const chunked = "POST /v1/sync/prestashop/schema HTTP/1.1\r\nHost: gateway\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"10\r\n{\"base_url\":\"htt\r\n"
	timeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	reset := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	for _, tt := range []struct {
		name, sent string
		then       error
		left       bool
	}{
		{"a size line, then the end", chunked + "1", io.EOF, true},
		{"a size line, then a reset", chunked + "1\r", reset, true},
		{"a trailer, then the end", chunked + "0\r\nX-Trailer: a", io.EOF, true},
		{"a size line, then a timeout", chunked + "1\r", timeout, false},
		{"a size line with a character it may not hold", chunked + "1x\r\n", io.EOF, false},
	} {
		var req fasthttp.Request
		err := req.Read(bufio.NewReader(io.MultiReader(strings.NewReader(tt.sent), failingReader{tt.then})))
		var brokenChunk fasthttp.ErrBrokenChunk
		if !errors.As(err, &brokenChunk) {
			t.Fatalf("%s: fasthttp's error = %v, want a broken chunk (its read changed: update chunkCutByClient)", tt.name, err)
		}
		if clientLeft(err) != tt.left {
			t.Errorf("%s (%v): a client that left = %v, want %v", tt.name, err, !tt.left, tt.left)
		}
	}
}

type failingReader struct{ err error }

func (r failingReader) Read([]byte) (int, error) { return 0, r.err }
