package edge

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
	"golang.org/x/net/http/httpguts"
)

// FuzzFraming compares two readings of the same bytes from a client: the
// gateway's (fasthttp's server with the app's settings, then serve's
// checks: http1, misreadHead) and that of Go's net/http server,
// standing for anything in front of the gateway (a load balancer, a WAF)
// that frames HTTP/1.1 by RFC 9112 as net/http does and passes the bytes
// on. Whenever the gateway reads a request it goes on to answer, net/http
// refuses it too (ReadRequest, the server's header checks, the body) or
// reads the same method, request target and body; and when both would
// read another request on the connection, they start it at the same
// byte. A difference is a smuggling gap: one side takes for a request
// what the other took for a body. The services behind the gateway are not
// modelled: the gateway writes the requests it forwards itself. The bytes
// arrive in reads of at most chunk bytes, as TCP segments would: the
// framing must not depend on how they were split.
func FuzzFraming(f *testing.F) {
	next := "GET /v1/health HTTP/1.1\r\nHost: gateway\r\n\r\n"
	head := "POST /v1/export/items/coin-1/sales/confirm %s\r\nHost: gateway\r\n%s\r\n"
	chunked, empty := "2\r\n{}\r\n0\r\n\r\n", "0\r\n\r\n"
	multipart := "--b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n--b--\r\n"
	for _, tt := range []struct{ proto, headers, body string }{
		// TestAmbiguousFramingIsRefusedAndTheConnectionClosed's requests.
		{"HTTP/1.1", "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n", chunked},
		{"HTTP/1.1", "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n", empty},
		{"HTTP/1.1", "Transfer-Encoding: chunked\r\ncontent-length: 50\r\n", chunked},
		{"HTTP/1.1", "Transfer-Encoding: identity\r\nContent-Length: 2\r\n", "{}"},
		{"HTTP/1.0", "Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n", chunked},
		{"HTTP/1.0", "Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n", empty},
		{"HTTP/1.1", "Transfer-Encoding: identity\r\n", "{}"},
		{"HTTP/1.1", "Transfer-Encoding: gzip\r\n", "{}"},
		{"HTTP/1.1", "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", chunked},
		{"HTTP/1.1", "Transfer-Encoding: chunked\r\n", "2\r\n{}\r\n0\r\nX-Note: 1\r\n\r\n"},
		{"HTTP/1.1", "Transfer-Encoding: CHUNKED\r\n", chunked},
		{"HTTP/1.1", "Transfer-Encoding: chunked\r\n", chunked},
		{"HTTP/1.1", "Content-Length: 2\r\n", "{}"},
		// Spellings two parsers have read differently elsewhere.
		{"HTTP/1.1", "Transfer-Encoding: chunked\r\n", "2;x=\"a\"\r\n{}\r\n0\r\n\r\n"},
		{"HTTP/1.1", "Transfer-Encoding: chunked\r\n", "002\r\n{}\r\n0\n\n"},
		{"HTTP/1.1", "Transfer-Encoding: chunked\r\n", "2 \r\n{}\r\n0\r\n\r\n"},
		{"HTTP/1.1", "Transfer-Encoding: chunked\r\n", "2\t\r\n{}\r\n0\r\n\r\n"},
		{"HTTP/1.1", "Transfer-Encoding: chunked\r\n", "2 ;x=1\r\n{}\r\n0\r\n\r\n"},
		{"HTTP/1.1", "Transfer-Encoding: chunked\r\n", "2;x=1 \r\n{}\r\n0\r\n\r\n"},
		{"HTTP/1.1", "Transfer-Encoding: chunked\r\n", "0x2\r\n{}\r\n0\r\n\r\n"},
		{"HTTP/1.1", "Transfer-Encoding: \tchunked \r\n", chunked},
		{"HTTP/1.1", "Transfer-Encoding: chunked, identity\r\n", chunked},
		{"HTTP/1.1", "Transfer-Encoding:\r\n chunked\r\n", chunked},
		{"HTTP/1.1", "Transfer-Encoding : chunked\r\n", chunked},
		{"HTTP/1.1", "Content-Length: 2\r\nContent-Length: 2\r\n", "{}"},
		{"HTTP/1.1", "Content-Length: 2, 2\r\n", "{}"},
		{"HTTP/1.1", "Content-Length: +2\r\n", "{}"},
		{"HTTP/1.1", "Content-Length: 02\r\n", "{}"},
		{"HTTP/1.1", "Content-Length:\t2\t\r\n", "{}"},
		{"HTTP/1.1", "Expect: 100-continue\r\nContent-Length: 2\r\n", "{}"},
		{"HTTP/1.1", "Connection: close\r\nContent-Length: 2\r\n", "{}"},
		{"HTTP/1.0", "Connection: keep-alive\r\nContent-Length: 2\r\n", "{}"},
		{"HTTP/1.2", "Content-Length: 2\r\n", "{}"},
		{"HTTP/1.1", fmt.Sprintf("Content-Type: multipart/form-data; boundary=b\r\nContent-Length: %d\r\n", len(multipart)), multipart},
		// An epilogue after the last boundary: a part of the body all the same.
		{"HTTP/1.1", fmt.Sprintf("Content-Type: multipart/form-data; boundary=b\r\nContent-Length: %d\r\n", len(multipart)+len(next)), multipart + next},
	} {
		f.Add([]byte(fmt.Sprintf(head, tt.proto, tt.headers)+tt.body+next), uint16(0))
		f.Add([]byte(fmt.Sprintf(head, tt.proto, tt.headers)+tt.body+next), uint16(len(head)))
	}
	f.Add([]byte("GET /v1/health HTTP/1.1\r\nHost: gateway\r\nContent-Length: 2\r\n\r\n{}"+next), uint16(0))
	f.Add([]byte("HEAD /v1/health HTTP/1.1\r\nHost: gateway\r\nContent-Length: 2\r\n\r\n{}"+next), uint16(0))
	f.Add([]byte("GET /v1/health HTTP/1.1\nHost: gateway\n\n"+next), uint16(0))
	f.Fuzz(func(t *testing.T, raw []byte, chunk uint16) {
		gw, gwRest, ok := gatewayReading(raw, int(chunk))
		if !ok {
			return
		}
		svc, svcRest, ok := netHTTPReading(raw, int(chunk))
		if !ok {
			return
		}
		if gw.method != svc.method || gw.target != svc.target || !bytes.Equal(gw.body, svc.body) {
			t.Fatalf("%q: the gateway reads %s %q with body %q, net/http %s %q with body %q",
				raw, gw.method, gw.target, gw.body, svc.method, svc.target, svc.body)
		}
		if gw.keepAlive && svc.keepAlive && !bytes.Equal(gwRest, svcRest) {
			t.Fatalf("%q: the gateway reads the next request from %q, net/http from %q", raw, gwRest, svcRest)
		}
	})
}

// reading is what one side read of a request.
type reading struct {
	method, target string
	body           []byte
	keepAlive      bool // another request is read on the connection
}

// gatewayReading reads a request from raw as the gateway's server does
// (fasthttp's Server.serveConn with Fiber's settings, the ExpectHandler of
// refuseLargeBodiesBeforeContinue), and reports it, with the bytes left
// for the next request, if the gateway goes on to answer it rather than
// refusing it and closing the connection.
func gatewayReading(raw []byte, chunk int) (reading, []byte, bool) {
	src := &chunkedReader{rest: raw, chunk: chunk}
	br := bufio.NewReaderSize(src, 8192) // GATEWAY_MAX_HEADER_BYTES
	var req fasthttp.Request
	if err := req.Header.Read(br); err != nil {
		return reading{}, nil, false
	}
	var uri fasthttp.URI
	if err := uri.Parse(req.Header.Host(), req.Header.RequestURI()); err != nil {
		return reading{}, nil, false
	}
	if req.MayContinue() && req.Header.ContentLength() > BodyLimit {
		return reading{}, nil, false
	}
	// No form parsed while reading (newApp's DisablePreParseMultipartForm).
	if err := req.ContinueReadBody(br, BodyLimit, false); err != nil {
		return reading{}, nil, false
	}
	if !http1(req.Header.Protocol()) || misreadHead(&req.Header) != nil {
		return reading{}, nil, false
	}
	r := reading{method: string(req.Header.Method()), target: string(req.Header.RequestURI()),
		body: bytes.Clone(req.Body()), keepAlive: !req.Header.ConnectionClose()}
	return r, src.left(br), true
}

// netHTTPReading reads a request from raw as Go's net/http server does
// (conn.readRequest, then the whole body), and reports it, with the bytes
// left for the next request, unless the server refuses it.
func netHTTPReading(raw []byte, chunk int) (reading, []byte, bool) {
	src := &chunkedReader{rest: raw, chunk: chunk}
	br := bufio.NewReader(src)
	r, err := http.ReadRequest(br)
	if err != nil || r.ProtoMajor != 1 {
		return reading{}, nil, false
	}
	// ReadRequest has refused a second Host and moved the header to
	// r.Host (after the URL's host, which the server's check does not
	// count: a request in absolute form without Host is read here).
	if r.ProtoAtLeast(1, 1) && r.Host == "" && r.Method != http.MethodConnect || !httpguts.ValidHostHeader(r.Host) {
		return reading{}, nil, false
	}
	for k, vv := range r.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return reading{}, nil, false
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return reading{}, nil, false
			}
		}
	}
	if e := r.Header.Get("Expect"); e != "" && !strings.EqualFold(e, "100-continue") {
		return reading{}, nil, false // 417, the connection closed
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return reading{}, nil, false
	}
	return reading{method: r.Method, target: r.RequestURI, body: body, keepAlive: !r.Close}, src.left(br), true
}

// chunkedReader hands out its bytes at most chunk at a time (all at once
// for 0).
type chunkedReader struct {
	rest  []byte
	chunk int
}

func (r *chunkedReader) Read(p []byte) (int, error) {
	if len(r.rest) == 0 {
		return 0, io.EOF
	}
	if r.chunk > 0 && len(p) > r.chunk {
		p = p[:r.chunk]
	}
	n := copy(p, r.rest)
	r.rest = r.rest[n:]
	return n, nil
}

// left is what the reader through br has not yet read.
func (r *chunkedReader) left(br *bufio.Reader) []byte {
	buffered, _ := br.Peek(br.Buffered())
	return append(bytes.Clone(buffered), r.rest...)
}
