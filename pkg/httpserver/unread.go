package httpserver

import (
	"bytes"
	"log/slog"
	"net"
	"net/http"
	"strconv"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/logging"
	"github.com/coinexport/export/pkg/rawio"
)

// Go's HTTP server answers a few requests itself, before any handler runs,
// in plain text: one it cannot read (400, some with a reason: "missing
// required Host header", "invalid header name"), headers over
// MaxHeaderBytes (431), an unknown Transfer-Encoding (501), an HTTP version
// it does not speak (505), and an Expect other than 100-continue (417, no
// body). net/http has no hook for them. Each is written as one Write of the
// whole answer on the connection, in a shape no handler here writes: the
// four plain-text ones with no Date and a body that repeats the status
// line, the 417 with only Connection, Date and a zero Content-Length.
// UnreadAsEnvelope's connections recognise those writes, byte for byte,
// and send the envelope instead (the same status, but 400 for the 501 and
// the 505: unreadError), so that every answer of every process is the
// envelope, with a request id.
//
// Wrap a plain TCP listener: under TLS the wrapper would see only
// ciphertext, and wrapping a TLS listener hides the *tls.Conn net/http
// looks for. The wrapper also hides *net.TCPConn's ReadFrom, so a handler
// that copies a file out would lose sendfile; none here serves files.

// netHTTPErrorHeaders follows the status line of net/http's own plain-text
// answers (conn.serve's errorHeaders, unchanged since Go 1.6;
// TestNetHTTPAnswersBecomeEnvelopes fails if a Go release changes it).
const netHTTPErrorHeaders = "Content-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// UnreadFunc is told of each answer UnreadAsEnvelope rewrote: the status
// and error code it answered, net/http's reason (a constant of net/http,
// never the request's bytes; empty when it gives none) and the request id
// the envelope carries.
type UnreadFunc func(status int, code, reason, requestID string)

// UnreadAsEnvelope returns ln, whose connections send net/http's own
// plain-text answers as envelopes. unread, if not nil, is told of each.
func UnreadAsEnvelope(ln net.Listener, unread UnreadFunc) net.Listener {
	return &unreadListener{Listener: ln, unread: unread}
}

// LogUnread returns an UnreadFunc that logs each answer with its request
// id, at most once per interval and error code: a flood of them is a line
// every so often.
func LogUnread(log *slog.Logger) UnreadFunc {
	throttle := &logging.Throttle{Interval: refusedLogInterval}
	return func(status int, code, reason, requestID string) {
		if ok, skipped := throttle.Allow(code); ok {
			log.Warn("request refused before routing: net/http could not read it",
				"request_id", requestID, "status", status, "error_code", code, "reason", reason, "skipped_since_last", skipped)
		}
	}
}

type unreadListener struct {
	net.Listener
	unread UnreadFunc
}

func (l *unreadListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	// Reads and writes made raw, so that they do not wake the runtime's
	// monitor thread (rawio).
	return &unreadConn{Conn: rawio.Wrap(c), unread: l.unread}, nil
}

type unreadConn struct {
	net.Conn
	unread UnreadFunc
}

// Write sends b, or the envelope for it when b is one of net/http's own
// answers. It reports all of b written: net/http only checks the error.
func (c *unreadConn) Write(b []byte) (int, error) {
	status, reason, ok := netHTTPAnswer(b)
	if !ok {
		return c.Conn.Write(b)
	}
	requestID := RandomRequestID()
	refusal := unreadError(status, reason)
	if c.unread != nil {
		c.unread(refusal.status, refusal.code, reason, requestID)
	}
	if _, err := c.Conn.Write(unreadAnswer(refusal, requestID)); err != nil {
		return 0, err
	}
	return len(b), nil
}

// CloseWrite keeps net/http's half-close after a 431 (closeWriteAndWait),
// which it finds by this method.
func (c *unreadConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// netHTTPAnswer reports whether b is one of net/http's own answers, and
// its status and reason. Only a write that is the whole answer, byte for
// byte as net/http writes it, is taken for one: a handler's answer reaches
// the connection through a 4 KiB buffer, so a write may begin anywhere in
// its body, and a body (chunked, or text) may hold CRLFs.
func netHTTPAnswer(b []byte) (status int, reason string, ok bool) {
	// Every answer a handler writes passes here first: the common case,
	// a 2xx or 3xx, is told apart by its first digit, without parsing.
	rest, found := bytes.CutPrefix(b, []byte("HTTP/1.1 "))
	if !found {
		rest, found = bytes.CutPrefix(b, []byte("HTTP/1.0 ")) // a 417 answers in the request's version
	}
	if !found || len(rest) < 4 || rest[0] < '4' || rest[0] > '5' || !isDigit(rest[1]) || !isDigit(rest[2]) || rest[3] != ' ' {
		return 0, "", false
	}
	status = int(rest[0]-'0')*100 + int(rest[1]-'0')*10 + int(rest[2]-'0')
	line, rest, _ := bytes.Cut(rest, []byte("\r\n"))
	if isExpectationFailed(b[:len("HTTP/1.1")], line, rest) {
		return status, "", true
	}
	body, found := bytes.CutPrefix(rest, []byte(netHTTPErrorHeaders))
	if !found || b[len("HTTP/1.")] != '1' {
		return 0, "", false
	}
	// conn.serve repeats the status line as the body ("400 Bad Request",
	// "400 Bad Request: missing required Host header"), but for a 501.
	switch {
	case status == http.StatusNotImplemented && string(body) == netHTTPUnsupportedTE:
		return status, "", true
	case !bytes.Equal(body, line):
		return 0, "", false
	}
	_, after, _ := bytes.Cut(line, []byte(": "))
	return status, string(after), true
}

// netHTTPUnsupportedTE is the body of net/http's 501.
const netHTTPUnsupportedTE = "Unsupported transfer encoding"

// isExpectationFailed reports whether proto, status line and rest are the
// 417 net/http writes for an Expect other than 100-continue: through the
// response path, with its Date (29 bytes, http.TimeFormat), and no body.
func isExpectationFailed(proto, line, rest []byte) bool {
	const head, tail = "Connection: close\r\nDate: ", "\r\nContent-Length: 0\r\n\r\n"
	return string(line) == "417 Expectation Failed" && len(rest) == len(head)+len(http.TimeFormat)+len(tail) &&
		string(rest[:len(head)]) == head && string(rest[len(head)+len(http.TimeFormat):]) == tail &&
		(string(proto) == "HTTP/1.1" || string(proto) == "HTTP/1.0")
}

// unreadAnswer is the envelope sent for refusal.
func unreadAnswer(refusal unreadRefusal, requestID string) []byte {
	body := envelope.ErrorBytes(refusal.code, refusal.message, requestID)
	var b bytes.Buffer
	b.WriteString("HTTP/1.1 " + strconv.Itoa(refusal.status) + " " + http.StatusText(refusal.status) + "\r\n")
	b.WriteString("Content-Type: " + envelope.ContentType + "\r\n")
	b.WriteString("Cache-Control: " + envelope.ErrorCacheControl + "\r\n")
	b.WriteString(envelope.RequestIDHeader + ": " + requestID + "\r\n")
	b.WriteString(envelope.ErrorCodeHeader + ": " + refusal.code + "\r\n")
	b.WriteString("Connection: close\r\n")
	b.WriteString("Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n")
	b.Write(body)
	return b.Bytes()
}

// unreadRefusal is the answer sent instead of one of net/http's.
type unreadRefusal struct {
	status        int
	code, message string
}

// unreadError names each of net/http's answers as the gateway names the
// same refusals, with the gateway's status: net/http's 501 (an unknown
// Transfer-Encoding) and 505 (an HTTP version it does not speak) refuse
// what the client sent, so they are 400s, as the gateway answers them
// (gateway README, http_version_not_supported). As 5xx they told the
// client to retry (spec 7), and a port scan counted in the service's
// http_requests_total{status_class="5xx"}, the series of its own failures.
func unreadError(status int, reason string) unreadRefusal {
	switch status {
	case http.StatusRequestHeaderFieldsTooLarge:
		return unreadRefusal{status, "headers_too_large", "the request line (with its URL) and headers are too large together"}
	case http.StatusNotImplemented:
		return unreadRefusal{http.StatusBadRequest, "unsupported_transfer_encoding", "the request's Transfer-Encoding is not supported: send Content-Length, or Transfer-Encoding: chunked"}
	case http.StatusHTTPVersionNotSupported:
		return unreadRefusal{http.StatusBadRequest, "http_version_not_supported", "send HTTP/1.1 or HTTP/1.0"}
	case http.StatusExpectationFailed:
		return unreadRefusal{status, "expectation_failed", "the only Expect understood is 100-continue"}
	}
	if reason != "" {
		return unreadRefusal{status, "bad_request", "the request could not be read: " + reason}
	}
	return unreadRefusal{status, "bad_request", "the request could not be read"}
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
